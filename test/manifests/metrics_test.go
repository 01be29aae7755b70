package manifests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const dashboardsDir = "../../kustomize/monitoring/dashboards"

// designMetrics is the table of docs/design.md, "Metrics" (name → labels): the names shared by
// code, dashboards and alerts.
var designMetrics = map[string][]string{
	"plinth_policy_reconcile_duration_seconds": {"kind"},
	"plinth_policy_reconcile_errors_total":     {"kind"},
	"plinth_drift_objects":                     {"source", "kind"},
	"plinth_store_capacity_bytes":              {"store", "pool", "type"},
	"plinth_store_thin_used_ratio":             {"store", "part"},
	"plinth_agent_heartbeat_age_seconds":       {"node"},
	"plinth_agent_operation_duration_seconds":  {"op"},
	"plinth_agent_backend_commands_total":      {"backend"},
	"plinth_agent_fencing_rejections_total":    {"reason"},
	"plinth_csi_operation_duration_seconds":    {"method", "code"},
}

// beyondDesign are metrics the code registers that docs/design.md's table does not list but that
// alerts or dashboards need; each is reported to the lead to be added to the table.
var beyondDesign = map[string]string{
	"plinth_policy_condition":              "policies not Ready (Fleet drift dashboard, PlinthPolicyNotReady alert); registered by controllers/policy",
	"plinth_volumes":                       "volumes by mode and phase, abnormal (Failed) volumes (Capacity dashboard, PlinthVolumesFailed); controllers/policy VolumeCollector",
	"plinth_volume_size_bytes":             "bytes Block and Filesystem volumes hold per Store (Capacity dashboard); controllers/policy VolumeCollector",
	"plinth_store_info":                    "a Store's node and zone, for days-until-full per failure domain (Capacity dashboard); controllers/policy VolumeCollector",
	"plinth_nvmeof_publications":           "NVMe-oF volumes per target and host node (Provisioning dashboard); controllers/policy VolumeCollector",
	"plinth_csi_node_volumes_inaccessible": "staged volumes whose device is gone or whose mount is dead (PlinthVolumeInaccessible alert, Abnormal volumes panel); csi volume health monitor",
}

// targetLabels are the labels Prometheus adds to every series of a Plinth target: job and
// instance by itself, cluster as the fleet's external label (or a relabeling), instance_node
// and component by the ServiceMonitor's relabelings. Expressions may match on them.
var targetLabels = []string{"cluster", "job", "instance", "instance_node", "component"}

// externalMetrics are the metrics of other exporters that dashboards and alerts use, with the
// labels they have (kubelet's volume stats, one series per PVC: Kubernetes' kubelet
// pkg/kubelet/metrics/collectors/volume_stats.go).
var externalMetrics = map[string][]string{
	"kubelet_volume_stats_capacity_bytes":  {"namespace", "persistentvolumeclaim"},
	"kubelet_volume_stats_available_bytes": {"namespace", "persistentvolumeclaim"},
	"kubelet_volume_stats_used_bytes":      {"namespace", "persistentvolumeclaim"},
	"kubelet_volume_stats_inodes":          {"namespace", "persistentvolumeclaim"},
}

