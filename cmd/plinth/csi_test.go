package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/moveexec"
	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/internal/clientlimit"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/crdtest"
)

// plinth csi and plinth agent limit their API clients by --kube-api-qps/--kube-api-burst (csi 50/100,
// the agent 50/300: a burst of new volumes costs it three writes each):
// neither kubeconfig nor in-cluster loading sets a limit, and client-go's fallback of 5/s
// queued each CreateVolume's writes (measured by csi's BenchmarkPVCBound).
func TestRestConfigRateLimit(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd   *cobra.Command
		burst int
	}{{newCSICommand(), 100}, {newAgentCommand(), 300}} {
		cmd := c.cmd
		if err := cmd.ParseFlags(nil); err != nil {
			t.Fatal(err)
		}
		f := cmd.Flags()
		qps, _ := f.GetFloat32("kube-api-qps")
		burst, _ := f.GetInt("kube-api-burst")
		if qps != 50 || burst != c.burst {
			t.Errorf("%s: defaults qps %v burst %d, want 50 and %d", cmd.Name(), qps, burst, c.burst)
		}
		cfg, err := kubeRestConfig(kc, qps, burst)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.QPS != 50 || cfg.Burst != c.burst {
			t.Errorf("%s: rest config QPS %v Burst %d, want 50 and %d", cmd.Name(), cfg.QPS, cfg.Burst, c.burst)
		}
	}
}

// plinth csi --mode node serves /healthz and /metrics on one address when both flags name it,
// and registers with kubelet in --registration-dir: the wiring the DaemonSet relies on.
func TestCSINodeServesHealthAndRegistration(t *testing.T) {
	dir, err := os.MkdirTemp("", "plinth-cmd-") // short: unix socket paths hold 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	reg := filepath.Join(dir, "registry")
	if err := os.Mkdir(reg, 0o750); err != nil {
		t.Fatal(err)
	}
	port, err := controlplane.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	cmd := newCSICommand()
	cmd.SetArgs([]string{"--mode=node", "--node-name=cmd-node", "--endpoint=unix://" + filepath.Join(dir, "csi.sock"),
		"--state-dir=" + filepath.Join(dir, "state"), "--host-nqn-file=" + filepath.Join(dir, "none"),
		"--registration-dir=" + reg, "--health-address=" + addr, "--metrics-address=" + addr, "--probe-timeout=30s"})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plinth csi: %v", err)
		}
	})
	get := func(path string) (int, string, error) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	controlplane.Eventually(t, time.Minute, 20*time.Millisecond, "/healthz answers 200", func() error {
		select {
		case err := <-done:
			t.Fatalf("plinth csi stopped: %v", err)
		default:
		}
		code, body, err := get("/healthz")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("%d %s", code, body)
		}
		return err
	})
	if _, err := os.Stat(filepath.Join(reg, "csi.plinth.dev-reg.sock")); err != nil {
		t.Errorf("registration socket: %v", err)
	}
	code, body, err := get("/metrics")
	if err != nil || code != http.StatusOK || !strings.Contains(body, "plinth_csi_kubelet_registered 0") {
		t.Errorf("/metrics on the same address = %d, %v; want 200 with plinth_csi_kubelet_registered 0", code, err)
	}
}

// The three long-running commands follow the API server's flow control only when neither
// limit flag was given: a flag on the command line keeps both values and asks the server
// nothing; without one the server is asked (here nothing listens, so the probe fails and the
// defaults stay, with the reason returned for the log).
func TestClientLimitsFlagsGiven(t *testing.T) {
	for _, c := range []struct {
		cmd   func() *cobra.Command
		args  []string
		want  clientlimit.Mode
		probe bool
	}{
		{newControllerCommand, []string{"--kube-api-burst=7"}, clientlimit.ModeExplicit, false},
		{newAgentCommand, []string{"--kube-api-qps=3"}, clientlimit.ModeExplicit, false},
		{newCSICommand, nil, clientlimit.ModeDefault, true},
	} {
		cmd := c.cmd()
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		qps, _ := cmd.Flags().GetFloat32("kube-api-qps")
		burst, _ := cmd.Flags().GetInt("kube-api-burst")
		port, err := controlplane.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		cfg := &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", port)}
		mode, err := clientLimits(t.Context(), cmd, cfg, qps, burst)
		if mode != c.want || (err != nil) != c.probe || cfg.QPS != qps || cfg.Burst != burst {
			t.Errorf("%s %v: mode %q (error %v), QPS %g, burst %d; want %q, a probe error: %v, QPS %g, burst %d",
				cmd.Name(), c.args, mode, err, cfg.QPS, cfg.Burst, c.want, c.probe, qps, burst)
		}
	}
}

