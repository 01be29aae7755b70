package devenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/test/framework/deploy"
)

// argoPlinthRoot is where Plinth's kustomize/ tree sits in the Argo CD repository; the plinth
// Application's path is the dev overlay under it, the overlay this cluster was deployed from.
const argoPlinthRoot = "plinth"

// argoPlinthDirs are the folders of Plinth's repository that kustomize/ reads: its own tree and
// the generated CRDs it includes (kustomize/crd → schema/crd).
var argoPlinthDirs = []string{"kustomize", "schema/crd"}

// argoPlinthFiles is Plinth's kustomize/ tree and what it includes, as files of the Argo CD
// repository under argoPlinthRoot, byte for byte: what a user's fork or vendored copy holds.
func argoPlinthFiles(root string) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, dir := range argoPlinthDirs {
		if err := argoCopyDir(root, dir, files); err != nil {
			return nil, err
		}
	}
	return files, nil
}

func argoCopyDir(root, dir string, files map[string][]byte) error {
	base := filepath.Join(root, filepath.FromSlash(dir))
	return filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[filepath.ToSlash(filepath.Join(argoPlinthRoot, rel))] = data
		return nil
	})
}

// plinthWorkloads records what a rollout would change: each Deployment's and DaemonSet's
// generation and spec (top-level fields as JSON, the pod template among them) and every pod's
// UID in the controller namespace.
type plinthWorkloads struct {
	generations map[string]int64
	specs       map[string]map[string]string
	pods        map[string]types.UID
}

