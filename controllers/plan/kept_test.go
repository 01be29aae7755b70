package plan

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/ssa"
	storagev1 "k8s.io/api/storage/v1"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/inventory"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// countingSource is fakeSource counting its live reads, and, when cache is set, an informer
// cache that says which version of each live object it holds (versionCache).
type countingSource struct {
	*fakeSource
	gets  int
	cache map[string]liveVersion
}

func (c *countingSource) Get(ctx context.Context, gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, error) {
	c.gets++
	return c.fakeSource.Get(ctx, gvk, name)
}

type cachingSource struct{ *countingSource }

func (c cachingSource) cachedVersion(_ context.Context, u *unstructured.Unstructured) (liveVersion, bool) {
	v, ok := c.cache[u.GetKind()+"/"+u.GetName()]
	return v, ok
}

func liveClass(t *testing.T, fsType, uid, rv string) *unstructured.Unstructured {
	u := class(t, "fast", "fast", fsType, nil)
	u.SetUID(types.UID(uid))
	u.SetResourceVersion(rv)
	return u
}

// TestKeptClassVerdict: the kept "no immutable change" verdict of a StorageClass holds only
// for the live class's UID and resourceVersion it was computed against. A new resourceVersion
// (the class was changed) or a new UID (deleted and created again) is compared again, and an
// immutable change there is found; with an informer cache that still holds the compared
// version, the class is not read at all.
func TestKeptClassVerdict(t *testing.T) {
	ctx := context.Background()
	rendered := class(t, "fast", "fast", "ext4", nil)
	places := placements(map[string]policyv1.Replacement{"fast": policyv1.ReplacementNever})
	for _, withCache := range []bool{false, true} {
		name := map[bool]string{false: "no cache", true: "informer cache"}[withCache]
		t.Run(name, func(t *testing.T) {
			cs := &countingSource{fakeSource: &fakeSource{live: map[string]*unstructured.Unstructured{
				"StorageClass/fast": liveClass(t, "ext4", "u1", "1")}}, cache: map[string]liveVersion{"StorageClass/fast": {"u1", "1"}}}
			var src Source = cs
			if withCache {
				src = cachingSource{cs}
			}
			var kept Kept
			in := Input{Desired: []*unstructured.Unstructured{rendered}, Placements: places, Previous: entries(t, rendered), Kept: &kept}
			classes := func(step string) []ClassChange {
				t.Helper()
				p, err := Make(ctx, in, src)
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				return p.Classes
			}
			if cc := classes("first plan"); len(cc) != 0 || cs.gets != 1 {
				t.Fatalf("first plan: class changes %+v after %d reads, want none after 1", cc, cs.gets)
			}
			wantGets := 2 // without a cache the class is read each time; only the comparison is kept
			if withCache {
				wantGets = 1
			}
			if cc := classes("same live class"); len(cc) != 0 || cs.gets != wantGets {
				t.Fatalf("same live class: class changes %+v after %d reads, want none after %d", cc, cs.gets, wantGets)
			}
			for i, live := range []*unstructured.Unstructured{
				liveClass(t, "xfs", "u1", "2"), // changed in place (a new resourceVersion)
				liveClass(t, "xfs", "u2", "1"), // deleted and created again (a new UID, the same resourceVersion)
			} {
				cs.live["StorageClass/fast"] = live
				cs.cache["StorageClass/fast"] = versionOfLive(live.GetUID(), live.GetResourceVersion())
				before := cs.gets
				if cc := classes("changed live class"); len(cc) != 1 || len(cc[0].Immutable) != 1 || cs.gets != before+1 {
					t.Fatalf("live class %d (%s/%s): class changes %+v after %d reads, want the fsType change after one read",
						i, live.GetUID(), live.GetResourceVersion(), cc, cs.gets-before)
				}
			}
		})
	}
}

