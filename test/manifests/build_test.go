package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

const (
	kustomizeRoot = "../../kustomize"
	crdBases      = "../../schema/crd/bases"
	namespace     = "plinth-system"
	keys          = "plinth-keys" // the key Secrets of encrypted volumes (policyv1.VolumeKeyNamespace)
)

var (
	buildsOnce sync.Once
	builds     map[string][]*unstructured.Unstructured
	buildsErr  error
)

// allBuilds builds every kustomization under kustomize/ once per test binary.
func allBuilds(t *testing.T) map[string][]*unstructured.Unstructured {
	t.Helper()
	buildsOnce.Do(func() {
		dirs, err := Kustomizations(kustomizeRoot)
		if err != nil {
			buildsErr = err
			return
		}
		builds = map[string][]*unstructured.Unstructured{}
		for _, d := range dirs {
			objs, err := Build(filepath.Join(kustomizeRoot, d))
			if err != nil {
				buildsErr = err
				return
			}
			builds[d] = objs
		}
	})
	if buildsErr != nil {
		t.Fatal(buildsErr)
	}
	return builds
}

func TestEveryKustomizationBuilds(t *testing.T) {
	b := allBuilds(t)
	want := []string{"agent", "argocd", "controller", "crd", "csi", "default", "flux", "monitoring",
		"overlays/dev", "overlays/with-monitoring", "rbac", "scheduler", "snapshot-controller"}
	var got []string
	for d, objs := range b {
		got = append(got, d)
		if len(objs) == 0 {
			t.Errorf("kustomize/%s builds no objects", d)
		}
		seen := map[string]bool{}
		for _, o := range objs {
			if seen[ID(o)] {
				t.Errorf("kustomize/%s: %s twice", d, ID(o))
			}
			seen[ID(o)] = true
		}
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("kustomizations = %v, want %v", got, want)
	}
}

