package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/test/prereq"
)

const shippedServiceMonitor = "../../../kustomize/monitoring/servicemonitor.yaml"

// The Kubernetes scrape configuration generated from the shipped ServiceMonitor is one
// Prometheus accepts (promtool check config), keeps the Services the ServiceMonitor selects
// on its port, applies its relabelings, and has the kubelet and scheduler jobs.
func TestKubernetesScrapeConfig(t *testing.T) {
	tool := prereq.Commands(t, "promtool")[0]
	dir := t.TempDir()
	files := map[string]string{}
	for _, f := range []string{"kubeconfig", "ca.crt", "admin.crt", "admin.key"} {
		files[f] = filepath.Join(dir, f)
		if err := os.WriteFile(files[f], []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := KubernetesScrapeConfig(shippedServiceMonitor, Cluster{Discovery: "http://127.0.0.1:9999", APIServer: "10.0.0.1:6443",
		CAFile: files["ca.crt"], CertFile: files["admin.crt"], KeyFile: files["admin.key"], SchedulerComponent: "scheduler",
		Labels: map[string]string{"cluster": "dev"}}, 2*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, "check", "config", "--syntax-only", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s\n--- %s", err, out, cfg)
	}
	var got struct {
		ScrapeConfigs []struct {
			JobName        string           `json:"job_name"`
			Scheme         string           `json:"scheme"`
			RelabelConfigs []map[string]any `json:"relabel_configs"`
			SD             []map[string]any `json:"http_sd_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(cfg, &got); err != nil {
		t.Fatal(err)
	}
	jobs := map[string]int{}
	for i, j := range got.ScrapeConfigs {
		jobs[j.JobName] = i
	}
	want := []string{"serviceMonitor/plinth-system/plinth/0", JobKubelet, JobScheduler}
	if len(jobs) != len(want) {
		t.Fatalf("jobs %v, want %v", jobs, want)
	}
	for _, w := range want {
		if _, ok := jobs[w]; !ok {
			t.Fatalf("no job %s in %v", w, jobs)
		}
	}
	sm := got.ScrapeConfigs[jobs[want[0]]]
	if sm.SD[0]["url"] != "http://127.0.0.1:9999/endpointslice?namespace=plinth-system" {
		t.Errorf("ServiceMonitor job discovers %v, want the endpointslice role in plinth-system", sm.SD[0]["url"])
	}
	text, _ := yaml.Marshal(sm.RelabelConfigs)
	for _, s := range []string{"__meta_kubernetes_service_label_plinth_dev_metrics", "(true);true", "instance_node", "component", "replacement: dev"} {
		if !strings.Contains(string(text), s) {
			t.Errorf("ServiceMonitor job's relabelings lack %q:\n%s", s, text)
		}
	}
	k := got.ScrapeConfigs[jobs[JobKubelet]]
	text, _ = yaml.Marshal(k.RelabelConfigs)
	if k.Scheme != "https" || !strings.Contains(string(text), "/api/v1/nodes/${1}/proxy/metrics") {
		t.Errorf("kubelet job %+v", k)
	}
}

// A ServiceMonitor with what the configuration cannot map is refused with the field named.
func TestReadServiceMonitorRefusesUnmapped(t *testing.T) {
	dir := t.TempDir()
	for name, doc := range map[string]string{
		"two endpoints": "kind: ServiceMonitor\nspec:\n  endpoints: [{port: a}, {port: b}]\n",
		"tlsConfig":     "kind: ServiceMonitor\nspec:\n  endpoints: [{port: a, tlsConfig: {}}]\n",
		"no port":       "kind: ServiceMonitor\nspec:\n  endpoints: [{path: /m}]\n",
		"kind":          "kind: PodMonitor\n",
	} {
		f := filepath.Join(dir, "sm.yaml")
		if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadServiceMonitor(f); err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("%s: error %v, want one naming %s", name, err, f)
		}
	}
}