func registered(t *testing.T) map[string]Metric {
	t.Helper()
	m, err := RegisteredMetrics("../..")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDesignMetricsAreRegistered(t *testing.T) {
	reg := registered(t)
	for name, labels := range designMetrics {
		m, ok := reg[name]
		if !ok {
			t.Errorf("docs/design.md metric %s is registered nowhere in the code", name)
			continue
		}
		got, want := slices.Sorted(slices.Values(m.Labels)), slices.Sorted(slices.Values(labels))
		if !slices.Equal(got, want) {
			t.Errorf("%s (%s): labels %v, docs/design.md says %v", name, m.Source, m.Labels, labels)
		}
	}
	for name := range beyondDesign {
		if _, ok := reg[name]; !ok {
			t.Errorf("%s is used by alerts or dashboards but registered nowhere", name)
		}
	}
	var extra []string
	for name, m := range reg {
		if _, ok := designMetrics[name]; !ok {
			extra = append(extra, name+" ("+m.Source+")")
		}
	}
	sort.Strings(extra)
	t.Logf("registered, not in docs/design.md's table: %v", extra)
}

// A PromQL expression with its origin, for messages.
type promExpr struct{ where, expr string }

// alertRules returns the rules of the built PrometheusRule.
func alertRules(t *testing.T) (spec map[string]any, rules []map[string]any) {
	t.Helper()
	pr := find(t, allBuilds(t)["monitoring"], "PrometheusRule", "plinth")
	spec, _, _ = unstructured.NestedMap(pr.Object, "spec")
	groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
	for _, g := range groups {
		rs, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rs {
			rules = append(rules, r.(map[string]any))
		}
	}
	return spec, rules
}

type dashboard struct {
	file string
	raw  []byte
	doc  map[string]any
}

func dashboards(t *testing.T) []dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s (%v)", dashboardsDir, err)
	}
	var out []dashboard
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := dashboard{file: filepath.Base(f), raw: raw}
		if err := json.Unmarshal(raw, &d.doc); err != nil {
			t.Fatalf("%s is not valid JSON: %v", d.file, err)
		}
		out = append(out, d)
	}
	return out
}

// panels returns the panels of a dashboard, those nested in rows included.
func panels(doc map[string]any) []map[string]any {
	var out []map[string]any
	var walk func(v any)
	walk = func(v any) {
		l, _ := v.([]any)
		for _, p := range l {
			m, ok := p.(map[string]any)
			if !ok {
				continue
			}
			out = append(out, m)
			walk(m["panels"])
		}
	}
	walk(doc["panels"])
	return out
}

func allExprs(t *testing.T) []promExpr {
	t.Helper()
	var out []promExpr
	_, rules := alertRules(t)
	for _, r := range rules {
		out = append(out, promExpr{"alert " + r["alert"].(string), r["expr"].(string)})
	}
	for _, d := range dashboards(t) {
		for _, p := range panels(d.doc) {
			ts, _ := p["targets"].([]any)
			for _, tg := range ts {
				if e, _ := tg.(map[string]any)["expr"].(string); e != "" {
					out = append(out, promExpr{d.file + " panel " + p["title"].(string), e})
				}
			}
		}
		tl, _, _ := unstructured.NestedSlice(d.doc, "templating", "list")
		for _, v := range tl {
			if q, _ := v.(map[string]any)["definition"].(string); q != "" {
				out = append(out, promExpr{d.file + " variable " + v.(map[string]any)["name"].(string), q})
			}
		}
	}
	return out
}

