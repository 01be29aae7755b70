package plan

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/ssa"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// fakeSource is a fake Source for the plan's rules without an API server: live objects by
// "Kind/name", dry-run outcomes by "Kind/name" (Unchanged when not listed), usage by name.
// The API server's own part (what a dry-run returns) is covered by the controller's and
// plinth diff's integration tests on a real kube-apiserver.
type fakeSource struct {
	live    map[string]*unstructured.Unstructured
	dryRun  map[string]DryRun
	cached  map[string]CacheState
	classes map[string]Usage
	attrs   map[string]Usage
	stores  map[string]Usage
	dryRuns []string
}

func (f *fakeSource) Get(_ context.Context, gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, error) {
	if u := f.live[gvk.Kind+"/"+name]; u != nil {
		return u.DeepCopy(), nil
	}
	return nil, nil
}

func (f *fakeSource) Cached(_ context.Context, u *unstructured.Unstructured) CacheState {
	return f.cached[u.GetKind()+"/"+u.GetName()]
}

func (f *fakeSource) DryRun(_ context.Context, objs []*unstructured.Unstructured) ([]DryRun, error) {
	out := make([]DryRun, len(objs))
	for i, u := range objs {
		key := u.GetKind() + "/" + u.GetName()
		f.dryRuns = append(f.dryRuns, key)
		out[i] = DryRun{Action: ssa.UnchangedAction}
		if r, ok := f.dryRun[key]; ok {
			out[i] = r
		}
	}
	return out, nil
}

func (f *fakeSource) AttributesClassUsage(_ context.Context, name string) (Usage, error) {
	if u, ok := f.attrs[name]; ok {
		return u, nil
	}
	return Usage{Known: true}, nil
}

func (f *fakeSource) ClassUsage(_ context.Context, name string) (Usage, error) {
	if u, ok := f.classes[name]; ok {
		return u, nil
	}
	return Usage{Known: true}, nil
}

func (f *fakeSource) StoreUsage(_ context.Context, name string) (Usage, error) {
	if u, ok := f.stores[name]; ok {
		return u, nil
	}
	return Usage{Known: true}, nil
}

func class(t *testing.T, name, placement, fsType string, annotations map[string]string) *unstructured.Unstructured {
	t.Helper()
	reclaim := corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{
		TypeMeta:      metav1.TypeMeta{APIVersion: "storage.k8s.io/v1", Kind: "StorageClass"},
		ObjectMeta:    metav1.ObjectMeta{Name: name, Labels: map[string]string{policyv1.LabelPlacement: placement}, Annotations: annotations},
		Provisioner:   policyv1.DriverName,
		Parameters:    map[string]string{policyv1.ParamFSType: fsType},
		ReclaimPolicy: &reclaim,
	}
	u, err := render.ToUnstructured(sc)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func runtimeObj(kind, name, node string, labels map[string]string) *unstructured.Unstructured {
	u := obj(kind, name, nil, labels, map[string]any{"nodeName": node})
	u.SetAPIVersion("storage.plinth.dev/v1alpha1")
	return u
}

func entries(t *testing.T, us ...*unstructured.Unstructured) *inventory.Inventory {
	t.Helper()
	inv := inventory.New()
	for _, u := range us {
		e, err := inventory.EntryOf(u)
		if err != nil {
			t.Fatal(err)
		}
		inv.Put(e)
	}
	return inv
}

func placements(policies map[string]policyv1.Replacement) map[string]*policyv1.Placement {
	out := map[string]*policyv1.Placement{}
	for name, p := range policies {
		pl := &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: name}}
		pl.Spec.StorageClass.Replacement = p
		out[name] = pl
	}
	return out
}

