package monitoring

import (
	"fmt"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
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
	sm, err := ReadServiceMonitor(serviceMonitor)
	if err != nil {
		return nil, err
	}
	path, relabel := sm.Path, sm.Relabelings
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

// ServiceMonitor is what the scrape configurations use of a Prometheus Operator ServiceMonitor
// with exactly one endpoint.
type ServiceMonitor struct {
	// Name and Namespace of the ServiceMonitor.
	Name, Namespace string
	// MatchLabels is spec.selector.matchLabels (the Services it selects).
	MatchLabels map[string]string
	// Namespaces is spec.namespaceSelector.matchNames.
	Namespaces []string
	// Port is the endpoint's port name, Path its path (default /metrics).
	Port, Path string
	// Relabelings are the endpoint's relabelings as Prometheus relabel_configs (snake_case).
	Relabelings []map[string]any
}

// ReadServiceMonitor reads a ServiceMonitor (YAML file). Fields the scrape configurations do
// not map (matchExpressions, several endpoints, TLS or authorization on the endpoint) are an
// error rather than silently dropped.
func ReadServiceMonitor(file string) (*ServiceMonitor, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var u unstructured.Unstructured
	if err := yaml.Unmarshal(raw, &u.Object); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if u.GetKind() != "ServiceMonitor" {
		return nil, fmt.Errorf("%s: kind %q, want ServiceMonitor", file, u.GetKind())
	}
	sm := &ServiceMonitor{Name: u.GetName(), Namespace: u.GetNamespace()}
	sm.MatchLabels, _, _ = unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if _, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "selector", "matchExpressions"); ok {
		return nil, fmt.Errorf("%s: spec.selector.matchExpressions is not mapped", file)
	}
	sm.Namespaces, _, _ = unstructured.NestedStringSlice(u.Object, "spec", "namespaceSelector", "matchNames")
	endpoints, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		return nil, fmt.Errorf("%s: %d endpoints, the scrape configuration maps exactly one", file, len(endpoints))
	}
	ep, _ := endpoints[0].(map[string]any)
	for k := range ep {
		switch k {
		case "port", "path", "interval", "relabelings":
		default:
			return nil, fmt.Errorf("%s: endpoint field %q is not mapped", file, k)
		}
	}
	sm.Port, _ = ep["port"].(string)
	if sm.Port == "" {
		return nil, fmt.Errorf("%s: the endpoint names no port", file)
	}
	if sm.Path, _ = ep["path"].(string); sm.Path == "" {
		sm.Path = "/metrics"
	}
	rls, _, _ := unstructured.NestedSlice(ep, "relabelings")
	for _, r := range rls {
		m, ok := r.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: relabeling %v is not an object", file, r)
		}
		rc, err := relabelConfig(m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		sm.Relabelings = append(sm.Relabelings, rc)
	}
	return sm, nil
}

// labelName is Prometheus' sanitising of a Kubernetes label name into a meta label suffix.
var invalidLabelChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

func labelName(s string) string { return invalidLabelChars.ReplaceAllString(s, "_") }

// Cluster is what KubernetesScrapeConfig needs of the cluster to discover and reach its
// targets from outside it (Prometheus runs on the host, as `plinth-dev` runs it).
type Cluster struct {
	// Discovery is the base URL of a Discovery server (http://127.0.0.1:<port>): Debian's
	// Prometheus has no Kubernetes discovery, so HTTP discovery with the same meta labels
	// stands in for kubernetes_sd_configs.
	Discovery string
	// Refresh is how often Prometheus asks Discovery (default 5 s).
	Refresh time.Duration
	// APIServer is the API server's host:port, CAFile its CA, CertFile and KeyFile a client
	// certificate allowed nodes/proxy (the kubelets' /metrics through the API server) and
	// /metrics of the scheduler (delegated authorisation).
	APIServer                 string
	CAFile, CertFile, KeyFile string
	// SchedulerComponent, when not empty, adds the job JobScheduler: the pods in the
	// ServiceMonitor's namespace labelled app.kubernetes.io/component=SchedulerComponent, on
	// their container port named "https".
	SchedulerComponent string
	// Labels are added to every target (cluster, for the fleet view).
	Labels map[string]string
}

