package manifests

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const chartDir = "../../charts/plinth"

var updateChart = flag.Bool("update-chart", false, "regenerate charts/plinth/files and charts/plinth/crds from kustomize/")

// The generated part of the chart is what ChartFiles builds from kustomize/ now: the chart
// cannot drift from the bases. -update-chart rewrites it.
func TestHelmChartIsGenerated(t *testing.T) {
	want, err := ChartFiles(kustomizeRoot)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string][]byte{}
	for _, dir := range []string{"files", "crds"} {
		err := filepath.WalkDir(filepath.Join(chartDir, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(chartDir, p)
			if err != nil {
				return err
			}
			data, err := os.ReadFile(p)
			have[filepath.ToSlash(rel)] = data
			return err
		})
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	if *updateChart {
		for p := range have {
			if _, ok := want[p]; !ok {
				if err := os.Remove(filepath.Join(chartDir, p)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for p, data := range want {
			full := filepath.Join(chartDir, p)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("wrote %d files into %s", len(want), chartDir)
		return
	}
	var stale []string
	for p, data := range want {
		if !bytes.Equal(have[p], data) {
			stale = append(stale, p)
		}
	}
	for p := range have {
		if _, ok := want[p]; !ok {
			stale = append(stale, p+" (no longer built)")
		}
	}
	sort.Strings(stale)
	if len(stale) > 0 {
		t.Errorf("charts/plinth is not what kustomize/ builds (run: go test ./test/manifests -run TestHelmChartIsGenerated -update-chart):\n%s",
			strings.Join(stale, "\n"))
	}
	if len(want) < 20 {
		t.Errorf("only %d generated chart files", len(want))
	}
}

// The chart's default images are the kustomize images component's, for every image the
// chart's sources (kustomize/default and kustomize/monitoring) use; kustomize/snapshot-controller
// is not part of the chart, so its image is not a value.
func TestHelmChartImageDefaults(t *testing.T) {
	all, err := ImageNames(kustomizeRoot)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, base := range []string{"default", "monitoring"} {
		for _, o := range allBuilds(t)[base] {
			for _, c := range containers(o) {
				img, _ := c["image"].(string)
				used[img] = true
			}
		}
	}
	images := map[string]string{}
	for name, ref := range all {
		if used[ref] {
			images[name] = ref
		}
	}
	got := map[string]string{}
	for name, im := range chartImages(t) {
		got[name] = im.Repository + ":" + im.Tag
	}
	if len(got) != len(images) {
		t.Errorf("values.yaml images %v, want %v", got, images)
	}
	for name, ref := range images {
		if got[name] != ref {
			t.Errorf("values.yaml image %s = %q, want %q (kustomize/components/images)", name, got[name], ref)
		}
	}
}

// renderChart renders charts/plinth with Helm's engine (what `helm template` does) and values,
// and returns the objects of the templates and the chart's CRDs.
func renderChart(t *testing.T, values string) (objs, crds []*unstructured.Unstructured) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := common.ReadValues([]byte(values))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, common.ReleaseOptions{Name: "plinth", Namespace: namespace, IsInstall: true},
		common.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	decode := func(name, text string) []*unstructured.Unstructured {
		var list []*unstructured.Unstructured
		d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(text), 4096)
		for {
			var m map[string]any
			if err := d.Decode(&m); err != nil {
				if err.Error() == "EOF" {
					return list
				}
				t.Fatalf("%s: %v", name, err)
			}
			if len(m) > 0 {
				list = append(list, &unstructured.Unstructured{Object: m})
			}
		}
	}
	for _, n := range names {
		objs = append(objs, decode(n, out[n])...)
	}
	for _, f := range ch.CRDObjects() {
		crds = append(crds, decode(f.Name, string(f.File.Data))...)
	}
	return objs, crds
}

// canonical is an object as comparable JSON (numbers and key order as JSON has them).
func canonical(t *testing.T, o *unstructured.Unstructured) string {
	t.Helper()
	data, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	data, _ = json.Marshal(v)
	return string(data)
}

func canonicalSet(t *testing.T, objs ...[]*unstructured.Unstructured) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range objs {
		for _, o := range l {
			if _, dup := out[ID(o)]; dup {
				t.Errorf("%s twice", ID(o))
			}
			out[ID(o)] = canonical(t, o)
		}
	}
	return out
}

// With its default values the chart renders exactly kustomize/default (CRDs included); with
// monitoring.enabled exactly overlays/with-monitoring; createNamespace=false leaves out the
// Namespace.
func TestHelmChartEqualsKustomize(t *testing.T) {
	b := allBuilds(t)
	for _, c := range []struct{ values, build string }{
		{"", "default"},
		{"monitoring: {enabled: true}", "overlays/with-monitoring"},
	} {
		objs, crds := renderChart(t, c.values)
		got, want := canonicalSet(t, objs, crds), canonicalSet(t, b[c.build])
		for id, w := range want {
			if g, ok := got[id]; !ok {
				t.Errorf("values %q: %s of kustomize/%s not rendered", c.values, id, c.build)
			} else if g != w {
				t.Errorf("values %q: %s differs from kustomize/%s:\n%s\nwant\n%s", c.values, id, c.build, g, w)
			}
		}
		for id := range got {
			if _, ok := want[id]; !ok {
				t.Errorf("values %q: %s rendered, not in kustomize/%s", c.values, id, c.build)
			}
		}
		t.Logf("values %q: %d objects and %d CRDs, equal to kustomize/%s", c.values, len(objs), len(crds), c.build)
	}
	objs, _ := renderChart(t, "createNamespace: false")
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			t.Errorf("createNamespace false renders %s", ID(o))
		}
	}
}

