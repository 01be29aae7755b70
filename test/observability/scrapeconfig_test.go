package observability

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/test/framework/monitoring"
	"github.com/plinth-storage/plinth/test/prereq"
)

// The scrape configuration generated from the shipped ServiceMonitor is one Prometheus
// accepts (promtool check config), carries the ServiceMonitor's relabelings, and gives a
// kubelet target a job of its own.
func TestScrapeConfigFromServiceMonitor(t *testing.T) {
	tool := prereq.Commands(t, "promtool")[0]
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, liveRules(t), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := monitoring.ScrapeConfig(serviceMonitor, []monitoring.Target{
		{Job: monitoring.JobPlinth, Address: "127.0.0.1:9471", Component: "agent", Node: StorageNode},
		{Job: "kubelet", Address: "127.0.0.1:10250", Node: StorageNode, Scheme: "https", InsecureSkipVerify: true},
	}, 2*time.Second, map[string]string{"cluster": Cluster}, rules)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, "check", "config", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s\n--- %s", err, out, cfg)
	}
	var got struct {
		ScrapeConfigs []struct {
			JobName        string           `json:"job_name"`
			MetricsPath    string           `json:"metrics_path"`
			Scheme         string           `json:"scheme"`
			RelabelConfigs []map[string]any `json:"relabel_configs"`
			StaticConfigs  []map[string]any `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(cfg, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.ScrapeConfigs) != 2 {
		t.Fatalf("%d scrape configs, want plinth and kubelet:\n%s", len(got.ScrapeConfigs), cfg)
	}
	p, k := got.ScrapeConfigs[0], got.ScrapeConfigs[1]
	if p.JobName != monitoring.JobPlinth || p.MetricsPath != "/metrics" || len(p.RelabelConfigs) != 2 {
		t.Errorf("plinth job %+v", p)
	}
	targets := map[string]bool{}
	for _, r := range p.RelabelConfigs {
		targets[r["target_label"].(string)] = true
	}
	if !targets["instance_node"] || !targets["component"] {
		t.Errorf("relabelings %v, want the ServiceMonitor's instance_node and component", p.RelabelConfigs)
	}
	if k.JobName != "kubelet" || k.Scheme != "https" {
		t.Errorf("kubelet job %+v", k)
	}
	if !strings.Contains(string(cfg), "cluster: "+Cluster) {
		t.Errorf("no cluster label:\n%s", cfg)
	}
}