// The CRD base references the generated YAML: it builds exactly schema/crd/bases, and no CRD
// of Plinth's is copied under kustomize/ (kustomize/snapshot-controller ships the upstream
// snapshot CRDs).
func TestCRDBaseIsTheGeneratedYAML(t *testing.T) {
	b := allBuilds(t)
	files, err := filepath.Glob(filepath.Join(crdBases, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no generated CRDs in %s: %v", crdBases, err)
	}
	var want []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct{ Metadata struct{ Name string } }
		if err := yaml.Unmarshal(data, &crd); err != nil {
			t.Fatal(err)
		}
		want = append(want, crd.Metadata.Name)
	}
	var got []string
	for _, o := range b["crd"] {
		if o.GetKind() != "CustomResourceDefinition" {
			t.Errorf("kustomize/crd builds %s", ID(o))
		}
		got = append(got, o.GetName())
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("kustomize/crd builds %v, schema/crd/bases holds %v", got, want)
	}
	err = filepath.WalkDir(kustomizeRoot, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !strings.Contains(string(data), "kind: CustomResourceDefinition") {
			return nil
		}
		// The only third-party CRDs shipped are snapshot.storage.k8s.io's and
		// groupsnapshot.storage.k8s.io's, copied by make generate into
		// kustomize/snapshot-controller/crds; Plinth's own are never copied.
		var crd struct{ Spec struct{ Group string } }
		if err := yaml.Unmarshal(data, &crd); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if filepath.Dir(p) != filepath.Join(kustomizeRoot, "snapshot-controller", "crds") || (crd.Spec.Group != "snapshot.storage.k8s.io" && crd.Spec.Group != "groupsnapshot.storage.k8s.io") {
			t.Errorf("%s holds a CRD of group %q: reference ../../schema/crd instead of copying", p, crd.Spec.Group)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Images are named once: the bases name images by a bare name, and the images component maps
// each to a full reference; every container of every build ends up with one of those.
func TestImagesNamedOnce(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(kustomizeRoot, "components/images/kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var comp struct {
		Images []struct{ Name, NewName, NewTag string }
	}
	if err := yaml.Unmarshal(data, &comp); err != nil {
		t.Fatal(err)
	}
	refs := map[string]bool{}
	for _, im := range comp.Images {
		if im.NewName == "" || im.NewTag == "" {
			t.Errorf("image %q: newName and newTag are both required", im.Name)
		}
		refs[im.NewName+":"+im.NewTag] = true
	}
	used := map[string]bool{}
	for d, objs := range allBuilds(t) {
		for _, o := range objs {
			for _, c := range containers(o) {
				img, _ := c["image"].(string)
				if !refs[img] {
					t.Errorf("kustomize/%s %s container %v: image %q is not one of the images component", d, ID(o), c["name"], img)
				}
				used[img] = true
			}
		}
	}
	for r := range refs {
		if !used[r] {
			t.Errorf("images component names %s, which no manifest uses", r)
		}
	}
}

// containers returns the containers and init containers of a workload's pod template.
func containers(o *unstructured.Unstructured) []map[string]any {
	var out []map[string]any
	for _, f := range []string{"containers", "initContainers"} {
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", f)
		for _, c := range cs {
			if m, ok := c.(map[string]any); ok {
				out = append(out, m)
			}
		}
	}
	return out
}

// default/ composes the bases (plus the namespaces: Plinth's and the key Secrets'); with-monitoring adds monitoring/.
func TestDefaultComposesTheBases(t *testing.T) {
	b := allBuilds(t)
	ids := func(dirs ...string) []string {
		var out []string
		for _, d := range dirs {
			for _, o := range b[d] {
				out = append(out, ID(o))
			}
		}
		sort.Strings(out)
		return out
	}
	def := ids("default")
	want := append(ids("crd", "rbac", "controller", "agent", "csi", "scheduler"), "Namespace//"+namespace, "Namespace//"+keys)
	sort.Strings(want)
	if !slices.Equal(def, want) {
		t.Errorf("default builds\n%v\nwant the bases\n%v", def, want)
	}
	wm := ids("overlays/with-monitoring")
	want = append(slices.Clone(def), ids("monitoring")...)
	sort.Strings(want)
	if !slices.Equal(wm, want) {
		t.Errorf("with-monitoring builds\n%v\nwant default + monitoring\n%v", wm, want)
	}
	for _, o := range b["default"] {
		if ns := o.GetNamespace(); ns != "" && ns != namespace && !(ns == "kube-system" && o.GetKind() == "RoleBinding") &&
			!(ns == keys && strings.HasPrefix(o.GetKind(), "Role")) {
			t.Errorf("%s: namespace %q, want %s (or %s for the key Secrets' Role)", ID(o), ns, namespace, keys)
		}
	}
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

// What the issue asks of the workloads, checked on the built objects.
func TestWorkloadShapes(t *testing.T) {
	b := allBuilds(t)
	objs := b["default"]
	t.Run("agent", func(t *testing.T) {
		ds := find(t, objs, "DaemonSet", "plinth-agent")
		if v, _, _ := unstructured.NestedBool(ds.Object, "spec", "template", "spec", "hostNetwork"); !v {
			t.Error("agent: hostNetwork is off (the NVMe-oF port binds on the node's address)")
		}
		paths := hostPaths(ds)
		for _, p := range []string{"/dev", "/sys/kernel/config", "/run/udev", "/etc/nvme", "/var/lib/plinth", "/lib/modules"} {
			if !paths[p] {
				t.Errorf("agent: no hostPath volume %s", p)
			}
		}
		var initCmd []string
		for _, c := range containers(ds) {
			if c["name"] == "modules" {
				for _, a := range c["command"].([]any) {
					initCmd = append(initCmd, a.(string))
				}
			}
			if c["name"] == "agent" {
				if p, _, _ := unstructured.NestedBool(c, "securityContext", "privileged"); !p {
					t.Error("agent container is not privileged")
				}
				if !slices.Contains(stringsOf(c["args"]), "agent") {
					t.Errorf("agent container args %v: no agent subcommand", c["args"])
				}
			}
		}
		for _, m := range []string{"nvmet", "nvmet_tcp", "dm_thin_pool"} {
			if !slices.Contains(initCmd, m) {
				t.Errorf("agent init step %v does not load %s", initCmd, m)
			}
		}
	})
	t.Run("csi", func(t *testing.T) {
		drv := find(t, objs, "CSIDriver", "csi.plinth.dev")
		if v, _, _ := unstructured.NestedBool(drv.Object, "spec", "attachRequired"); !v {
			t.Error("CSIDriver: attachRequired is false (docs/design.md, \"ControllerPublish\": NVMe-oF needs publish)")
		}
		dep := find(t, objs, "Deployment", "plinth-csi-controller")
		var names []string
		for _, c := range containers(dep) {
			names = append(names, c["image"].(string))
		}
		for _, s := range []string{"csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"} {
			if !slices.ContainsFunc(names, func(n string) bool { return strings.Contains(n, "/"+s+":") }) {
				t.Errorf("CSI controller: no %s sidecar in %v", s, names)
			}
		}
		// the move executor runs in the CSI controller's process, its replicas electing one
		// leader in the pod's namespace (the Role grants Leases there)
		for _, c := range containers(dep) {
			if c["name"] != "plinth-csi" {
				continue
			}
			if v := argValue(t, c, "--move-executor"); v != "true" {
				t.Errorf("CSI controller: --move-executor=%s, want true", v)
			}
			if v := argValue(t, c, "--leader-election-namespace"); v != "$(NAMESPACE)" {
				t.Errorf("CSI controller: --leader-election-namespace=%s, want $(NAMESPACE)", v)
			}
			env, _, _ := unstructured.NestedSlice(c, "env")
			if !slices.ContainsFunc(env, func(e any) bool {
				m := e.(map[string]any)
				path, _, _ := unstructured.NestedString(m, "valueFrom", "fieldRef", "fieldPath")
				return m["name"] == "NAMESPACE" && path == "metadata.namespace"
			}) {
				t.Errorf("CSI controller: plinth-csi has no NAMESPACE from metadata.namespace: %v", env)
			}
		}
		node := find(t, objs, "DaemonSet", "plinth-csi-node")
		bidi := false
		for _, c := range containers(node) {
			mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
			for _, m := range mounts {
				mm := m.(map[string]any)
				if mm["mountPath"] == "/var/lib/kubelet" && mm["mountPropagation"] == "Bidirectional" {
					bidi = true
				}
			}
		}
		if !bidi {
			t.Error("CSI node: /var/lib/kubelet is not mounted with Bidirectional propagation")
		}
		// node-driver-registrar and livenessprobe are not shipped: plinth csi registers itself
		// with kubelet and serves its own /healthz.
		nc := containers(node)
		if len(nc) != 1 {
			t.Errorf("CSI node: %d containers, want plinth-csi alone", len(nc))
		}
		c := nc[0]
		regDir := argValue(t, c, "--registration-dir")
		regVolume := ""
		mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
		for _, m := range mounts {
			if mm := m.(map[string]any); mm["mountPath"] == regDir {
				regVolume, _ = mm["name"].(string)
			}
		}
		if p := hostPathOf(node, regVolume); p != "/var/lib/kubelet/plugins_registry" {
			t.Errorf("CSI node: --registration-dir %s is volume %q from host path %q, want kubelet's /var/lib/kubelet/plugins_registry", regDir, regVolume, p)
		}
		if p := argValue(t, c, "--kubelet-registration-path"); p != hostPathOf(node, "socket")+"/csi.sock" || argValue(t, c, "--endpoint") != "unix:///csi/csi.sock" {
			t.Errorf("CSI node: --kubelet-registration-path %s is not the host path of the socket volume mounted at /csi", p)
		}
		for name, w := range map[string]map[string]any{"CSI node": c, "CSI controller": containers(dep)[0]} {
			checkLiveness(t, name, w)
		}
		for _, cc := range containers(dep) {
			if img, _ := cc["image"].(string); strings.Contains(img, "livenessprobe") || strings.Contains(img, "registrar") {
				t.Errorf("CSI controller: sidecar %s, which plinth csi replaces", img)
			}
		}
	})
	t.Run("controller", func(t *testing.T) {
		dep := find(t, objs, "Deployment", "plinth-controller")
		c := containers(dep)[0]
		if !slices.Contains(stringsOf(c["args"]), "--leader-elect") {
			t.Errorf("controller args %v: no --leader-elect", c["args"])
		}
		for _, p := range []string{"livenessProbe", "readinessProbe"} {
			if _, ok := c[p]; !ok {
				t.Errorf("controller: no %s", p)
			}
		}
	})
	t.Run("one ServiceAccount per component", func(t *testing.T) {
		sas := map[string]string{}
		for _, o := range objs {
			if len(containers(o)) == 0 {
				continue
			}
			sa, _, _ := unstructured.NestedString(o.Object, "spec", "template", "spec", "serviceAccountName")
			if sa == "" {
				t.Errorf("%s runs as the default ServiceAccount", ID(o))
			}
			if prev, ok := sas[sa]; ok {
				t.Errorf("%s and %s share ServiceAccount %s", prev, ID(o), sa)
			}
			sas[sa] = ID(o)
			find(t, objs, "ServiceAccount", sa)
		}
		if len(sas) != 5 {
			t.Errorf("ServiceAccounts of workloads: %v, want 5 (controller, agent, csi controller, csi node, scheduler)", sas)
		}
	})
}

func hostPaths(o *unstructured.Unstructured) map[string]bool {
	out := map[string]bool{}
	vols, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
	for _, v := range vols {
		if p, ok, _ := unstructured.NestedString(v.(map[string]any), "hostPath", "path"); ok {
			out[p] = true
		}
	}
	return out
}

func stringsOf(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, s := range l {
		if str, ok := s.(string); ok {
			out = append(out, str)
		}
	}
	return out
}

// argValue returns the value of a --flag=value argument of container c, or fails t.
func argValue(t *testing.T, c map[string]any, flag string) string {
	t.Helper()
	for _, a := range stringsOf(c["args"]) {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	t.Fatalf("container %v: no %s= argument in %v", c["name"], flag, c["args"])
	return ""
}

// hostPathOf returns the host path of the workload's volume name ("" when it is not a hostPath).
func hostPathOf(o *unstructured.Unstructured, name string) string {
	vols, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
	for _, v := range vols {
		vm := v.(map[string]any)
		if vm["name"] == name {
			p, _, _ := unstructured.NestedString(vm, "hostPath", "path")
			return p
		}
	}
	return ""
}

// checkLiveness: the container's livenessProbe gets /healthz from the port that its
// --health-address serves.
func checkLiveness(t *testing.T, what string, c map[string]any) {
	t.Helper()
	path, _, _ := unstructured.NestedString(c, "livenessProbe", "httpGet", "path")
	port, _, _ := unstructured.NestedFieldNoCopy(c, "livenessProbe", "httpGet", "port")
	if path != "/healthz" {
		t.Errorf("%s: livenessProbe path %q, want /healthz", what, path)
	}
	if named, ok := port.(string); ok {
		ports, _, _ := unstructured.NestedSlice(c, "ports")
		for _, p := range ports {
			if pm := p.(map[string]any); pm["name"] == named {
				port = pm["containerPort"]
			}
		}
	}
	addr := argValue(t, c, "--health-address")
	if _, p, _ := strings.Cut(addr, ":"); fmt.Sprint(port) != p {
		t.Errorf("%s: livenessProbe port %v, but --health-address is %s", what, port, addr)
	}
}

// TestLivenessToleratesASlowNode: every Plinth container's livenessProbe (kustomize/default)
// gives an answer at least 10 s (timeoutSeconds) and restarts the container only after 2
// minutes of probes without one (failureThreshold × periodSeconds ≥ 120 s), and starts only
// after a startupProbe on the same endpoint that allows 5 minutes (≥ 300 s) for the process
// to answer; every readinessProbe waits at least 5 s. With 1 s probes and 70 s to start, a
// node short of CPU killed healthy agents, node plugins and schedulers over and over in the
// two-guest suite (one agent's container took 2 minutes from Created to Started, then had not
// opened its probe port 60 s later); CrashLoopBackOff held the helm upgrade's rollout for
// more than 10 minutes. A container whose /healthz makes calls bounds them by --probe-timeout
// below the probe's timeout, so a slow answer says why.
func TestLivenessToleratesASlowNode(t *testing.T) {
	seen := 0
	for _, o := range allBuilds(t)["default"] {
		for _, c := range containers(o) {
			what := fmt.Sprintf("%s container %v", ID(o), c["name"])
			if _, ok := c["livenessProbe"]; ok {
				seen++
				// unset: the API's defaults (1 s, every 10 s, 3 failures)
				timeout, ok, _ := unstructured.NestedInt64(c, "livenessProbe", "timeoutSeconds")
				if !ok {
					timeout = 1
				}
				period, ok, _ := unstructured.NestedInt64(c, "livenessProbe", "periodSeconds")
				if !ok {
					period = 10
				}
				failures, ok, _ := unstructured.NestedInt64(c, "livenessProbe", "failureThreshold")
				if !ok {
					failures = 3
				}
				if timeout < 10 || failures*period < 120 {
					t.Errorf("%s: livenessProbe timeout %d s, restart after %d × %d s: want ≥ 10 s and ≥ 120 s", what, timeout, failures, period)
				}
				sp, _, _ := unstructured.NestedFieldNoCopy(c, "startupProbe", "httpGet")
				lp, _, _ := unstructured.NestedFieldNoCopy(c, "livenessProbe", "httpGet")
				sPeriod, _, _ := unstructured.NestedInt64(c, "startupProbe", "periodSeconds")
				sFailures, _, _ := unstructured.NestedInt64(c, "startupProbe", "failureThreshold")
				if sp == nil || fmt.Sprint(sp) != fmt.Sprint(lp) || sPeriod*sFailures < 300 {
					t.Errorf("%s: startupProbe %v every %d s, %d failures: want the livenessProbe's %v, ≥ 300 s in all", what, sp, sPeriod, sFailures, lp)
				}
				for _, a := range stringsOf(c["args"]) {
					if v, ok := strings.CutPrefix(a, "--probe-timeout="); ok {
						d, err := time.ParseDuration(v)
						if err != nil || d >= time.Duration(timeout)*time.Second {
							t.Errorf("%s: --probe-timeout=%s, want a duration below the probe's %d s", what, v, timeout)
						}
					}
				}
			}
			if _, ok := c["readinessProbe"]; ok {
				if timeout, ok, _ := unstructured.NestedInt64(c, "readinessProbe", "timeoutSeconds"); !ok || timeout < 5 {
					t.Errorf("%s: readinessProbe timeout %d s, want ≥ 5 s", what, timeout)
				}
			}
		}
	}
	if seen != 5 {
		t.Errorf("%d liveness probes in kustomize/default, want 5 (agent, controller, scheduler, CSI controller and node)", seen)
	}
}
