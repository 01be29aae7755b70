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
//     is kept).
//
// Each Make keeps what it used and drops the rest. The zero value is ready; a Kept must not be
// used by two Makes at once.
type Kept struct {
	cur, next map[*unstructured.Unstructured]*kept
}

type kept struct {
	entry    inventory.Entry
	hasEntry bool
	// cache is the informer cache's live object (UID, resourceVersion) and Cached's answer.
	cache      liveVersion
	cacheState CacheState
	// class is the live StorageClass that showed no immutable change.
	class liveVersion
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

// of returns what is kept of u, moved into this call's set (nil on a nil Kept).
func (k *Kept) of(u *unstructured.Unstructured) *kept {
	if k == nil {
		return nil
	}
	if k.next == nil {
		k.cur, k.next = map[*unstructured.Unstructured]*kept{}, map[*unstructured.Unstructured]*kept{}
	}
	if e := k.next[u]; e != nil {
		return e
	}
	e := k.cur[u]
	if e == nil {
		e = &kept{}
	}
	k.next[u] = e
	return e
}

// sweep ends a Make: what it did not use is dropped.
func (k *Kept) sweep() {
	if k == nil || k.next == nil {
		return
	}
	k.cur, k.next = k.next, k.cur
	clear(k.next)
}

// Len is the number of rendered objects kept (for tests and metrics).
func (k *Kept) Len() int {
	if k == nil {
		return 0
	}
	return len(k.cur)
}

// entryOf returns u's inventory entry, kept or computed.
func (k *Kept) entryOf(u *unstructured.Unstructured) (inventory.Entry, error) {
	e := k.of(u)
	if e != nil && e.hasEntry {
		return e.entry, nil
	}
	ent, err := inventory.EntryOf(u)
	if err != nil {
		return inventory.Entry{}, err
	}
	if e != nil {
		e.entry, e.hasEntry = ent, true
	}
	return ent, nil
}
