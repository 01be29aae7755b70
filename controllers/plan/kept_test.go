package plan

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

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
	ea, err := kept.entryOf(a)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := inventory.EntryOf(a); ea != want {
		t.Fatalf("kept entry %+v, want %+v", ea, want)
	}
	// b rendered anew with another spec: a new object, a new digest; the old b is dropped.
	b2 := runtimeObj("Store", "p.b", "c", nil)
	p := plan(a, b2)
	if kept.Len() != 2 || kept.cur[b] != nil {
		t.Fatalf("kept %d objects (old b kept: %v), want a and the new b", kept.Len(), kept.cur[b] != nil)
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
	if got := cl.Cached(ctx, rendered); got != CacheHolds {
		t.Fatalf("Cached = %v, want CacheHolds", got)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(live), live); err != nil {
		t.Fatal(err)
	}
	if k := kept.of(rendered); k.cacheState != CacheHolds || !k.cache.is(versionOfLive(live.UID, live.ResourceVersion)) {
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
