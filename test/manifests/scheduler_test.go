package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/prereq"
)

// The KubeSchedulerConfiguration of kustomize/scheduler loads into the real plinth-scheduler:
// the kube-scheduler decodes and validates it and builds its profile with the PlinthCapacity
// plugin (its args decoded by the plugin's New), then --write-config-to writes the effective
// configuration and exits. The kubeconfig is the test control plane's (the Deployment uses the
// in-cluster config).
func testSchedulerConfig(t *testing.T, c *cluster) {
	controlplane.RequireBinaries(t, controlplane.BinPlinthScheduler)
	bin, err := controlplane.BinaryPath("", controlplane.BinPlinthScheduler)
	if err != nil {
		t.Fatal(err)
	}
	var cm *unstructured.Unstructured
	for _, o := range allBuilds(t)["scheduler"] {
		if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "plinth-scheduler-config-") {
			cm = o // the generator's name with its content hash, as the Deployment mounts it
		}
	}
	if cm == nil {
		t.Fatal("no ConfigMap plinth-scheduler-config-<hash> in kustomize/scheduler")
	}
	text, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	cfg := map[string]any{}
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := c.cp.Kubeconfig("admin")
	if err != nil {
		t.Fatal(err)
	}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig}
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "effective.yaml")
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, "--config="+in, "--write-config-to="+out,
		"--secure-port=0", "--authentication-skip-lookup")
	log, err := cmd.CombinedOutput()
	if err != nil {
		msg := string(log)
		// A binary built before the plugin was registered (the stock scheduler).
		stale := strings.Contains(msg, "PlinthCapacity") && strings.Contains(msg, "does not exist")
		if stale {
			prereq.Missing(t, "%s predates the PlinthCapacity plugin: run make testbin", bin)
		}
		t.Fatalf("plinth-scheduler rejects the configuration: %v\n%s\n--- configuration:\n%s", err, tail(msg, 20), data)
	}
	eff, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("no effective configuration written: %v\n%s", err, tail(string(log), 20))
	}
	for _, want := range []string{"schedulerName: plinth-scheduler", "name: PlinthCapacity", "reservationTimeoutSeconds: 300"} {
		if !strings.Contains(string(eff), want) {
			t.Errorf("effective configuration lacks %q:\n%s", want, eff)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