// Job names of KubernetesScrapeConfig besides the ServiceMonitor's
// (serviceMonitor/<namespace>/<name>/0, as the Prometheus Operator names it).
const (
	JobKubelet   = "kubelet"
	JobScheduler = "plinth-scheduler"
)

// ServiceMonitorJob is the job name the Prometheus Operator gives the first endpoint of sm.
func ServiceMonitorJob(sm *ServiceMonitor) string {
	return fmt.Sprintf("serviceMonitor/%s/%s/0", sm.Namespace, sm.Name)
}

// KubernetesScrapeConfig returns a Prometheus configuration (YAML) for a running cluster,
// discovered through the API server (Discovery: the roles and meta labels of
// kubernetes_sd_configs, served over http_sd_configs), with three jobs:
//
//   - the ServiceMonitor in serviceMonitor, as the Prometheus Operator generates it: role
//     endpointslice in its namespaces, kept when the Service carries every matchLabels label
//     and the endpoint's port has the endpoint's port name; the operator's target labels
//     (namespace, service, pod, container, job = Service name, endpoint = port name); then the
//     endpoint's own relabelings, verbatim. The series go to the pods' addresses directly.
//   - JobKubelet: every Node's kubelet /metrics (kubelet_volume_stats_*) through the API
//     server's node proxy (/api/v1/nodes/<node>/proxy/metrics, TLS verified against the API
//     server's CA), the scrape of Prometheus' own example configuration for clusters it runs
//     outside of. In a cluster the Prometheus Operator scrapes kubelets directly (the kubelet
//     ServiceMonitor of kube-prometheus); the series are the same, labelled node and
//     instance_node with the Node's name.
//   - JobScheduler (Cluster.SchedulerComponent): plinth-scheduler ships no Service or
//     ServiceMonitor (it is kube-scheduler: /metrics on its secure port, authorised through
//     the API server); this is the equivalent PodMonitor's job, https with the client
//     certificate, the serving certificate not verified (kube-scheduler's is self-signed).
//
// interval is every job's scrape and the rules' evaluation interval; ruleFile, when not empty,
// is loaded.
func KubernetesScrapeConfig(serviceMonitor string, c Cluster, interval time.Duration, ruleFile string) ([]byte, error) {
	sm, err := ReadServiceMonitor(serviceMonitor)
	if err != nil {
		return nil, err
	}
	if c.Discovery == "" || c.APIServer == "" || c.CAFile == "" || c.CertFile == "" || c.KeyFile == "" {
		return nil, fmt.Errorf("kubernetes scrape configuration: Discovery, APIServer, CAFile, CertFile and KeyFile are required")
	}
	iv := interval.String()
	refresh := c.Refresh
	if refresh == 0 {
		refresh = 5 * time.Second
	}
	sd := func(role string, namespaces []string) []map[string]any {
		var out []map[string]any
		if len(namespaces) == 0 {
			namespaces = []string{""}
		}
		for _, ns := range namespaces {
			u := c.Discovery + "/" + role
			if ns != "" {
				u += "?namespace=" + url.QueryEscape(ns)
			}
			out = append(out, map[string]any{"url": u, "refresh_interval": refresh.String()})
		}
		return out
	}
	keys := make([]string, 0, len(c.Labels))
	for k := range c.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var extra []map[string]any
	for _, k := range keys {
		extra = append(extra, map[string]any{"target_label": k, "replacement": c.Labels[k]})
	}

	// The ServiceMonitor's job.
	var smRelabel []map[string]any
	selKeys := make([]string, 0, len(sm.MatchLabels))
	for k := range sm.MatchLabels {
		selKeys = append(selKeys, k)
	}
	sort.Strings(selKeys)
	for _, k := range selKeys {
		n := labelName(k)
		smRelabel = append(smRelabel, map[string]any{"action": "keep",
			"source_labels": []string{"__meta_kubernetes_service_label_" + n, "__meta_kubernetes_service_labelpresent_" + n},
			"regex":         "(" + regexp.QuoteMeta(sm.MatchLabels[k]) + ");true"})
	}
	smRelabel = append(smRelabel,
		map[string]any{"action": "keep", "source_labels": []string{"__meta_kubernetes_endpointslice_port_name"}, "regex": regexp.QuoteMeta(sm.Port)},
		map[string]any{"source_labels": []string{"__meta_kubernetes_endpointslice_address_target_kind", "__meta_kubernetes_endpointslice_address_target_name"},
			"separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_endpointslice_address_target_kind", "__meta_kubernetes_endpointslice_address_target_name"},
			"separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_service_name"}, "target_label": "service"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_container_name"}, "target_label": "container"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_service_name"}, "target_label": "job", "replacement": "${1}"},
		map[string]any{"target_label": "endpoint", "replacement": sm.Port},
	)
	smRelabel = append(smRelabel, sm.Relabelings...)
	smRelabel = append(smRelabel, extra...)
	namespaces := sm.Namespaces
	if len(namespaces) == 0 && sm.Namespace != "" {
		namespaces = []string{sm.Namespace}
	}
	scrapes := []map[string]any{{
		"job_name": ServiceMonitorJob(sm), "metrics_path": sm.Path, "scrape_interval": iv, "honor_labels": false,
		"http_sd_configs": sd("endpointslice", namespaces), "relabel_configs": smRelabel,
	}}

	tls := map[string]any{"ca_file": c.CAFile, "cert_file": c.CertFile, "key_file": c.KeyFile}
	// The kubelets through the API server's node proxy.
	kubelet := []map[string]any{
		{"target_label": "__address__", "replacement": c.APIServer},
		{"source_labels": []string{"__meta_kubernetes_node_name"}, "regex": "(.+)", "target_label": "__metrics_path__", "replacement": "/api/v1/nodes/${1}/proxy/metrics"},
		{"source_labels": []string{"__meta_kubernetes_node_name"}, "target_label": "node"},
		{"source_labels": []string{"__meta_kubernetes_node_name"}, "target_label": "instance_node"},
		{"source_labels": []string{"__meta_kubernetes_node_name"}, "target_label": "instance"},
	}
	scrapes = append(scrapes, map[string]any{
		"job_name": JobKubelet, "scheme": "https", "scrape_interval": iv, "tls_config": tls,
		"http_sd_configs": sd("node", nil), "relabel_configs": append(kubelet, extra...),
	})

	if c.SchedulerComponent != "" {
		sched := []map[string]any{
			{"action": "keep", "source_labels": []string{"__meta_kubernetes_pod_label_app_kubernetes_io_component"}, "regex": regexp.QuoteMeta(c.SchedulerComponent)},
			{"action": "keep", "source_labels": []string{"__meta_kubernetes_pod_container_port_name"}, "regex": "https"},
			{"source_labels": []string{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
			{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
			{"source_labels": []string{"__meta_kubernetes_pod_node_name"}, "target_label": "instance_node"},
			{"target_label": "component", "replacement": c.SchedulerComponent},
		}
		stls := map[string]any{"cert_file": c.CertFile, "key_file": c.KeyFile, "insecure_skip_verify": true}
		scrapes = append(scrapes, map[string]any{
			"job_name": JobScheduler, "scheme": "https", "scrape_interval": iv, "tls_config": stls,
			"http_sd_configs": sd("pod", namespaces), "relabel_configs": append(sched, extra...),
		})
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
