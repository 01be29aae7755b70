package controlplane

import (
	"maps"
	"net/http"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// WriteCounter counts the write requests (every method but GET and HEAD) that the clients of a
// rest.Config send to one resource, per object name and "METHOD" or "METHOD /subresource",
// failed requests included. It wraps the config's transport, below every client, informer and
// manager built from it, so a test asserts how many API writes a component makes per object.
type WriteCounter struct {
	resource string
	mu       sync.Mutex
	writes   map[string]map[string]int // object name ("" for the collection: a create) → verb → count
}

// NewWriteCounter counts the writes to resource (its plural, e.g. "volumestates").
func NewWriteCounter(resource string) *WriteCounter {
	return &WriteCounter{resource: resource, writes: map[string]map[string]int{}}
}

// Wrap returns a copy of cfg whose requests w counts.
func (w *WriteCounter) Wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodGet && req.Method != http.MethodHead {
				w.count(req.Method, req.URL.Path)
			}
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

// count records a write to path: /apis/<group>/<version>/<resource>[/<name>[/<subresource>]].
func (w *WriteCounter) count(method, path string) {
	_, rest, ok := strings.Cut(path, "/"+w.resource)
	if !ok || (rest != "" && !strings.HasPrefix(rest, "/")) {
		return
	}
	name, sub, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	verb := method
	if sub != "" {
		verb += " /" + sub
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.writes[name] == nil {
		w.writes[name] = map[string]int{}
	}
	w.writes[name][verb]++
}

// Of returns the writes counted so far to the object name ("" for creates, which name the
// collection), verb → count.
func (w *WriteCounter) Of(name string) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.writes[name])
}

// Reset forgets every write counted so far.
func (w *WriteCounter) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = map[string]map[string]int{}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
