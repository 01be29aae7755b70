package plan

import (
	"context"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/plinth-storage/plinth/controllers/inventory"
)

// Kept is what plans keep between calls of Make about rendered objects that did not change, so
// a plan after one policy edit does not encode, hash and compare again the tens of thousands of
// objects it did not touch. It is keyed by the rendered object's pointer: the caller hands Make
// the same *unstructured.Unstructured for an object whose render did not change and a new one
// for an object rendered anew (render.Renderer.Unstructured does), and never modifies an
// object it handed over. It keeps, per rendered object:
//   - its inventory entry (the digest of its JSON encoding);
//   - for Cluster.Cached, the live object's UID and resourceVersion in the informer cache with
//     the answer (CacheHolds or CacheDiffers) they gave: the answer depends only on the render
//     and the live object, and the API server gives every write of an object a new
//     resourceVersion, so the same pair gives the same answer;
//   - for a StorageClass, the live class's UID and resourceVersion that showed no immutable
//     field change: while the informer cache holds that version, the class is not read from
//     the API server again (with a Source that has no cache, it is, and only the comparison
//     is kept);
//   - whether the last plan found it Unchanged without a dry-run (the inventory records its
//     digest, the informer cache holds every field it sets, and for a StorageClass no
//     immutable field changes). With Events covering its kind, such an object is Unchanged
//     again, with no cache read, while no informer event named its live object since that
//     plan and the inventory still records its digest: a drift, a deletion or any other write
//     to the live object reaches the informer as an event, and the next plan compares it.
//
// With Kept, Plan.Rendered and Plan.Objects are kept too and reused by the next Make: they are
// valid, and Rendered is not to be modified, until then.
//
// Each Make keeps what it used and drops the rest; a Make that fails drops everything. The
// zero value is ready; a Kept must not be used by two Makes at once.
type Kept struct {
	// Events, when set, says which live objects changed since the last Make (see Events).
	Events *Events

	objs map[*unstructured.Unstructured]*kept
	pass uint64
	// rendered is the Rendered inventory of the last Make.
	rendered *inventory.Inventory
	// events are the Events the unchanged verdicts were found under: another one (or none)
	// knows nothing of what changed since, so no verdict is trusted.
	events *Events
	// dirty are the "Kind/name" of the live objects this Make's Events named.
	dirty map[string]struct{}
	// added are the objects this Make saw first: their entries enter rendered once the
	// dropped ones left it (an object rendered anew keeps its name).
	added []*kept
	// stamped counts the kept objects this Make saw: all of them means nothing to drop.
	stamped int
	// buf holds the Objects of the last plan, bufLen of them.
	buf    []Object
	bufLen int
}

type kept struct {
	pass uint64
	// key is "Kind/name" and id the inventory ID; entry is the inventory entry and hasEntry
	// says it is computed.
	key, id  string
	entry    inventory.Entry
	hasEntry bool
	// cache is the informer cache's live object (UID, resourceVersion) and Cached's answer.
	cache      liveVersion
	cacheState CacheState
	// class is the live StorageClass that showed no immutable change.
	class liveVersion
	// unchanged is set when the last plan found the object Unchanged without a dry-run.
	unchanged bool
}

// versionCache is a Source that can say, from an informer cache, which version of a rendered
// object's live copy it holds (Cluster).
type versionCache interface {
	cachedVersion(ctx context.Context, u *unstructured.Unstructured) (liveVersion, bool)
}

// liveVersion is a live object's UID and resourceVersion; the zero value matches nothing.
type liveVersion struct{ uid, resourceVersion string }

func versionOfLive(uid types.UID, rv string) liveVersion { return liveVersion{string(uid), rv} }

func (v liveVersion) is(o liveVersion) bool {
	return v.uid != "" && v.resourceVersion != "" && v == o
}

// begin starts a Make: a new pass, and the live objects Events named since the last one.
func (k *Kept) begin() {
	if k == nil {
		return
	}
	k.pass++
	k.added = k.added[:0]
	k.stamped = 0
	k.dirty = nil
	if k.Events != nil {
		k.dirty = k.Events.take()
	}
	if k.Events != k.events {
		// Verdicts found under other Events (or none) cannot tell what changed since.
		for _, e := range k.objs {
			e.unchanged = false
		}
		k.events = k.Events
	}
}

