package csi_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// shared is one control plane (etcd, kube-apiserver, kube-controller-manager) with Plinth's CRDs for the tests of this
// package that need no control plane of their own; TestMain stops it.
var shared struct {
	once sync.Once
	cp   *controlplane.ControlPlane
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.path != "" {
		os.RemoveAll(filepath.Dir(built.path))
	}
	if shared.cp != nil {
		if err := shared.cp.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop shared control plane: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sharedControlPlane starts (once) the shared control plane with the CRDs of schema/crd/bases,
// or skips (binaries missing, PLINTH_INTEGRATION unset) or fails t.
func sharedControlPlane(t testing.TB) *controlplane.ControlPlane {
	t.Helper()
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubeControllerManager)
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		// The StatefulSet and ephemeral volume controllers make the claims of the spread tests
		// as in a cluster.
		controllers := append(slices.Clone(controlplane.DefaultControllers), "statefulset-controller", "ephemeral-volume-controller")
		shared.cp, shared.err = controlplane.Start(ctx, controlplane.Options{ControllerManager: true, Controllers: controllers})
		if shared.err == nil {
			shared.err = installCRDs(ctx, shared.cp.Admin.Config)
		}
	})
	if shared.err != nil {
		t.Fatalf("start shared control plane: %v", shared.err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, tail := range shared.cp.LogTails(30) {
				t.Logf("--- %s log, last lines:\n%s", name, tail)
			}
		}
	})
	return shared.cp
}

// installCRDs creates the CRDs of schema/crd/bases and waits until each is Established.
// (A small adapter: test/framework/controlplane keeps its CRD helper in its own tests.)
func installCRDs(ctx context.Context, cfg *rest.Config) error {
	root, err := controlplane.ModuleRoot()
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(root, "schema", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRD YAML (%v)", err)
	}
	return installCRDFiles(ctx, cfg, files)
}

// installCRDFiles creates the CRDs of files (already existing ones are kept) and waits until
// each is Established.
func installCRDFiles(ctx context.Context, cfg *rest.Config, files []string) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", filepath.Base(f), err)
		}
		names = append(names, obj.GetName())
	}
	for _, n := range names {
		for {
			got := &unstructured.Unstructured{}
			got.SetAPIVersion("apiextensions.k8s.io/v1")
			got.SetKind("CustomResourceDefinition")
			if err := c.Get(ctx, client.ObjectKey{Name: n}, got); err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			established := false
			for _, cond := range conds {
				m, _ := cond.(map[string]any)
				established = established || m["type"] == "Established" && m["status"] == "True"
			}
			if established {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not Established: %w", n, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// kubeClient is a client with the driver's scheme.
func kubeClient(t testing.TB, cfg *rest.Config) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: csi.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startDriver runs a Driver in this process and returns gRPC clients on its socket.
func startDriver(t testing.TB, opts csi.Options) *grpc.ClientConn {
	t.Helper()
	dir, err := os.MkdirTemp("", "plinth-csi-") // short: unix socket paths hold 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "csi.sock")
	opts.Endpoint = "unix://" + sock
	if tt, ok := t.(*testing.T); ok && opts.Log.GetSink() == nil {
		opts.Log = testr.NewWithOptions(tt, testr.Options{Verbosity: 2})
	}
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(dir, "state")
	}
	d, err := csi.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("driver: %v", err)
		}
	})
	conn := dialUnix(t, sock)
	id := csipb.NewIdentityClient(conn)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case err := <-done:
			t.Fatalf("driver stopped: %v", err)
		default:
		}
		resp, err := id.Probe(context.Background(), &csipb.ProbeRequest{})
		if err == nil && resp.GetReady().GetValue() {
			return conn
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func clientKey(name string) client.ObjectKey { return client.ObjectKey{Name: name} }

func testingShort() bool { return testing.Short() }