var (
	plinthName = regexp.MustCompile(`\bplinth_[a-z0-9_]+\b`)
	// selector: a metric name followed by {matchers}.
	selector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

// Every metric name in alerts and dashboards is a series of a registered metric listed in
// docs/design.md (or in beyondDesign), and every label matcher names a label of that metric.
func TestAlertsAndDashboardsUseKnownMetrics(t *testing.T) {
	reg := registered(t)
	series := map[string]Metric{}
	for _, m := range reg {
		for _, s := range m.Series() {
			series[s] = m
		}
	}
	used := map[string]bool{}
	for _, e := range allExprs(t) {
		for _, name := range plinthName.FindAllString(e.expr, -1) {
			m, ok := series[name]
			if !ok {
				t.Errorf("%s: %s is not a series the code registers (expr %q)", e.where, name, e.expr)
				continue
			}
			_, inDesign := designMetrics[m.Name]
			if _, ok := beyondDesign[m.Name]; !ok && !inDesign {
				t.Errorf("%s: %s is registered (%s) but not in docs/design.md's table", e.where, m.Name, m.Source)
			}
			used[m.Name] = true
		}
		for _, sel := range selector.FindAllStringSubmatch(e.expr, -1) {
			name := sel[1]
			m, ok := series[name]
			if ext, isExt := externalMetrics[name]; isExt {
				m, ok = Metric{Name: name, Labels: ext, Source: "kubelet"}, true
			}
			if !ok {
				if !slices.Contains([]string{"by", "without", "on", "ignoring", "group_left", "group_right"}, name) {
					t.Errorf("%s: selector of %s, not a Plinth metric", e.where, name)
				}
				continue
			}
			for _, mm := range matcher.FindAllStringSubmatch(sel[2], -1) {
				l := mm[1]
				if !slices.Contains(m.Labels, l) && !(l == "le" && m.Histogram) && !slices.Contains(targetLabels, l) {
					t.Errorf("%s: %s has no label %q (labels %v)", e.where, name, l, m.Labels)
				}
			}
		}
	}
	for name := range designMetrics {
		if !used[name] {
			t.Logf("docs/design.md metric %s appears in no alert or dashboard", name)
		}
	}
}

func TestAlerts(t *testing.T) {
	_, rules := alertRules(t)
	seen := map[string]bool{}
	for _, r := range rules {
		name, _ := r["alert"].(string)
		if name == "" {
			t.Errorf("rule without alert name: %v", r)
			continue
		}
		if seen[name] {
			t.Errorf("alert %s twice", name)
		}
		seen[name] = true
		if sev, _, _ := unstructured.NestedString(r, "labels", "severity"); sev != "warning" && sev != "critical" {
			t.Errorf("alert %s: severity %q, want warning or critical", name, sev)
		}
		if s, _, _ := unstructured.NestedString(r, "annotations", "summary"); s == "" {
			t.Errorf("alert %s: no summary annotation", name)
		}
		if f, ok := r["for"].(string); ok {
			if _, err := time.ParseDuration(f); err != nil {
				t.Errorf("alert %s: for %q: %v", name, f, err)
			}
		}
	}
	for _, want := range []string{"PlinthPoolNearlyFull", "PlinthThinMetadataNearlyFull", "PlinthDriftPersisting",
		"PlinthAgentHeartbeatMissing", "PlinthFencingRejections", "PlinthReconcileErrors"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

func TestDashboards(t *testing.T) {
	uids := map[string]string{}
	ds := dashboards(t)
	cms := map[string]*unstructured.Unstructured{}
	for _, o := range allBuilds(t)["monitoring"] {
		if o.GetKind() == "ConfigMap" {
			cms[o.GetName()] = o
		}
	}
	for _, d := range ds {
		t.Run(d.file, func(t *testing.T) {
			uid, _ := d.doc["uid"].(string)
			if uid == "" || d.doc["title"] == "" {
				t.Error("no uid or title")
			}
			if prev, ok := uids[uid]; ok {
				t.Errorf("uid %s also in %s", uid, prev)
			}
			uids[uid] = d.file
			dsVar := ""
			tl, _, _ := unstructured.NestedSlice(d.doc, "templating", "list")
			for _, v := range tl {
				m := v.(map[string]any)
				if m["type"] == "datasource" && m["query"] == "prometheus" {
					dsVar = m["name"].(string)
				}
			}
			if dsVar == "" {
				t.Fatal("no datasource variable of type prometheus")
			}
			wantDS := "${" + dsVar + "}"
			ids := map[int64]string{}
			ps := panels(d.doc)
			if len(ps) == 0 {
				t.Fatal("no panels")
			}
			for _, p := range ps {
				title, _ := p["title"].(string)
				id, ok := p["id"].(float64)
				if !ok || id <= 0 || id != float64(int64(id)) {
					t.Errorf("panel %q: id %v, want a positive integer", title, p["id"])
				} else if prev, dup := ids[int64(id)]; dup {
					t.Errorf("panel id %d used by %q and %q", int64(id), prev, title)
				} else {
					ids[int64(id)] = title
				}
				if _, ok := p["gridPos"].(map[string]any); !ok {
					t.Errorf("panel %q: no gridPos", title)
				}
				if p["type"] == "row" {
					continue
				}
				if uid, _, _ := unstructured.NestedString(p, "datasource", "uid"); uid != wantDS {
					t.Errorf("panel %q: datasource uid %q, want %q", title, uid, wantDS)
				}
				ts, _ := p["targets"].([]any)
				if len(ts) == 0 {
					t.Errorf("panel %q: no targets", title)
				}
				for _, tg := range ts {
					m := tg.(map[string]any)
					if e, _ := m["expr"].(string); strings.TrimSpace(e) == "" {
						t.Errorf("panel %q: a target without expr", title)
					}
					if uid, _, _ := unstructured.NestedString(m, "datasource", "uid"); uid != wantDS {
						t.Errorf("panel %q target %v: datasource uid %q, want %q", title, m["refId"], uid, wantDS)
					}
				}
			}
			// Shipped as a ConfigMap for the Grafana sidecar, byte for byte.
			var cm *unstructured.Unstructured
			for _, c := range cms {
				if _, ok := c.Object["data"].(map[string]any)[d.file]; ok {
					cm = c
				}
			}
			if cm == nil {
				t.Fatalf("no ConfigMap of the monitoring build carries %s", d.file)
			}
			if cm.GetLabels()["grafana_dashboard"] != "1" {
				t.Errorf("ConfigMap %s: labels %v, want grafana_dashboard=1", cm.GetName(), cm.GetLabels())
			}
			if got, _, _ := unstructured.NestedString(cm.Object, "data", d.file); got != string(d.raw) {
				t.Errorf("ConfigMap %s differs from %s", cm.GetName(), d.file)
			}
		})
	}
	// What the issue asks each dashboard to show.
	need := map[string][]string{
		"fleet-drift.json": {"plinth_drift_objects", "plinth_policy_condition", "plinth_agent_fencing_rejections_total", "count by (cluster)"},
		"capacity.json": {`type="available"`, `type="provisioned"`, `type="allocatable"`, "pool, store, type", `part="data"`, `part="metadata"`, "predict_linear",
			"kubelet_volume_stats_used_bytes", "kubelet_volume_stats_capacity_bytes", "plinth_volume_size_bytes", `phase="Failed"`, "plinth_store_info", "by (cluster, zone)", "by (cluster, pool)"},
		"provisioning.json": {`histogram_quantile(0.99`, "plinth_csi_operation_duration_seconds_bucket", `code!="OK"`, `method="CreateVolume"`, "target_node, host_node"},
	}
	for _, d := range ds {
		for _, s := range need[d.file] {
			if !strings.Contains(string(d.raw), strings.ReplaceAll(s, `"`, `\"`)) && !strings.Contains(string(d.raw), s) {
				t.Errorf("%s: no expression with %s", d.file, s)
			}
		}
		delete(need, d.file)
	}
	for f := range need {
		t.Errorf("dashboard %s is missing", f)
	}
}

// metricRow is a row of docs/operations.md's "Metrics" table: | `name` | type | `l1`, `l2` | ...
var metricRow = regexp.MustCompile("(?m)^\\| `(plinth_[a-z_]+)` \\| (counter|gauge|histogram) \\| ([^|]*) \\|")

// TestOperationsDocListsEveryMetric holds docs/operations.md's metrics table equal to the code:
// every registered metric has a row with its type and label names, and no row names a metric
// the code does not register.
func TestOperationsDocListsEveryMetric(t *testing.T) {
	reg := registered(t)
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := metricRow.FindAllStringSubmatch(string(doc), -1)
	if len(rows) == 0 {
		t.Fatal("docs/operations.md has no metrics table rows")
	}
	seen := map[string]bool{}
	for _, r := range rows {
		name, typ := r[1], r[2]
		seen[name] = true
		m, ok := reg[name]
		if !ok {
			t.Errorf("docs/operations.md lists %s, which the code does not register", name)
			continue
		}
		if m.Histogram != (typ == "histogram") {
			t.Errorf("docs/operations.md: %s is a %s; code (%s) histogram=%v", name, typ, m.Source, m.Histogram)
		}
		var labels []string
		for _, l := range strings.Split(r[3], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" {
				labels = append(labels, l)
			}
		}
		if got, want := slices.Sorted(slices.Values(labels)), slices.Sorted(slices.Values(m.Labels)); !slices.Equal(got, want) {
			t.Errorf("docs/operations.md: %s labels %v; code (%s) has %v", name, got, m.Source, want)
		}
	}
	for name, m := range reg {
		if !seen[name] {
			t.Errorf("%s (%s) is missing from docs/operations.md's metrics table", name, m.Source)
		}
	}
}
