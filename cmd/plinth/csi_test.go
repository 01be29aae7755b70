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

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/plinth-storage/plinth/internal/clientlimit"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
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
