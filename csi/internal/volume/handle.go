package volume

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Object is the pointer type of a kind the layer holds: *VolumeState, *VolumeSnapshotState.
type Object interface {
	comparable
	client.Object
}

// Kind is the controller service's access to the objects of one kind, by name.
type Kind[T Object] struct {
	// Name is the kind's name in messages ("VolumeState").
	Name string
	// New returns an empty object to read into.
	New func() T
	// Locks serialise the operations per name; shared by the kinds of one driver.
	Locks *Locks
	// Hub delivers the informer's events of the kind.
	Hub *Hub[T]
	// Cache reads the informer's copy; Live reads the API server (where freshness matters).
	Cache, Live client.Reader
	// Writer creates, updates and deletes.
	Writer client.Writer
	// Timeout bounds each wait when the caller's context has no earlier deadline.
	Timeout time.Duration
}

// Handle is one operation's hold on one object: its lock, its subscription to the informer's
// events, and State, the object as last read or written (nil: absent, or not read yet).
// Build it with Kind.Open, give it back with Close.
type Handle[T Object] struct {
	// ID is the object's name (a volume or snapshot id).
	ID string
	// State is the object as last read or written; the operation may change it before it
	// writes it. The zero value (nil) means absent or not read.
	State T

	kind        *Kind[T]
	ch          chan T
	release     func()
	unsubscribe func()
}

// Open takes id's lock (ErrBusy while another operation holds it) and subscribes to id's
// events, before any read or write: the agent's answer cannot slip between them and a wait.
// It reads nothing; State is nil until ReadLive, ReadCached or the caller sets it.
func (k *Kind[T]) Open(id string) (*Handle[T], error) {
	release, err := k.Locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	ch, unsubscribe := k.Hub.Subscribe(id)
	return &Handle[T]{ID: id, kind: k, ch: ch, release: release, unsubscribe: unsubscribe}, nil
}

// OpenLive is Open followed by ReadLive; on error nothing stays held.
func (k *Kind[T]) OpenLive(ctx context.Context, id string) (*Handle[T], error) {
	h, err := k.Open(id)
	if err != nil {
		return nil, err
	}
	if err := h.ReadLive(ctx); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// Close ends the subscription and gives the lock back.
func (h *Handle[T]) Close() {
	h.unsubscribe()
	h.release()
}

// Exists reports whether State holds an object.
func (h *Handle[T]) Exists() bool {
	var none T
	return h.State != none
}

// ReadLive reads the object from the API server into State (nil when it does not exist);
// ErrUnavailable when the API server cannot answer.
func (h *Handle[T]) ReadLive(ctx context.Context) error {
	obj, err := h.kind.read(ctx, h.kind.Live, h.ID)
	if err != nil {
		return err
	}
	h.State = obj
	return nil
}

// ReadCached reads the informer's copy into State (nil when the cache has none: absent, or
// not seen yet); ErrUnavailable when the cache cannot answer.
func (h *Handle[T]) ReadCached(ctx context.Context) error {
	obj, err := h.kind.read(ctx, h.kind.Cache, h.ID)
	if err != nil {
		return err
	}
	h.State = obj
	return nil
}

// Create creates obj (named ID) and makes it State: the wait's starting state, no read after
// the write. Errors are the API client's, for the caller to judge (AlreadyExists: another
// replica won the race).
func (h *Handle[T]) Create(ctx context.Context, obj T) error {
	if err := h.kind.Writer.Create(ctx, obj); err != nil {
		return err
	}
	h.State = obj
	return nil
}

// Update writes State; its metadata.resourceVersion makes the write a compare-and-swap
// (Conflict when another writer came first). Errors are the API client's.
func (h *Handle[T]) Update(ctx context.Context) error {
	return h.kind.Writer.Update(ctx, h.State)
}

// Delete deletes the object by name, whatever State holds. Errors are the API client's
// (NotFound: gone already).
func (h *Handle[T]) Delete(ctx context.Context) error {
	obj := h.kind.New()
	obj.SetName(h.ID)
	return h.kind.Writer.Delete(ctx, obj)
}

// Cached reports whether the informer cache still holds the object; an error other than
// NotFound counts as held.
func (h *Handle[T]) Cached(ctx context.Context) bool {
	err := h.kind.Cache.Get(ctx, client.ObjectKey{Name: h.ID}, h.kind.New())
	return !apierrors.IsNotFound(err)
}

// Get reads object id from the API server without a lock; nil when it does not exist,
// ErrUnavailable when the API server cannot answer.
func (k *Kind[T]) Get(ctx context.Context, id string) (T, error) {
	return k.read(ctx, k.Live, id)
}

func (k *Kind[T]) read(ctx context.Context, r client.Reader, id string) (T, error) {
	var none T
	obj := k.New()
	if err := r.Get(ctx, client.ObjectKey{Name: id}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return none, nil
		}
		return none, Errorf(ErrUnavailable, "read %s %s: %w", k.Name, id, err)
	}
	return obj, nil
}

// WaitFrom calls done with start (the state the operation knows, read or written after Open),
// then with every state the informer delivers, until done says finished or fails, or the wait
// is over (the caller's deadline or Kind.Timeout: a context error). States of another object
// of the same name (a deleted earlier incarnation whose events arrive late) are ignored once
// start is known. Errors are done's or the context's, unclassified (see WaitError).
func (h *Handle[T]) WaitFrom(ctx context.Context, start T, done func(T) (bool, error)) error {
	return waitOn(ctx, h.kind.Timeout, h.ch, start, done)
}

// Wait is WaitFrom the object's current state: it reads it from the API server first (the
// read counts against the wait; nil when absent), having dropped the events delivered before.
// State is left as it was.
func (h *Handle[T]) Wait(ctx context.Context, done func(T) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, h.kind.Timeout)
	defer cancel()
	select {
	case <-h.ch:
	default:
	}
	return h.kind.waitLive(ctx, h.ch, h.ID, done)
}

// Watch waits on object id without a lock, as Handle.Wait does: it subscribes, reads the
// object from the API server, and calls done with it and every later state.
func (k *Kind[T]) Watch(ctx context.Context, id string, done func(T) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, k.Timeout)
	defer cancel()
	ch, unsubscribe := k.Hub.Subscribe(id)
	defer unsubscribe()
	return k.waitLive(ctx, ch, id, done)
}

func (k *Kind[T]) waitLive(ctx context.Context, ch <-chan T, id string, done func(T) (bool, error)) error {
	var none T
	obj := k.New()
	if err := k.Live.Get(ctx, client.ObjectKey{Name: id}, obj); apierrors.IsNotFound(err) {
		obj = none
	} else if err != nil {
		return err
	}
	return waitOn(ctx, k.Timeout, ch, obj, done)
}

// waitOn calls done with obj (nil when absent), then with every state delivered on ch (a
// subscription taken before obj was read or written), until done says finished or fails, or
// the wait is over (ctx, or timeout). When obj is known, states of another object of the same
// name are ignored.
func waitOn[T Object](ctx context.Context, timeout time.Duration, ch <-chan T, obj T, done func(T) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var none T
	var uid types.UID
	if obj != none {
		uid = obj.GetUID()
	}
	for {
		ok, err := done(obj)
		if err != nil || ok {
			return err
		}
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case obj = <-ch:
			}
			if obj == none || uid == "" || obj.GetUID() == uid {
				break
			}
		}
	}
}