// customValues set every kind of value the chart has.
const customValues = `
images:
  plinth: {repository: registry.example.com/plinth, tag: v9.9.9}
  csi-provisioner: {repository: registry.example.com/csi-provisioner, tag: v1.2.3}
monitoring: {enabled: true}
agent:
  nodeSelector: {example.com/storage: "true"}
  tolerations: [{key: example.com/storage, operator: Exists, effect: NoSchedule}]
  resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 256Mi}}
controller:
  resources: {limits: {cpu: "2", memory: 1Gi}}
imagePullPolicy: Always
imagePullSecrets: [{name: regcred}]
csiNode:
  tolerations: []
  priorityClassName: plinth-node
  resources: {requests: {cpu: 10m, memory: 32Mi}}
csiController:
  sidecarResources: {requests: {cpu: 5m, memory: 16Mi}}
  replicas: 1
scheduler:
  replicas: 3
leaderElection: {leaseDuration: 137s, renewDeadline: 107s, retryPeriod: 26s}
`

// What each value changes, and nothing else.
func TestHelmChartValues(t *testing.T) {
	objs, _ := renderChart(t, customValues)
	def, _ := renderChart(t, "monitoring: {enabled: true}")
	defs := canonicalSet(t, def)
	changed := 0
	for _, o := range objs {
		if canonical(t, o) != defs[ID(o)] {
			changed++
		}
		if k := o.GetKind(); k != "Deployment" && k != "DaemonSet" {
			if canonical(t, o) != defs[ID(o)] && !isSchedulerConfig(o) {
				t.Errorf("%s changed by values", ID(o))
			}
			continue
		}
		for _, c := range containers(o) {
			img := c["image"].(string)
			if strings.HasPrefix(img, "ghcr.io/plinth-storage/plinth:") || strings.HasPrefix(img, "registry.k8s.io/sig-storage/csi-provisioner:") {
				t.Errorf("%s container %s: image %s, want the values' registry", ID(o), c["name"], img)
			}
		}
	}
	ds := find(t, objs, "DaemonSet", "plinth-agent")
	sel, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "spec", "nodeSelector")
	if sel["example.com/storage"] != "true" || sel["kubernetes.io/os"] != "linux" {
		t.Errorf("agent nodeSelector %v: want the value merged over kubernetes.io/os", sel)
	}
	tol, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "tolerations")
	if len(tol) != 1 || tol[0].(map[string]any)["key"] != "example.com/storage" {
		t.Errorf("agent tolerations %v: want the value's", tol)
	}
	for _, c := range podContainers(ds, "containers") {
		res, _ := json.Marshal(c["resources"])
		if want := `{"limits":{"memory":"256Mi"},"requests":{"cpu":"50m","memory":"64Mi"}}`; string(res) != want {
			t.Errorf("agent container %s resources %s, want %s", c["name"], res, want)
		}
	}
	cd := find(t, objs, "Deployment", "plinth-controller")
	res, _ := json.Marshal(podContainers(cd, "containers")[0]["resources"])
	if want := `{"limits":{"cpu":"2","memory":"1Gi"}}`; string(res) != want {
		t.Errorf("controller resources %s, want %s", res, want)
	}
	csi := find(t, objs, "Deployment", "plinth-csi-controller")
	for _, c := range containers(csi) {
		if c["name"] == "csi-attacher" && !strings.HasPrefix(c["image"].(string), "registry.k8s.io/sig-storage/csi-attacher:") {
			t.Errorf("csi-attacher image %s changed", c["image"])
		}
	}
	// Every workload (imagePullPolicy and imagePullSecrets reach them all); the scheduler's
	// image and everything else stay.
	workloads := 0
	for _, o := range objs {
		if k := o.GetKind(); k != "Deployment" && k != "DaemonSet" {
			continue
		}
		workloads++
		for _, c := range slices.Concat(podContainers(o, "initContainers"), podContainers(o, "containers")) {
			if c["imagePullPolicy"] != "Always" {
				t.Errorf("%s container %s: imagePullPolicy %v, want Always", ID(o), c["name"], c["imagePullPolicy"])
			}
		}
		secrets, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "imagePullSecrets")
		if b, _ := json.Marshal(secrets); string(b) != `[{"name":"regcred"}]` {
			t.Errorf("%s imagePullSecrets %s, want regcred", ID(o), b)
		}
	}
	if changed != workloads+1 || workloads != 5 {
		t.Errorf("%d objects changed by the values, want the %d workloads (5) and the scheduler's configuration", changed, workloads)
	}
	sd := find(t, objs, "Deployment", "plinth-scheduler")
	if img := podContainers(sd, "containers")[0]["image"]; !strings.HasPrefix(img.(string), "ghcr.io/plinth-storage/plinth-scheduler:") {
		t.Errorf("values changed the scheduler's image: %v", img)
	}
	// The node plugin: its tolerations narrowed to none, its priority class and resources set.
	node := find(t, objs, "DaemonSet", "plinth-csi-node")
	if tol, found, _ := unstructured.NestedSlice(node.Object, "spec", "template", "spec", "tolerations"); len(tol) != 0 || !found {
		t.Errorf("csi-node tolerations %v (set %v), want [] (every shipped one removed)", tol, found)
	}
	if pc, _, _ := unstructured.NestedString(node.Object, "spec", "template", "spec", "priorityClassName"); pc != "plinth-node" {
		t.Errorf("csi-node priorityClassName %q, want plinth-node", pc)
	}
	if res, _ := json.Marshal(podContainers(node, "containers")[0]["resources"]); string(res) != `{"requests":{"cpu":"10m","memory":"32Mi"}}` {
		t.Errorf("csi-node resources %s", res)
	}
	if pc, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "priorityClassName"); pc != "system-node-critical" {
		t.Errorf("agent priorityClassName %q, want the shipped system-node-critical", pc)
	}
	// The CSI controller's sidecars get sidecarResources, its Plinth container keeps its own.
	for _, c := range podContainers(csi, "containers") {
		res, _ := json.Marshal(c["resources"])
		own := strings.Contains(c["image"].(string), "/plinth:")
		if sidecar := string(res) == `{"requests":{"cpu":"5m","memory":"16Mi"}}`; sidecar == own {
			t.Errorf("csi-controller container %s (image %s): resources %s", c["name"], c["image"], res)
		}
	}
	// replicas replaces a Deployment's shipped 2 where set, and only there.
	for name, want := range map[string]string{"plinth-csi-controller": "1", "plinth-scheduler": "3", "plinth-controller": "2"} {
		if got, _, _ := unstructured.NestedFieldNoCopy(find(t, objs, "Deployment", name).Object, "spec", "replicas"); fmt.Sprint(got) != want {
			t.Errorf("Deployment %s: replicas %v, want %s", name, got, want)
		}
	}
	// leaderElection: every container that elects a leader (the controller, the CSI
	// controller's plinth csi and four sidecars) gets the three timing flags, no other
	// container any; the scheduler's KubeSchedulerConfiguration gets them, and its pod an
	// annotation that rolls it when they change.
	leFlags := []string{"--leader-election-lease-duration=137s", "--leader-election-renew-deadline=107s", "--leader-election-retry-period=26s"}
	electing := 0
	for _, o := range objs {
		if k := o.GetKind(); k != "Deployment" && k != "DaemonSet" {
			continue
		}
		for _, c := range podContainers(o, "containers") {
			var args []string
			for _, a := range c["args"].([]any) {
				args = append(args, a.(string))
			}
			elects := slices.Contains(args, "--leader-elect") || slices.Contains(args, "--leader-election") || slices.Contains(args, "--leader-election-namespace=$(NAMESPACE)")
			n := 0
			for _, f := range leFlags {
				if slices.Contains(args, f) {
					n++
				}
			}
			if elects {
				electing++
			}
			if (elects && n != 3) || (!elects && n != 0) {
				t.Errorf("%s container %s (elects a leader: %v): %d of the timing flags in %v", ID(o), c["name"], elects, n, args)
			}
		}
	}
	if electing != 6 {
		t.Errorf("%d containers elect a leader, want 6 (controller, plinth csi, four sidecars)", electing)
	}
	var schedCfg *unstructured.Unstructured
	for _, o := range objs {
		if isSchedulerConfig(o) {
			schedCfg = o
		}
	}
	if schedCfg == nil {
		t.Fatal("no scheduler configuration ConfigMap")
	}
	data, _, _ := unstructured.NestedString(schedCfg.Object, "data", "config.yaml")
	var sc struct {
		Kind           string
		LeaderElection map[string]any `json:"leaderElection"`
		Profiles       []any
	}
	if err := yaml.Unmarshal([]byte(data), &sc); err != nil {
		t.Fatalf("scheduler configuration: %v", err)
	}
	if b, _ := json.Marshal(sc.LeaderElection); sc.Kind != "KubeSchedulerConfiguration" || len(sc.Profiles) != 1 ||
		string(b) != `{"leaderElect":true,"leaseDuration":"137s","renewDeadline":"107s","resourceName":"plinth-scheduler","resourceNamespace":"plinth-system","retryPeriod":"26s"}` {
		t.Errorf("scheduler configuration: kind %s, %d profiles, leaderElection %s", sc.Kind, len(sc.Profiles), b)
	}
	if a := sd.GetAnnotations(); a != nil {
		t.Errorf("scheduler Deployment annotations %v: the roll annotation belongs on the pod template", a)
	}
	if a, _, _ := unstructured.NestedString(sd.Object, "spec", "template", "metadata", "annotations", "plinth.dev/leader-election"); a != strings.Join(leFlags, " ") {
		t.Errorf("scheduler pod annotation plinth.dev/leader-election %q, want the timings", a)
	}
	// Shipped tolerations stay when the value is left out.
	dtol, _, _ := unstructured.NestedSlice(find(t, def, "DaemonSet", "plinth-csi-node").Object, "spec", "template", "spec", "tolerations")
	if b, _ := json.Marshal(dtol); string(b) != `[{"operator":"Exists"}]` {
		t.Errorf("default csi-node tolerations %s, want the shipped [{operator: Exists}]", b)
	}
}

