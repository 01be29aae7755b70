package observability

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/test/controlplane"
)

// Target is one process Prometheus scrapes. For a Plinth target, Component and Node stand for
// what Kubernetes service discovery would see (the Service's app.kubernetes.io/component
// label, the pod's node): they are given as the discovery's meta labels, so the
// ServiceMonitor's own relabelings turn them into the component and instance_node labels.
type Target struct {
	// Job is the scrape job: "plinth" for the ServiceMonitor's targets; another name (such as
	// "kubelet") makes a job of its own with Scheme, TLS and Path.
	Job string
	// Address is host:port.
	Address   string
	Component string
	Node      string
	// Scheme, Path and the TLS files apply to jobs other than "plinth" (whose path is the
	// ServiceMonitor endpoint's).
	Scheme, Path              string
	CAFile, CertFile, KeyFile string
	InsecureSkipVerify        bool
}

// JobPlinth is the job of the ServiceMonitor's targets.
const JobPlinth = "plinth"

// ScrapeConfig returns a Prometheus configuration (YAML) that scrapes targets the way the
// Prometheus Operator would from the ServiceMonitor in serviceMonitor (a YAML file): each
// endpoint's path, and its relabelings copied verbatim, applied to the meta labels of each
// target (Target.Component, Target.Node). interval replaces the endpoint's interval (a test
// cannot wait 30 s a scrape), labels are added to every series (cluster, for the fleet view),
// and ruleFile, when not empty, is loaded with evaluation every interval.
func ScrapeConfig(serviceMonitor string, targets []Target, interval time.Duration, labels map[string]string, ruleFile string) ([]byte, error) {
	raw, err := os.ReadFile(serviceMonitor)
	if err != nil {
		return nil, err
	}
	var sm unstructured.Unstructured
	if err := yaml.Unmarshal(raw, &sm.Object); err != nil {
		return nil, fmt.Errorf("%s: %w", serviceMonitor, err)
	}
	if sm.GetKind() != "ServiceMonitor" {
		return nil, fmt.Errorf("%s: kind %q, want ServiceMonitor", serviceMonitor, sm.GetKind())
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		return nil, fmt.Errorf("%s: %d endpoints, the harness maps exactly one", serviceMonitor, len(endpoints))
	}
	ep := endpoints[0].(map[string]any)
	path, _ := ep["path"].(string)
	if path == "" {
		path = "/metrics"
	}
	var relabel []map[string]any
	rls, _, _ := unstructured.NestedSlice(ep, "relabelings")
	for _, r := range rls {
		rc, err := relabelConfig(r.(map[string]any))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", serviceMonitor, err)
		}
		relabel = append(relabel, rc)
	}
	var plinth []map[string]any
	jobs := map[string][]Target{}
	for _, t := range targets {
		if t.Job == "" || t.Job == JobPlinth {
			l := map[string]string{
				"__meta_kubernetes_pod_node_name":                             t.Node,
				"__meta_kubernetes_service_label_app_kubernetes_io_component": t.Component,
			}
			for k, v := range labels {
				l[k] = v
			}
			plinth = append(plinth, map[string]any{"targets": []string{t.Address}, "labels": l})
			continue
		}
		jobs[t.Job] = append(jobs[t.Job], t)
	}
	iv := interval.String()
	scrapes := []map[string]any{{
		"job_name": JobPlinth, "metrics_path": path, "scrape_interval": iv,
		"static_configs": plinth, "relabel_configs": relabel,
	}}
	for job, ts := range jobs {
		var sc []map[string]any
		for _, t := range ts {
			l := map[string]string{"instance_node": t.Node}
			for k, v := range labels {
				l[k] = v
			}
			sc = append(sc, map[string]any{"targets": []string{t.Address}, "labels": l})
		}
		t := ts[0]
		j := map[string]any{"job_name": job, "scrape_interval": iv, "static_configs": sc}
		if t.Path != "" {
			j["metrics_path"] = t.Path
		}
		if t.Scheme != "" {
			j["scheme"] = t.Scheme
		}
		if t.CAFile != "" || t.CertFile != "" || t.InsecureSkipVerify {
			j["tls_config"] = map[string]any{"ca_file": t.CAFile, "cert_file": t.CertFile, "key_file": t.KeyFile, "insecure_skip_verify": t.InsecureSkipVerify}
		}
		scrapes = append(scrapes, j)
	}
	cfg := map[string]any{
		"global":         map[string]any{"scrape_interval": iv, "evaluation_interval": iv},
		"scrape_configs": scrapes,
	}
	if ruleFile != "" {
		cfg["rule_files"] = []string{ruleFile}
	}
	return yaml.Marshal(cfg)
}

// relabelConfig converts one Prometheus Operator RelabelConfig (camelCase) to Prometheus'
// relabel_config (snake_case).
func relabelConfig(r map[string]any) (map[string]any, error) {
	names := map[string]string{
		"sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label",
		"regex": "regex", "modulus": "modulus", "replacement": "replacement", "action": "action",
	}
	out := map[string]any{}
	for k, v := range r {
		n, ok := names[k]
		if !ok {
			return nil, fmt.Errorf("relabeling field %q is not mapped", k)
		}
		if n == "action" {
			v = strings.ToLower(fmt.Sprint(v))
		}
		out[n] = v
	}
	return out, nil
}

// Prometheus is a running Prometheus server.
type Prometheus struct {
	URL  string
	API  promv1.API
	Proc *controlplane.Process
}

// PrometheusBinary is Debian's Prometheus server (package prometheus, which also has promtool).
const PrometheusBinary = "/usr/bin/prometheus"

// StartPrometheus starts Prometheus on a free loopback port with config (YAML) and its data
// under dir, owned by cp (stopped with it), and waits until /-/ready answers.
func StartPrometheus(ctx context.Context, cp *controlplane.ControlPlane, bin, dir string, config []byte) (*Prometheus, error) {
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, config, 0o644); err != nil {
		return nil, err
	}
	port, err := controlplane.FreePort()
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	p, err := cp.StartProcess(ctx, controlplane.ProcessSpec{
		Name: "prometheus", Binary: bin,
		Args: []string{"--config.file=" + cfgPath, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
			fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), "--web.enable-lifecycle", "--log.level=warn"},
		Ready:        controlplane.HTTPReady(url+"/-/ready", nil),
		ReadyTimeout: 2 * time.Minute,
	})
	if err != nil {
		return nil, err
	}
	c, err := api.NewClient(api.Config{Address: url})
	if err != nil {
		return nil, err
	}
	return &Prometheus{URL: url, API: promv1.NewAPI(c), Proc: p}, nil
}
