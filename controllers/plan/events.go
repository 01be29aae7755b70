package plan

import "sync"

// Events collects which live objects an informer cache reported a change of — added,
// updated or deleted — since the last plan took them, so that a plan with Kept does not read
// the cache for a rendered object no event names: while the informer delivered no event for
// an object, its cached copy is the one the last plan compared (see Kept).
//
// It covers only the kinds it was made for (NewEvents); objects of other kinds are read as
// before. The caller feeds it from the informer's event handlers, every event of a covered
// kind and unfiltered (a predicate that drops status-only or label-only updates from the
// reconcile queue must not drop them here), and must call Changed before it enqueues the
// reconcile the event triggers: the plan of that reconcile then sees it. Safe for concurrent
// use.
type Events struct {
	mu    sync.Mutex
	kinds map[string]bool
	keys  map[string]struct{} // "Kind/name"
	spare map[string]struct{}
}

// NewEvents returns an empty Events for the kinds (such as "StorageClass", "Agent", "Store")
// whose informers feed it.
func NewEvents(kinds ...string) *Events {
	e := &Events{kinds: map[string]bool{}, keys: map[string]struct{}{}, spare: map[string]struct{}{}}
	for _, k := range kinds {
		e.kinds[k] = true
	}
	return e
}

// Changed records that the live object kind/name was added, updated or deleted.
func (e *Events) Changed(kind, name string) {
	e.mu.Lock()
	e.keys[kind+"/"+name] = struct{}{}
	e.mu.Unlock()
}

// Len is the number of live objects named since the last plan took them (for tests and
// metrics).
func (e *Events) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.keys)
}

// Covers reports whether informer events of kind are fed to e.
func (e *Events) Covers(kind string) bool { return e != nil && e.kinds[kind] }

// take returns the keys recorded since the last take; the map is valid until the next take.
func (e *Events) take() map[string]struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	keys := e.keys
	clear(e.spare)
	e.keys, e.spare = e.spare, keys
	return keys
}