// isSchedulerConfig: the ConfigMap of plinth-scheduler's KubeSchedulerConfiguration (its name
// has kustomize's hash suffix).
func isSchedulerConfig(o *unstructured.Unstructured) bool {
	return o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "plinth-scheduler-config-")
}

// podContainers returns the containers of a workload's pod template under field
// ("containers" or "initContainers").
func podContainers(o *unstructured.Unstructured, field string) []map[string]any {
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
	var out []map[string]any
	for _, c := range cs {
		out = append(out, c.(map[string]any))
	}
	return out
}

// The chart rendered with values that touch everything is accepted by the real API server
// (server-side apply, dry run, strict field validation, no warnings), CRDs included.
func testHelmChartDryRun(t *testing.T, c *cluster) {
	ctx := t.Context()
	objs, crds := renderChart(t, customValues)
	n := 0
	for _, o := range slices.Concat(crds, objs) {
		if err := c.apply(t, ctx, o, true); err != nil {
			t.Errorf("charts/plinth: %s rejected: %v", ID(o), err)
		}
		n++
	}
	if n < 50 {
		t.Errorf("only %d objects rendered", n)
	}
	t.Logf("%d objects of charts/plinth accepted by server-side dry-run", n)
}

// chartImage is one entry of the chart's values.yaml images map.
type chartImage struct{ Repository, Tag string }

// chartImages reads the images map of the chart's values.yaml, by component.
func chartImages(t *testing.T) map[string]chartImage {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals struct{ Images map[string]chartImage }
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatal(err)
	}
	return vals.Images
}