// TestKeptEntries: an inventory entry is kept per rendered object (pointer) and computed for
// an object rendered anew; what a plan did not use is dropped when it ends.
func TestKeptEntries(t *testing.T) {
	var kept Kept
	a := runtimeObj("Store", "p.a", "a", nil)
	b := runtimeObj("Store", "p.b", "b", nil)
	ctx := context.Background()
	plan := func(objs ...*unstructured.Unstructured) *Plan {
		t.Helper()
		p, err := Make(ctx, Input{Desired: objs, Previous: entries(t, objs...), Kept: &kept}, &fakeSource{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	plan(a, b)
	if kept.Len() != 2 {
		t.Fatalf("kept %d objects, want 2", kept.Len())
	}
	ea := kept.objs[a].entry
	if want, _ := inventory.EntryOf(a); ea != want {
		t.Fatalf("kept entry %+v, want %+v", ea, want)
	}
	// b rendered anew with another spec: a new object, a new digest; the old b is dropped.
	b2 := runtimeObj("Store", "p.b", "c", nil)
	p := plan(a, b2)
	if kept.Len() != 2 || kept.objs[b] != nil {
		t.Fatalf("kept %d objects (old b kept: %v), want a and the new b", kept.Len(), kept.objs[b] != nil)
	}
	want, _ := inventory.EntryOf(b2)
	old, _ := inventory.EntryOf(b)
	for _, o := range p.Objects {
		if o.Key() == "Store/p.b" && (o.Entry != want || o.Entry == old) {
			t.Fatalf("entry of the new b %+v, want %+v (not the old %+v)", o.Entry, want, old)
		}
	}
}

// TestKeptCachedAnswer: Cluster.Cached keeps its answer per rendered object and the cached live
// object's UID and resourceVersion; a write to the live object (a new resourceVersion) is
// compared again, so a live object that stopped holding the render is seen to differ.
func TestKeptCachedAnswer(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := storev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	live := &storev1.Store{}
	live.Name = "p.a"
	live.UID = "u1" // the fake client sets none; a kept answer needs one
	live.Spec.NodeName = "a"
	live.Spec.Pool = "p"
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(live).Build()
	var kept Kept
	cl := &Cluster{Cache: c, Kept: &kept}
	rendered := runtimeObj("Store", "p.a", "a", nil)
	kept.of(rendered) // as Make records each rendered object before Cached is asked
	if got := cl.Cached(ctx, rendered); got != CacheHolds {
		t.Fatalf("Cached = %v, want CacheHolds", got)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(live), live); err != nil {
		t.Fatal(err)
	}
	if k := kept.lookup(rendered); k.cacheState != CacheHolds || !k.cache.is(versionOfLive(live.UID, live.ResourceVersion)) {
		t.Fatalf("kept %+v, want CacheHolds for %s/%s", k, live.UID, live.ResourceVersion)
	}
	live.Spec.NodeName = "elsewhere"
	if err := c.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	if got := cl.Cached(ctx, rendered); got != CacheDiffers {
		t.Fatalf("Cached after the live Store changed = %v, want CacheDiffers", got)
	}
}

// liveCluster is a cluster for the plan equivalence test: a fake client stands for the API
// server and, read through Cluster.Cache, for the informer cache; every write to it is
// delivered to the Events of the informers that watch it (as policy.SetupWithManager feeds
// them), and the dry-run answers from the live objects as the API server would.
type liveCluster struct {
	t      *testing.T
	c      client.Client
	events []*Events
	uids   int
}

func (l *liveCluster) changed(u *unstructured.Unstructured) {
	for _, e := range l.events {
		e.Changed(u.GetKind(), u.GetName())
	}
}

func (l *liveCluster) get(kind, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(map[bool]string{true: "storage.k8s.io/v1", false: "storage.plinth.dev/v1alpha1"}[kind == "StorageClass"])
	u.SetKind(kind)
	if err := l.c.Get(context.Background(), client.ObjectKey{Name: name}, u); err != nil {
		return nil
	}
	return u
}

// apply writes rendered u as a server-side apply would: created with a new UID, or its
// fields set on the live object (keeping UID and whatever else the live object holds).
func (l *liveCluster) apply(u *unstructured.Unstructured) {
	ctx := context.Background()
	w := u.DeepCopy()
	if live := l.get(u.GetKind(), u.GetName()); live != nil {
		w.SetUID(live.GetUID())
		w.SetResourceVersion(live.GetResourceVersion())
		if err := l.c.Update(ctx, w); err != nil {
			l.t.Fatal(err)
		}
	} else {
		l.uids++
		w.SetUID(types.UID(fmt.Sprintf("uid-%d", l.uids)))
		if err := l.c.Create(ctx, w); err != nil {
			l.t.Fatal(err)
		}
	}
	l.changed(u)
}

// edit changes a field of the live object outside Plinth: a spec field the render sets (drift)
// or a label it does not (no drift, but a new resourceVersion).
func (l *liveCluster) edit(kind, name string, drifts bool) bool {
	live := l.get(kind, name)
	if live == nil {
		return false
	}
	switch {
	case !drifts:
		live.SetLabels(map[string]string{"team": fmt.Sprint(l.uids)})
	case kind == "StorageClass" && name == "c1": // an immutable field: blocked by replacement Never
		_ = unstructured.SetNestedField(live.Object, "xfs", "parameters", policyv1.ParamFSType)
	case kind == "StorageClass":
		_ = unstructured.SetNestedField(live.Object, "drifted", "metadata", "annotations", "gen")
	default:
		_ = unstructured.SetNestedField(live.Object, "elsewhere", "spec", "nodeName")
	}
	if err := l.c.Update(context.Background(), live); err != nil {
		l.t.Fatal(err)
	}
	l.changed(live)
	return true
}

func (l *liveCluster) remove(kind, name string) bool {
	live := l.get(kind, name)
	if live == nil {
		return false
	}
	if err := l.c.Delete(context.Background(), live); err != nil {
		l.t.Fatal(err)
	}
	l.changed(live)
	return true
}

// countingCache is an informer cache that counts its reads.
type countingCache struct {
	client.Client
	gets *int
}

func (c countingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	*c.gets++
	return c.Client.Get(ctx, key, obj, opts...)
}

// liveSource is Cluster over a liveCluster with its dry-run: Created for an absent object,
// Unchanged for a live object holding every rendered field, Configured otherwise.
type liveSource struct {
	*Cluster
	l *liveCluster
}

func (s liveSource) DryRun(_ context.Context, objs []*unstructured.Unstructured) ([]DryRun, error) {
	out := make([]DryRun, len(objs))
	for i, u := range objs {
		live := s.l.get(u.GetKind(), u.GetName())
		switch {
		case live == nil:
			out[i] = DryRun{Action: ssa.CreatedAction}
		case drift.Subset(u.Object, live.Object):
			out[i] = DryRun{Action: ssa.UnchangedAction}
		default:
			out[i] = DryRun{Action: ssa.ConfiguredAction, Fields: []string{"spec"}}
		}
	}
	return out, nil
}

func (s liveSource) ClassUsage(context.Context, string) (Usage, error) {
	return Usage{Known: true}, nil
}
func (s liveSource) StoreUsage(context.Context, string) (Usage, error) {
	return Usage{Known: true}, nil
}

// planText is a plan as comparable text: every object's key, action, entry, fields, owners and
// drift, the class changes and the prunes, the rendered inventory.
func planText(p *Plan) string {
	var b strings.Builder
	for i := range p.Objects {
		o := &p.Objects[i]
		fmt.Fprintf(&b, "%s %s %+v fields=%v owners=%v correct=%v immutable=%v drift=%+v err=%v\n", o.Key(), o.Action, o.Entry,
			o.Fields, o.Owners, o.Correct, o.KeptImmutable, o.Drift, o.DryRunErr)
	}
	for i := range p.Classes {
		c := &p.Classes[i]
		fmt.Fprintf(&b, "class %s %+v allowed=%v/%v\n", c.Desired.Name, c.Immutable, c.Allowed, c.AllowedKnown)
	}
	for i := range p.Prunes {
		fmt.Fprintf(&b, "prune %s %s\n", p.Prunes[i].Entry, p.Prunes[i].Verdict)
	}
	b.WriteString(p.Rendered.Encode())
	return b.String()
}

// TestKeptPlanMatchesCold: over random sequences of renders and of writes by others to the
// live objects, a plan with Kept and Events (the controller's: verdicts kept per rendered
// object, the informer cache read only for objects an event named) equals at every step the
// plan made with nothing kept — the same actions (drift re-applied, a deleted object created
// again, a changed one changed), the same class changes, the same prunes, the same inventory.
// The controller then carries the plan out. Steps: an object rendered anew (its spec changed
// or not), added to or dropped from the render; a live object edited (drift), relabelled (no
// drift), deleted; an inventory entry lost or changed by hand; nothing.
//
// A second Kept is planned at every step whose Events hears nothing: it must differ from the
// cold plan at some step, or the sequence would not catch an incremental plan that skipped an
// object an event named.
func TestKeptPlanMatchesCold(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := errors.Join(storev1.AddToScheme(scheme), storagev1.AddToScheme(scheme)); err != nil {
		t.Fatal(err)
	}
	kinds := []string{"StorageClass", "Agent", "Store"}
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 12))
			events, deafEvents := NewEvents(kinds...), NewEvents(kinds...)
			l := &liveCluster{t: t, c: fake.NewClientBuilder().WithScheme(scheme).Build(), events: []*Events{events}}
			kept, deaf := &Kept{Events: events}, &Kept{Events: deafEvents}
			places := placements(map[string]policyv1.Replacement{"c0": policyv1.ReplacementNever, "c1": policyv1.ReplacementNever})
			// The placements name no pool: the pool "" corrects the drift of their classes.
			pools := map[string]*policyv1.StoragePool{"": {Spec: policyv1.StoragePoolSpec{DriftPolicy: policyv1.DriftPolicyCorrect}}}
			// The render: objects by key, in a fixed order.
			var keys []string
			desired := map[string]*unstructured.Unstructured{}
			gen := 0
			render := func(key string) {
				gen++
				kind, name, _ := strings.Cut(key, "/")
				var u *unstructured.Unstructured
				if kind == "StorageClass" {
					u = class(t, name, name, "ext4", map[string]string{"gen": fmt.Sprint(gen % 3)})
				} else {
					u = runtimeObj(kind, name, fmt.Sprintf("n%d", gen%2), map[string]string{"gen": fmt.Sprint(gen % 3)})
					if kind == "Store" && name != "q.a" { // drift of q.a is reported, of the other Stores corrected
						u.Object["spec"].(map[string]any)["driftPolicy"] = "Correct"
					}
				}
				if _, ok := desired[key]; !ok {
					keys = append(keys, key)
				}
				desired[key] = u
			}
			for _, k := range []string{"StorageClass/c0", "StorageClass/c1", "Agent/a", "Agent/b", "Store/p.a", "Store/p.b", "Store/q.a"} {
				render(k)
			}
			prev := inventory.New()
			next := 40
			ops := map[string]int{}
			deafDiffers, coldReads, keptReads := 0, 0, 0
			for step := 0; step < 300; step++ {
				op := "initial"
				if step > 0 {
					key := keys[rng.IntN(len(keys))]
					kind, name, _ := strings.Cut(key, "/")
					switch rng.IntN(10) {
					case 0, 1:
						op = "render anew"
						render(key)
					case 2:
						op = "add"
						next++
						render(fmt.Sprintf("Store/s%d.n", next))
					case 3:
						if len(keys) > 3 {
							op = "drop"
							delete(desired, key)
							keys = slices.DeleteFunc(keys, func(k string) bool { return k == key })
						}
					case 4, 5:
						if l.edit(kind, name, true) {
							op = "drift"
						}
					case 6:
						if l.edit(kind, name, false) {
							op = "relabel"
						}
					case 7:
						if l.remove(kind, name) {
							op = "delete live"
						}
					case 8:
						if e, ok := prev.Get(inventory.Entry{Group: desired[key].GroupVersionKind().Group, Kind: kind, Name: name}.ID()); ok {
							op = "inventory edited"
							if rng.IntN(2) == 0 {
								prev.Remove(e.ID())
							} else {
								e.Digest = "0"
								prev.Put(e)
							}
						}
					}
				}
				ops[op]++
				objs := make([]*unstructured.Unstructured, len(keys))
				for i, k := range keys {
					objs[i] = desired[k]
				}
				in := Input{Desired: objs, Placements: places, Pools: pools, Previous: prev}
				plan := func(k *Kept, gets *int) *Plan {
					t.Helper()
					in := in
					in.Kept = k
					p, err := Make(ctx, in, liveSource{&Cluster{Reader: l.c, Cache: countingCache{l.c, gets}, Kept: k}, l})
					if err != nil {
						t.Fatal(err)
					}
					return p
				}
				cold := planText(plan(nil, &coldReads))
				p := plan(kept, &keptReads)
				if got := planText(p); got != cold {
					t.Fatalf("step %d (%s): the plan with Kept differs from the cold one:\n%s\ncold:\n%s", step, op, got, cold)
				}
				if planText(plan(deaf, new(int))) != cold {
					deafDiffers++
				}
				// Carry the plan out, as the controller does, and record the inventory.
				prev = inventory.New()
				for i := range p.Objects {
					o := &p.Objects[i]
					prev.Put(o.Entry)
					if o.Apply() {
						l.apply(o.Object)
					}
				}
				if inv := p.Inventory(); !inv.Equal(prev) || !maps.Equal(inv.KindCounts(), prev.KindCounts()) {
					t.Fatalf("step %d (%s): Plan.Inventory\n%s\nthe objects' entries\n%s", step, op, inv.Encode(), prev.Encode())
				}
				for _, pr := range p.Prunes {
					l.remove(pr.Entry.Kind, pr.Entry.Name)
				}
				// Agents are always corrected: after the plan, drifted and deleted ones hold
				// the render again.
				for _, k := range keys {
					if u := desired[k]; u.GetKind() == "Agent" {
						if live := l.get("Agent", u.GetName()); live == nil || !drift.Subset(u.Object, live.Object) {
							t.Fatalf("step %d (%s): Agent %s does not hold its render after the plan: %v", step, op, u.GetName(), live)
						}
					}
				}
			}
			for _, op := range []string{"render anew", "add", "drop", "drift", "relabel", "delete live", "inventory edited"} {
				if ops[op] < 10 {
					t.Errorf("only %d steps of %q", ops[op], op)
				}
			}
			// Most objects do not change from one step to the next: the kept plan reads few.
			if keptReads*2 > coldReads {
				t.Errorf("the plan with Kept read the informer cache %d times, the cold one %d: the kept verdicts are not used", keptReads, coldReads)
			}
			if deafDiffers == 0 {
				t.Errorf("a Kept whose Events heard nothing planned as the cold plan at every step: the sequence does not test what events change")
			}
			t.Logf("%v; cache reads: %d kept, %d cold; a deaf Kept differed at %d steps", ops, keptReads, coldReads, deafDiffers)
		})
	}
}
