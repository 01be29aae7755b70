package controlplane_test

import (
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/plinth-storage/plinth/test/controlplane"
)

// TestEnvtestUsesTestBinaries proves controller-runtime's envtest runs on
// bin/assets and installs Plinth's CRDs.
func TestEnvtestUsesTestBinaries(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubectl)
	logf.SetLogger(logr.Discard())
	env, err := controlplane.NewEnvtest(crdDir(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	}()
	if len(env.CRDs) < 6 {
		t.Errorf("envtest installed %d CRDs, want 6", len(env.CRDs))
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"}, Data: map[string]string{"a": "b"}}
	if err := c.Create(t.Context(), cm); err != nil {
		t.Fatal(err)
	}
}