// TestReplacementRules: a StorageClass whose immutable fields change is replaced when its
// policy allows it (out of the apply), kept with its live immutable fields otherwise, and
// left undecided when usage is unknown under IfUnused.
func TestReplacementRules(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		policy                policyv1.Replacement
		usage                 Usage
		allowed, known, inObj bool
		blocked               string
	}{
		{"Always in use", policyv1.ReplacementAlways, Usage{PVCs: 2, Known: true}, true, true, false, ""},
		{"IfUnused unused", policyv1.ReplacementIfUnused, Usage{Known: true}, true, true, false, ""},
		{"IfUnused in use", policyv1.ReplacementIfUnused, Usage{PVCs: 1, PVs: 1, Known: true}, false, true, true, "replacement is IfUnused and it is in use by 1 PVCs and 1 PVs"},
		{"Never", policyv1.ReplacementNever, Usage{Known: true}, false, true, true, "replacement is Never"},
		{"IfUnused, usage unknown", policyv1.ReplacementIfUnused, Usage{}, false, false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := class(t, "fast", "fast", "ext4", map[string]string{"storageclass.kubernetes.io/is-default-class": "true"})
			src := &fakeSource{live: map[string]*unstructured.Unstructured{"StorageClass/fast": live}, classes: map[string]Usage{"fast": tc.usage}}
			in := Input{Desired: []*unstructured.Unstructured{class(t, "fast", "fast", "xfs", nil)},
				Placements: placements(map[string]policyv1.Replacement{"fast": tc.policy}), Previous: entries(t, live)}
			p, err := Make(context.Background(), in, src)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Classes) != 1 {
				t.Fatalf("classes %+v", p.Classes)
			}
			cc := p.Classes[0]
			if cc.Allowed != tc.allowed || cc.AllowedKnown != tc.known || !cc.WasDefault || len(cc.Immutable) != 1 {
				t.Errorf("class change %+v", cc)
			}
			if got := len(p.Objects) == 1; got != tc.inObj {
				t.Fatalf("objects %+v, want the kept class applied: %v", p.Objects, tc.inObj)
			}
			if tc.inObj {
				o := p.Objects[0]
				fs, _, _ := unstructured.NestedString(o.Object.Object, "parameters", policyv1.ParamFSType)
				if !o.KeptImmutable || fs != "ext4" {
					t.Errorf("kept class %+v with fsType %q, want the live ext4", o, fs)
				}
			}
			if b := cc.Blocked(); tc.blocked == "" && b != "" || !strings.Contains(b, tc.blocked) {
				t.Errorf("blocked %q, want %q", b, tc.blocked)
			}
			if got := len(p.Replacements()); got != map[bool]int{true: 1}[tc.allowed] {
				t.Errorf("%d replacements", got)
			}
		})
	}
}

// TestObjectRules: a changed digest is a policy change, an unchanged digest with a live
// difference is drift (corrected by driftPolicy), a refused dry-run is kept with its error,
// an object the inventory records whose live copy holds every field skips the dry-run, and so
// does an object neither the inventory nor the cache holds (a Create); an object the
// inventory records but the cache does not hold is dry-run (deleted outside Plinth: drift).
func TestObjectRules(t *testing.T) {
	correct := runtimeObj("Store", "p.a", "a", nil)
	correct.Object["spec"].(map[string]any)["driftPolicy"] = "Correct"
	report := runtimeObj("Store", "q.a", "a", nil)
	report.Object["spec"].(map[string]any)["driftPolicy"] = "Report"
	changed := runtimeObj("Agent", "b", "b", nil)
	fresh := runtimeObj("Agent", "c", "c", nil)
	refused := runtimeObj("Agent", "d", "d", nil)
	cached := runtimeObj("Agent", "e", "e", nil)
	absent := runtimeObj("Agent", "f", "f", nil)
	oldChanged := runtimeObj("Agent", "b", "b", map[string]string{"x": "old"})
	src := &fakeSource{
		dryRun: map[string]DryRun{
			"Store/p.a": {Action: ssa.CreatedAction},
			"Store/q.a": {Action: ssa.ConfiguredAction, Fields: []string{"spec.reserve"}},
			"Agent/b":   {Action: ssa.ConfiguredAction, Fields: []string{"metadata.labels.x"}},
			"Agent/c":   {Action: ssa.CreatedAction},
			"Agent/d":   {Err: errors.New("denied")},
		},
		cached: map[string]CacheState{"Agent/e": CacheHolds, "Agent/b": CacheHolds, "Agent/f": CacheAbsent, "Store/p.a": CacheAbsent,
			"Store/q.a": CacheDiffers},
	}
	in := Input{Desired: []*unstructured.Unstructured{correct, report, changed, fresh, refused, cached, absent},
		Sources:  map[string][]string{"Store/p.a": {"StoragePool/p"}, "Agent/b": {"StoragePool/p", "StoragePool/q"}},
		Previous: entries(t, correct, report, oldChanged, cached)}
	p, err := Make(context.Background(), in, src)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		action  Action
		correct bool
	}{
		"Store/p.a": {Drift, true}, "Store/q.a": {Drift, false}, "Agent/b": {Change, false},
		"Agent/c": {Create, false}, "Agent/d": {Rejected, false}, "Agent/e": {Unchanged, false}, "Agent/f": {Create, false},
	}
	for i := range p.Objects {
		o := &p.Objects[i]
		w := want[o.Key()]
		if o.Action != w.action || o.Correct != w.correct {
			t.Errorf("%s: %s correct=%v, want %s correct=%v", o.Key(), o.Action, o.Correct, w.action, w.correct)
		}
	}
	if o := p.Objects[0]; o.Drift == nil || !o.Drift.Deleted || !o.Apply() || strings.Join(o.DriftOwners(), ",") != "StoragePool/p" {
		t.Errorf("deleted Store: %+v", o)
	}
	if o := p.Objects[1]; o.Apply() || o.Drift == nil || strings.Join(o.Drift.Fields, ",") != "spec.reserve" {
		t.Errorf("reported drift: %+v", o)
	}
	if o := p.Objects[4]; o.Apply() || o.DryRunErr == nil {
		t.Errorf("refused: %+v", o)
	}
	if o := p.Objects[6]; !o.Apply() {
		t.Errorf("new object the cache does not hold: %+v, want applied", o)
	}
	if got := strings.Join(src.dryRuns, ","); got != "Store/p.a,Store/q.a,Agent/b,Agent/c,Agent/d" {
		t.Errorf("dry-runs %s: an inventoried object whose cache holds every field needs none, nor does one neither inventory nor cache holds; a changed digest always does", got)
	}
}