// plinth csi runs the move executor (controllers/moveexec) in the controller and all modes,
// with leader election in --leader-election-namespace (default $NAMESPACE, which the
// Deployment sets), and in no node plugin; --move-executor=false turns it off.
func TestCSIMoveExecutorWiring(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	t.Setenv("NAMESPACE", "plinth-system")
	for _, c := range []struct {
		args     []string
		mode     string
		want     bool
		electsIn string
	}{
		{nil, "controller", true, "plinth-system"},
		{nil, "all", true, "plinth-system"},
		{nil, "node", false, "plinth-system"},
		{[]string{"--move-executor=false"}, "controller", false, "plinth-system"},
		{[]string{"--leader-election-namespace="}, "controller", true, ""},
	} {
		cmd := newCSICommand()
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		m := moveExecutorFlags{skipNameValidation: true}
		m.enabled, _ = cmd.Flags().GetBool("move-executor")
		m.leaderElectionNamespace, _ = cmd.Flags().GetString("leader-election-namespace")
		mgr, err := m.manager(csi.Options{Mode: c.mode, Config: cfg}, prometheus.NewRegistry())
		if err != nil {
			t.Fatalf("%s %v: %v", c.mode, c.args, err)
		}
		if (mgr != nil) != c.want || m.leaderElectionNamespace != c.electsIn {
			t.Errorf("%s %v: executor %v, leader election in %q; want %v in %q", c.mode, c.args, mgr != nil, m.leaderElectionNamespace, c.want, c.electsIn)
		}
	}
}

// plinth csi --mode=controller, as the Deployment runs it (leader election in $NAMESPACE,
// with the Lease timings its flags give), runs the move executor: a verified copy (status.move
// Copied) is switched to its target Store by the process, with nothing else running.
func TestCSIControllerRunsTheMoveExecutor(t *testing.T) {
	cp := crdtest.ControlPlane(t, controlplane.Options{})
	ctx := t.Context()
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: moveexec.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plinth-system"}}); err != nil {
		t.Fatal(err)
	}
	file := policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth"}}
	for _, name := range []string{"slow.a", "fast.a"} {
		pool, _, _ := strings.Cut(name, ".")
		st := &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: storev1.StoreSpec{Pool: pool, NodeName: "a", Backend: file, DriftPolicy: policyv1.DriftPolicyReport}}
		if err := c.Create(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	vs := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: "v1"}, Spec: storev1.VolumeStateSpec{
		CSIName: "v1", StoreName: "slow.a", CapacityBytes: 1 << 20, VolumeMode: "Block",
		Policy: storev1.FrozenPolicy{Placement: "p", Pool: "slow", Protocol: "local", Backend: file,
			ProtocolSpec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}}}
	if err := c.Create(ctx, vs); err != nil {
		t.Fatal(err)
	}
	vs.Spec.Move = &storev1.VolumeMove{ID: "m1", SourceStore: "slow.a", TargetStore: "fast.a"}
	if err := c.Update(ctx, vs); err != nil {
		t.Fatal(err)
	}
	vs.Status.Move = &storev1.MoveStatus{ID: "m1", Phase: storev1.MoveCopied, SourceStore: "slow.a", TargetStore: "fast.a",
		BytesTotal: 1 << 20, BytesCopied: 1 << 20, Checksum: "sha256:00", PublicationGeneration: vs.Spec.PublicationGeneration}
	if err := c.Status().Update(ctx, vs); err != nil {
		t.Fatal(err)
	}

	dir, err := os.MkdirTemp("", "plinth-cmd-") // short: unix socket paths hold 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Setenv("NAMESPACE", "plinth-system")
	cmd := newCSICommand()
	cmd.SetArgs([]string{"--mode=controller", "--endpoint=unix://" + filepath.Join(dir, "csi.sock"), "--kubeconfig=" + cp.Admin.Kubeconfig,
		"--health-address=", "--registration-dir=", "--key-rotation-interval=-1s",
		"--leader-election-lease-duration=37s", "--leader-election-renew-deadline=30s", "--leader-election-retry-period=3s"})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(cctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plinth csi: %v", err)
		}
	})
	controlplane.Eventually(t, 2*time.Minute, 100*time.Millisecond, "the copy switched to fast.a by plinth csi", func() error {
		select {
		case err := <-done:
			t.Fatalf("plinth csi stopped: %v", err)
		default:
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
			return err
		}
		if vs.Spec.StoreName != "fast.a" || vs.Spec.Policy.Pool != "fast" {
			return fmt.Errorf("storeName %s, frozen pool %s", vs.Spec.StoreName, vs.Spec.Policy.Pool)
		}
		return nil
	})
	// the driver itself came up beside it (its socket), so stopping it now is a clean stop
	controlplane.Eventually(t, 2*time.Minute, 100*time.Millisecond, "the CSI socket", func() error {
		_, err := os.Stat(filepath.Join(dir, "csi.sock"))
		return err
	})
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := cs.CoordinationV1().Leases("plinth-system").Get(ctx, moveexec.LeaderElectionID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no leader election Lease %s in plinth-system: %v", moveexec.LeaderElectionID, err)
	}
	// the timings given on the command line are the Lease's (client-go writes the duration)
	if d := lease.Spec.LeaseDurationSeconds; d == nil || *d != 37 {
		t.Errorf("Lease %s: leaseDurationSeconds %v, want 37 (--leader-election-lease-duration=37s)", moveexec.LeaderElectionID, d)
	}
}
