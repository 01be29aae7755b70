package controlplane_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// TestEnvtestUsesTestBinaries proves controller-runtime's envtest runs on
// bin/assets and installs Plinth's CRDs.
func TestEnvtestUsesTestBinaries(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubectl)
	logf.SetLogger(logr.Discard())
	env, err := newEnvtest(crdDir(t))
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

// envtestAssets returns the KUBEBUILDER_ASSETS folder that test/tools/build.sh
// makes (<test bin>/assets: etcd, kube-apiserver, kubectl), or a
// *MissingBinaryError.
func envtestAssets() (string, error) {
	bin, err := controlplane.TestBinDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(bin, "assets")
	for _, n := range []string{controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubectl} {
		if _, err := controlplane.BinaryPath(bin, n); err != nil {
			return "", err
		}
		// build.sh makes these links at its end; make them when a build
		// was interrupted after the binaries were in place.
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return "", err
			}
			if err := os.Symlink(filepath.Join("..", n), filepath.Join(dir, n)); err != nil && !os.IsExist(err) {
				return "", err
			}
		}
	}
	return dir, nil
}

// newEnvtest returns a controller-runtime envtest.Environment that runs this
// project's etcd and kube-apiserver builds (never downloads) and installs the
// CRDs found in crdDirs (e.g. <module root>/schema/crd/bases), with the
// admission plugins that need a kubelet or controllers turned off as in Start.
// Call Start on it; `Stop` ends both processes. It lives in a test file: a
// non-test file would link envtest (whose init makes a folder in /tmp) into
// every binary that imports this package.
func newEnvtest(crdDirs ...string) (*envtest.Environment, error) {
	assets, err := envtestAssets()
	if err != nil {
		return nil, fmt.Errorf("envtest: %w", err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: len(crdDirs) > 0,
		DownloadBinaryAssets:  false,
		// envtest's 20 s default is too short on a loaded 2-core CI machine.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	env.ControlPlane.GetAPIServer().Configure().
		Set("disable-admission-plugins", "ServiceAccount,TaintNodesByCondition")
	return env, nil
}
