package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"
)

// plinth csi and plinth agent limit their API clients by --kube-api-qps/--kube-api-burst, 50/100 by default:
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
	for _, cmd := range []*cobra.Command{newCSICommand(), newAgentCommand()} {
		if err := cmd.ParseFlags(nil); err != nil {
			t.Fatal(err)
		}
		f := cmd.Flags()
		qps, _ := f.GetFloat32("kube-api-qps")
		burst, _ := f.GetInt("kube-api-burst")
		if qps != 50 || burst != 100 {
			t.Errorf("%s: defaults qps %v burst %d, want 50 and 100", cmd.Name(), qps, burst)
		}
		cfg, err := kubeRestConfig(kc, qps, burst)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.QPS != 50 || cfg.Burst != 100 {
			t.Errorf("%s: rest config QPS %v Burst %d, want 50 and 100", cmd.Name(), cfg.QPS, cfg.Burst)
		}
	}
}