// TestPruneRules: stale inventory entries are decided Stores first, so the Agent of a node
// that keeps a draining Store is kept too; objects already gone are left out; usage comes
// from the source.
func TestPruneRules(t *testing.T) {
	store := runtimeObj("Store", "p.a", "a", map[string]string{policyv1.LabelPool: "p"})
	agent := runtimeObj("Agent", "a", "a", nil)
	agentB := runtimeObj("Agent", "b", "b", nil)
	sc := class(t, "gone", "gone", "ext4", nil)
	// its claims are gone, its PVs (reclaim policy Retain) are not: still in use
	retained := class(t, "retained", "retained", "ext4", nil)
	vanished := runtimeObj("Store", "p.z", "z", nil)
	src := &fakeSource{
		live:    map[string]*unstructured.Unstructured{"Store/p.a": store, "Agent/a": agent, "Agent/b": agentB, "StorageClass/gone": sc, "StorageClass/retained": retained},
		classes: map[string]Usage{"gone": {PVCs: 2, Pending: 1, Known: true}, "retained": {PVs: 1, Known: true}},
		stores:  map[string]Usage{"p.a": {Volumes: 3, Known: true}},
	}
	p, err := Make(context.Background(), Input{Previous: entries(t, store, agent, agentB, sc, retained, vanished)}, src)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, pr := range p.Prunes {
		got = append(got, pr.Entry.String()+"="+string(pr.Verdict))
	}
	want := "Store/p.a=KeepDraining,Agent/b=Delete,Agent/a=KeepDraining,StorageClass/retained=KeepInUse,StorageClass/gone=KeepInUse"
	if strings.Join(got, ",") != want {
		t.Errorf("prunes %s, want %s", strings.Join(got, ","), want)
	}
	if pr := p.Prunes[0]; pr.Usage.Volumes != 3 || strings.Join(pr.Owners, ",") != "StoragePool/p" || pr.Node != "a" {
		t.Errorf("store prune %+v", pr)
	}
	if pr := p.Prunes[3]; pr.Usage.PVs != 1 || pr.Usage.PVCs != 0 {
		t.Errorf("class kept for its PVs: %+v", pr)
	}
	if pr := p.Prunes[4]; pr.Usage.PVCs != 2 || pr.Usage.Pending != 1 || strings.Join(pr.Owners, ",") != "Placement/gone" {
		t.Errorf("class prune %+v", pr)
	}
}
