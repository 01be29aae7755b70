package manifests

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/nvme"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// The CSI node plugin's start-up, run as the plinth-csi-node ServiceAccount of the shipped
// RBAC: it labels its Node plinth.dev/nvme-initiator=true and annotates plinth.dev/host-nqn
// with the one verb the role grants (patch of nodes). A read or update the role lacks would
// fail Run here.
func testCSINodeStartup(t *testing.T, c *cluster) {
	ctx := t.Context()
	for _, o := range allBuilds(t)["rbac"] {
		if err := c.apply(t, ctx, o, false); err != nil {
			t.Fatalf("apply %s: %v", ID(o), err)
		}
	}
	const nodeName, nqn = "csi-rbac-node", "nqn.2014-08.org.nvmexpress:uuid:7d1c3c3e-5d1b-4c55-9d9a-3f2d8f0b6a11"
	if _, err := c.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "plinth-rbac-") // short: unix socket paths hold 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// A node whose nvme-tcp initiator is usable: the fabrics device and the module in sysfs.
	sys, dev := filepath.Join(dir, "sys"), filepath.Join(dir, "dev")
	for _, p := range []string{filepath.Join(sys, "module", "nvme_tcp"), dev} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for path, data := range map[string]string{filepath.Join(dev, "nvme-fabrics"): "", filepath.Join(dir, "hostnqn"): nqn + "\n"} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A token bound to a pod on the node, as kubelet mounts it: the node-scope admission policy
	// (kustomize/rbac/node_scope.yaml) lets the plugin patch only the Node its token names.
	as := boundToken(t, ctx, c, "plinth-csi-node", "csi-node-startup", nodeName)
	// The RBAC authorizer reads from informers: the role applied above may not be seen yet.
	var d *csi.Driver
	waitFor(t, 30*time.Second, "plinth-csi-node starts and patches its Node", func() error {
		var err error
		d, err = csi.New(csi.Options{Mode: csi.ModeNode, NodeName: nodeName, Config: as, Endpoint: "unix://" + filepath.Join(dir, "csi.sock"),
			StateDir: filepath.Join(dir, "state"), HostNQNFile: filepath.Join(dir, "hostnqn"),
			Initiator: &nvme.Initiator{SysRoot: sys, DevRoot: dev}, Log: testr.New(t)})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Run(runCtx) }()
		select {
		case <-d.Serving():
			cancel()
			return <-done
		case err := <-done:
			cancel()
			return err
		}
	})
	n, err := c.kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels[policyv1.LabelNVMeInitiator] != "true" || n.Annotations[policyv1.AnnotationHostNQN] != nqn {
		t.Errorf("Node %s: labels %v, annotations %v; want %s=true and %s=%s", nodeName, n.Labels, n.Annotations,
			policyv1.LabelNVMeInitiator, policyv1.AnnotationHostNQN, nqn)
	}
}