// specFields is a workload spec's top-level fields, each as JSON.
func specFields(spec any) map[string]string {
	data, _ := json.Marshal(spec)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(data, &m)
	out := map[string]string{}
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

func (e *Walk) plinthWorkloads(ctx context.Context) (*plinthWorkloads, error) {
	w := &plinthWorkloads{generations: map[string]int64{}, specs: map[string]map[string]string{}, pods: map[string]types.UID{}}
	var deps appsv1.DeploymentList
	if err := e.Client.List(ctx, &deps, client.InNamespace(ControllerNamespace)); err != nil {
		return nil, err
	}
	for _, d := range deps.Items {
		w.generations["Deployment/"+d.Name] = d.Generation
		w.specs["Deployment/"+d.Name] = specFields(d.Spec)
	}
	var dss appsv1.DaemonSetList
	if err := e.Client.List(ctx, &dss, client.InNamespace(ControllerNamespace)); err != nil {
		return nil, err
	}
	for _, d := range dss.Items {
		w.generations["DaemonSet/"+d.Name] = d.Generation
		w.specs["DaemonSet/"+d.Name] = specFields(d.Spec)
	}
	var pods corev1.PodList
	if err := e.Client.List(ctx, &pods, client.InNamespace(ControllerNamespace)); err != nil {
		return nil, err
	}
	for _, p := range pods.Items {
		w.pods[p.Name] = p.UID
	}
	return w, nil
}

// same says how after differs from w: a workload whose pod template changed (a rollout), a pod
// gone or new (replaced). A generation that moved with the pod template kept is no rollout: notes
// names the spec fields that changed.
func (w *plinthWorkloads) same(after *plinthWorkloads) (notes []string, err error) {
	var diffs []string
	for k, g := range w.generations {
		if after.generations[k] == g {
			continue
		}
		var changed []string
		for f, v := range after.specs[k] {
			if w.specs[k][f] != v {
				changed = append(changed, f)
			}
		}
		for f := range w.specs[k] {
			if _, ok := after.specs[k][f]; !ok {
				changed = append(changed, f)
			}
		}
		sort.Strings(changed)
		line := fmt.Sprintf("%s generation %d → %d, spec fields changed: %v", k, g, after.generations[k], changed)
		for _, f := range changed {
			if f == "template" {
				line += fmt.Sprintf(" (template before %s, after %s)", w.specs[k][f], after.specs[k][f])
				diffs = append(diffs, line)
				line = ""
				break
			}
		}
		switch {
		case line == "":
		case len(changed) == 0:
			// Seen with Argo CD v3.2.9's first server-side apply of the three Deployments:
			// the generation moves, the spec reads back equal.
			notes = append(notes, fmt.Sprintf("%s generation %d → %d, spec read back equal", k, g, after.generations[k]))
		default:
			notes = append(notes, line+fmt.Sprintf(" (before %v, after %v)", pick(w.specs[k], changed), pick(after.specs[k], changed)))
		}
	}
	for n, uid := range w.pods {
		if after.pods[n] != uid {
			diffs = append(diffs, fmt.Sprintf("pod %s replaced or gone", n))
		}
	}
	for n := range after.pods {
		if _, ok := w.pods[n]; !ok {
			diffs = append(diffs, fmt.Sprintf("pod %s new", n))
		}
	}
	if len(diffs) == 0 && len(w.generations) == 0 {
		return nil, fmt.Errorf("no Deployment or DaemonSet in %s to compare", ControllerNamespace)
	}
	sort.Strings(notes)
	if len(diffs) > 0 {
		sort.Strings(diffs)
		return notes, fmt.Errorf("Argo CD's sync of Plinth changed the running workloads: %s", strings.Join(diffs, "; "))
	}
	return notes, nil
}

// pick is m's entries of keys.
func pick(m map[string]string, keys []string) map[string]string {
	out := map[string]string{}
	for _, k := range keys {
		out[k] = m[k]
	}
	return out
}

// argoPlinthSynced waits for the plinth Application (sync wave 0) to be Synced and Healthy at
// the repository's head, tracking exactly the objects of the dev overlay, and checks that taking
// the running Plinth over rolled nothing out: the repository holds what deploy applied, so Argo
// CD's server-side apply changes no spec.
func (e *Walk) argoPlinthSynced(ctx context.Context, before *plinthWorkloads, sum *ArgoCDSummary, start time.Time) (string, error) {
	res, err := e.waitArgoAppNamed(ctx, ArgoCDPlinthApp, 4*time.Minute, "Synced", "Healthy")
	if err != nil {
		return "", err
	}
	sum.PlinthSynced = time.Since(start)
	objs, err := deploy.Build(filepath.Join(e.Root, DevOverlay))
	if err != nil {
		return "", err
	}
	want := map[string]bool{}
	for _, o := range objs {
		want[o.GetKind()+"/"+o.GetName()] = true
	}
	got := map[string]bool{}
	health := map[string]int{}
	for _, r := range res {
		got[r.Kind+"/"+r.Name] = true
		if r.Status != "Synced" {
			return "", fmt.Errorf("Application %s resource %s/%s: %s", ArgoCDPlinthApp, r.Kind, r.Name, r.Status)
		}
		if r.Health != "" {
			health[r.Health]++
		}
	}
	if len(got) != len(want) {
		var missing, extra []string
		for k := range want {
			if !got[k] {
				missing = append(missing, k)
			}
		}
		for k := range got {
			if !want[k] {
				extra = append(extra, k)
			}
		}
		return "", fmt.Errorf("Application %s tracks %d resources, the dev overlay has %d: missing %v, extra %v", ArgoCDPlinthApp, len(got), len(want), missing, extra)
	}
	sum.PlinthResources = len(res)
	after, err := e.plinthWorkloads(ctx)
	if err != nil {
		return "", err
	}
	notes, err := before.same(after)
	if err != nil {
		return "", err
	}
	sum.PlinthSpecChanges = len(notes)
	line := fmt.Sprintf("Application %s (wave 0, kustomize build by repo-server) Synced and Healthy %.1fs after the controllers started: %d resources (health %v); %d workloads' pod templates and %d pods unchanged (no rollout)",
		ArgoCDPlinthApp, sum.PlinthSynced.Seconds(), len(res), health, len(after.generations), len(after.pods))
	for _, n := range notes {
		line += "\n  " + n
	}
	return line, nil
}

// argoSelfHeal deletes one of Plinth's objects by hand (the controller's metrics Service: nothing
// in the scenario reads it) and waits for Argo CD's automated sync with selfHeal to create it
// again from Git.
func (e *Walk) argoSelfHeal(ctx context.Context, sum *ArgoCDSummary) (string, error) {
	key := client.ObjectKey{Namespace: ControllerNamespace, Name: "plinth-controller-metrics"}
	var svc corev1.Service
	if err := e.Client.Get(ctx, key, &svc); err != nil {
		return "", err
	}
	old := svc.UID
	start := time.Now()
	if err := e.Client.Delete(ctx, &svc); err != nil {
		return "", err
	}
	if err := poll(ctx, 2*time.Minute, func() error {
		var now corev1.Service
		if err := e.Client.Get(ctx, key, &now); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("Service %s not restored yet", key)
			}
			return err
		}
		if now.UID == old {
			return fmt.Errorf("Service %s not deleted yet", key)
		}
		return nil
	}); err != nil {
		return "", err
	}
	sum.SelfHealed = time.Since(start)
	if _, err := e.waitArgoAppNamed(ctx, ArgoCDPlinthApp, 2*time.Minute, "Synced", "Healthy"); err != nil {
		return "", err
	}
	return fmt.Sprintf("Service %s deleted by hand → created again by Argo CD's self-heal %.1fs later; Application %s Synced, Healthy", key, sum.SelfHealed.Seconds(), ArgoCDPlinthApp), nil
}
