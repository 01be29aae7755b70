package volume

import (
	"sync"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Hub fans informer events of one kind (VolumeState, VolumeSnapshotState) out to the calls
// waiting on one object by name.
type Hub[T client.Object] struct {
	mu   sync.Mutex
	subs map[string]map[chan T]struct{}
}

// NewHub returns an empty Hub; Handler connects it to an informer.
func NewHub[T client.Object]() *Hub[T] {
	return &Hub[T]{subs: map[string]map[chan T]struct{}{}}
}

// Subscribe returns a channel that holds the newest state of object name the informer
// delivered since (nil: deleted), and the function that ends the subscription.
func (h *Hub[T]) Subscribe(name string) (chan T, func()) {
	ch := make(chan T, 1)
	h.mu.Lock()
	if h.subs[name] == nil {
		h.subs[name] = map[chan T]struct{}{}
	}
	h.subs[name][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[name], ch)
		if len(h.subs[name]) == 0 {
			delete(h.subs, name)
		}
		h.mu.Unlock()
	}
}

// Notify hands the newest state (the zero value, nil, = deleted) to each waiter, replacing an
// unread older one.
func (h *Hub[T]) Notify(name string, obj T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[name] {
		select {
		case ch <- obj:
		default:
			select {
			case <-ch:
			default:
			}
			ch <- obj
		}
	}
}

// Handler is the informer event handler that feeds the hub.
func (h *Hub[T]) Handler() toolscache.ResourceEventHandler {
	get := func(obj any) (string, T) {
		var none T
		switch o := obj.(type) {
		case T:
			return o.GetName(), o
		case toolscache.DeletedFinalStateUnknown:
			if t, ok := o.Obj.(T); ok {
				return t.GetName(), none
			}
		}
		return "", none
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, t := get(obj); n != "" {
				h.Notify(n, t)
			}
		},
		UpdateFunc: func(_, obj any) {
			if n, t := get(obj); n != "" {
				h.Notify(n, t)
			}
		},
		DeleteFunc: func(obj any) {
			if n, _ := get(obj); n != "" {
				var none T
				h.Notify(n, none)
			}
		},
	}
}
