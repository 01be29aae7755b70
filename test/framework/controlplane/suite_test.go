package controlplane_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// shared is one control plane with kube-controller-manager for the proof
// tests that need no control plane of their own; TestMain stops it.
var shared struct {
	once sync.Once
	cp   *controlplane.ControlPlane
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.cp != nil {
		if err := shared.cp.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop shared control plane: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sharedControlPlane starts (once) the shared control plane, or skips/fails t
// as controlplane.RequireBinaries does.
func sharedControlPlane(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubeControllerManager)
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.cp, shared.err = controlplane.Start(ctx, controlplane.Options{ControllerManager: true})
		if shared.err == nil {
			t.Logf("shared control plane %s ready in %s", shared.cp.URL, shared.cp.StartDuration.Round(time.Millisecond))
		}
	})
	if shared.err != nil {
		t.Fatalf("start shared control plane: %v", shared.err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, tail := range shared.cp.LogTails(40) {
				t.Logf("--- %s log, last lines:\n%s", name, tail)
			}
		}
	})
	return shared.cp
}

func clients(t *testing.T, creds *controlplane.Credentials) (*kubernetes.Clientset, *dynamic.DynamicClient) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(creds.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(creds.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs, dyn
}

// crdDir is schema/crd/bases of this checkout.
func crdDir(t *testing.T) string {
	t.Helper()
	root, err := controlplane.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "schema", "crd", "bases")
}

// eventually polls f every 200 ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	controlplane.Eventually(t, timeout, 200*time.Millisecond, what, f)
}