// of returns what is kept of u, stamped with this Make's pass (nil on a nil Kept).
func (k *Kept) of(u *unstructured.Unstructured) *kept {
	if k == nil {
		return nil
	}
	if k.objs == nil {
		k.objs = map[*unstructured.Unstructured]*kept{}
	}
	e := k.objs[u]
	if e == nil {
		e = &kept{key: u.GetKind() + "/" + u.GetName()}
		k.objs[u] = e
		k.added = append(k.added, e)
	}
	if e.pass != k.pass {
		e.pass = k.pass
		k.stamped++
	}
	return e
}

// lookup returns what is kept of u, nil when nothing is (a nil Kept, an object the plan made
// itself such as a StorageClass with its live immutable fields).
func (k *Kept) lookup(u *unstructured.Unstructured) *kept {
	if k == nil {
		return nil
	}
	return k.objs[u]
}

// trusted reports whether e's unchanged verdict still holds without a read: no event named
// the live object of its key since the verdict was found.
func (k *Kept) trusted(e *kept) bool {
	if !e.unchanged {
		return false
	}
	if len(k.dirty) == 0 {
		return true
	}
	_, dirty := k.dirty[e.key]
	return !dirty
}

// setUnchanged records that the plan found e (of kind) Unchanged without a dry-run: a verdict
// the next plan trusts only when Events covers the kind.
func (k *Kept) setUnchanged(e *kept, kind string) {
	e.unchanged = k.Events.Covers(kind)
}

// objects returns the buffer a Make fills with the plan's Objects: the last plan's, reused
// (its Objects are valid until the next Make), or a new one of room n.
func (k *Kept) objects(n int) []Object {
	if k == nil {
		return make([]Object, 0, n)
	}
	if cap(k.buf) < n {
		k.buf = make([]Object, 0, n+n/8)
	}
	return k.buf[:0]
}

// keepObjects keeps the Objects a Make filled as the next one's buffer, clearing what the
// last plan left beyond them (no pointers kept into objects no longer rendered).
func (k *Kept) keepObjects(objs []Object) {
	if k == nil {
		return
	}
	if len(objs) < k.bufLen && cap(objs) >= k.bufLen {
		clear(objs[len(objs):k.bufLen])
	}
	k.buf, k.bufLen = objs[:0], len(objs)
}

// sweep ends a Make: what it did not use is dropped, from the kept objects and from the kept
// Rendered inventory, and the objects it saw first enter that inventory. It returns that
// inventory.
func (k *Kept) sweep(desired []*unstructured.Unstructured) *inventory.Inventory {
	if k.rendered == nil {
		k.rendered = inventory.WithCapacity(len(k.objs))
	}
	if k.stamped < len(k.objs) { // some were not rendered again
		for u, e := range k.objs {
			if e.pass != k.pass {
				delete(k.objs, u)
				if e.hasEntry {
					k.rendered.Remove(e.id)
				}
			}
		}
	}
	for _, e := range k.added {
		k.rendered.Put(e.entry)
	}
	k.added = k.added[:0]
	if k.rendered.Len() != len(k.objs) {
		// Two rendered objects of one ID (not from a Renderer): rebuilt as without Kept,
		// the later one wins.
		k.rendered = inventory.WithCapacity(len(desired))
		for _, u := range desired {
			k.rendered.Put(k.objs[u].entry)
		}
	}
	return k.rendered
}

// reset drops everything kept (after a Make that failed half way).
func (k *Kept) reset() {
	if k != nil {
		*k = Kept{Events: k.Events, pass: k.pass, events: k.events}
	}
}

// Len is the number of rendered objects kept (for tests and metrics).
func (k *Kept) Len() int {
	if k == nil {
		return 0
	}
	return len(k.objs)
}

// entryOf returns u's inventory entry, kept in e or computed (e may be nil: nothing kept).
func (e *kept) entryOf(u *unstructured.Unstructured) (inventory.Entry, error) {
	if e != nil && e.hasEntry {
		return e.entry, nil
	}
	ent, err := inventory.EntryOf(u)
	if err != nil {
		return inventory.Entry{}, err
	}
	if e != nil {
		e.entry, e.hasEntry, e.id = ent, true, ent.ID()
	}
	return ent, nil
}
