package csi

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	corev1 "k8s.io/api/core/v1"

	"github.com/plinth-storage/plinth/internal/hostkeys"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// hub fans informer events of one kind (VolumeState, VolumeSnapshotState) out to the calls
// waiting on one object by name.
type hub[T client.Object] struct {
	mu   sync.Mutex
	subs map[string]map[chan T]struct{}
}

func newHub[T client.Object]() *hub[T] {
	return &hub[T]{subs: map[string]map[chan T]struct{}{}}
}

func (h *hub[T]) subscribe(name string) (chan T, func()) {
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

// notify hands the newest state (the zero value, nil, = deleted) to each waiter, replacing an
// unread older one.
func (h *hub[T]) notify(name string, obj T) {
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

func (h *hub[T]) handler() toolscache.ResourceEventHandler {
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
				h.notify(n, t)
			}
		},
		UpdateFunc: func(_, obj any) {
			if n, t := get(obj); n != "" {
				h.notify(n, t)
			}
		},
		DeleteFunc: func(obj any) {
			if n, _ := get(obj); n != "" {
				var none T
				h.notify(n, none)
			}
		},
	}
}

// The controller service's API access (kustomize/rbac/csi_controller.yaml grants this and what
// the sidecars need): VolumeStates created by CreateVolume, updated by the publication and
// expansion compare-and-swap, deleted by DeleteVolume, watched by waitVolume; the informers of
// connect on Stores, the policy kinds and Nodes; Nodes read by ControllerPublishVolume.
//
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumestates;volumesnapshotstates,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=stores,verbs=get;list;watch
// +kubebuilder:rbac:groups=policy.plinth.dev,resources=storagepools;protocols;placements,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// connect builds the API clients: in controller modes a cache with informers on the kinds the
// controller reads (synced before Run serves), otherwise a direct client.
func (d *Driver) connect(ctx context.Context) error {
	if d.opts.Config == nil {
		return nil
	}
	direct, err := client.New(d.opts.Config, client.Options{Scheme: d.scheme})
	if err != nil {
		return fmt.Errorf("api client: %w", err)
	}
	d.kube, d.live = direct, direct
	if d.keys == nil {
		ns := d.opts.AuthNamespace
		if ns == "" {
			ns = DefaultAuthNamespace
		}
		d.keys = hostkeys.Secrets{Reader: direct, Namespace: ns}
	}
	if !d.controllerMode() {
		return nil
	}
	ca, err := cache.New(d.opts.Config, cache.Options{Scheme: d.scheme})
	if err != nil {
		return fmt.Errorf("api cache: %w", err)
	}
	d.hub = newHub[*storev1.VolumeState]()
	inf, err := ca.GetInformer(ctx, &storev1.VolumeState{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("volumestate informer: %w", err)
	}
	if _, err := inf.AddEventHandler(d.hub.handler()); err != nil {
		return err
	}
	d.snaps = newHub[*storev1.VolumeSnapshotState]()
	sinf, err := ca.GetInformer(ctx, &storev1.VolumeSnapshotState{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("volumesnapshotstate informer: %w", err)
	}
	if _, err := sinf.AddEventHandler(d.snaps.handler()); err != nil {
		return err
	}
	for _, obj := range []client.Object{&storev1.Store{}, &policyv1.Placement{}, &policyv1.StoragePool{}, &policyv1.Protocol{}, &corev1.Node{}} {
		if _, err := ca.GetInformer(ctx, obj, cache.BlockUntilSynced(false)); err != nil {
			return fmt.Errorf("informer %T: %w", obj, err)
		}
	}
	go func() {
		if err := ca.Start(ctx); err != nil {
			d.log.Error(err, "api cache stopped")
		}
	}()
	syncCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if !ca.WaitForCacheSync(syncCtx) {
		return fmt.Errorf("api cache did not sync: %w", syncCtx.Err())
	}
	d.kube, err = client.New(d.opts.Config, client.Options{Scheme: d.scheme, Cache: &client.CacheOptions{Reader: ca}})
	if err != nil {
		return err
	}
	return nil
}

// waitVolume calls done with the live VolumeState (nil when absent), then with every state the
// informer delivers, until done says finished or fails, or the wait is over (the caller's
// deadline or WaitTimeout). It never polls: between events it sleeps on the informer.
func (d *Driver) waitVolume(ctx context.Context, name string, done func(vs *storev1.VolumeState) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.WaitTimeout)
	defer cancel()
	ch, unsubscribe := d.hub.subscribe(name)
	defer unsubscribe()
	vs := &storev1.VolumeState{}
	if err := d.live.Get(ctx, client.ObjectKey{Name: name}, vs); apierrors.IsNotFound(err) {
		vs = nil
	} else if err != nil {
		return err
	}
	return d.waitOn(ctx, ch, vs, done)
}

// waitOn calls done with obj (the state the caller knows of a VolumeState or
// VolumeSnapshotState, nil when absent), then with every state the informer delivers on ch (a
// subscription taken before obj was read or written), until done says finished or fails, or the
// wait is over (the caller's deadline or timeout). When obj is known, states of another object of the same name (a deleted
// earlier incarnation whose events arrive late) are ignored.
func waitOn[T interface {
	comparable
	client.Object
}](ctx context.Context, timeout time.Duration, ch <-chan T, obj T, done func(T) (bool, error)) error {
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

// waitOn is the generic waitOn for VolumeStates, bounded by WaitTimeout.
func (d *Driver) waitOn(ctx context.Context, ch <-chan *storev1.VolumeState, vs *storev1.VolumeState, done func(vs *storev1.VolumeState) (bool, error)) error {
	return waitOn(ctx, d.opts.WaitTimeout, ch, vs, done)
}
