package csi

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The API access the informers below need is declared with the controller service
// (csi/controller, controller.go).

// CacheOptions are those of the controller's informer cache over scheme: no object keeps its
// managedFields (nothing here reads them; an Update of a cached object without them leaves
// the server's as they are), and a Node keeps its metadata alone — the controller reads a
// Node's name, labels (topology, spreading, NVMe-oF initiators) and annotations (host NQN,
// attach limit), never its spec or status, which are most of a Node's size.
func CacheOptions(scheme *runtime.Scheme) cache.Options {
	return cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{&corev1.Node{}: {Transform: nodeMetadata}}}
}

// nodeMetadata keeps of a Node its metadata, without managedFields.
func nodeMetadata(in any) (any, error) {
	n, ok := in.(*corev1.Node)
	if !ok { // anything else passes as it is
		return in, nil
	}
	out := &corev1.Node{TypeMeta: n.TypeMeta, ObjectMeta: n.ObjectMeta}
	out.ManagedFields = nil
	return out, nil
}

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
	ca, err := cache.New(d.opts.Config, CacheOptions(d.scheme))
	if err != nil {
		return fmt.Errorf("api cache: %w", err)
	}
	vhub := volume.NewHub[*storev1.VolumeState]()
	inf, err := ca.GetInformer(ctx, &storev1.VolumeState{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("volumestate informer: %w", err)
	}
	if _, err := inf.AddEventHandler(vhub.Handler()); err != nil {
		return err
	}
	shub := volume.NewHub[*storev1.VolumeSnapshotState]()
	sinf, err := ca.GetInformer(ctx, &storev1.VolumeSnapshotState{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("volumesnapshotstate informer: %w", err)
	}
	if _, err := sinf.AddEventHandler(shub.Handler()); err != nil {
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
	d.volumes = &volume.Kind[*storev1.VolumeState]{Name: "VolumeState", New: func() *storev1.VolumeState { return &storev1.VolumeState{} },
		Locks: d.locks, Hub: vhub, Cache: d.kube, Live: d.live, Writer: d.kube, Timeout: d.opts.WaitTimeout}
	d.snapshots = &volume.Kind[*storev1.VolumeSnapshotState]{Name: "VolumeSnapshotState", New: func() *storev1.VolumeSnapshotState { return &storev1.VolumeSnapshotState{} },
		Locks: d.locks, Hub: shub, Cache: d.kube, Live: d.live, Writer: d.kube, Timeout: d.opts.WaitTimeout}
	return nil
}

// followFreezes starts, in node modes with an API config, an informer on the group snapshot
// members that ask for a consumer freeze (label LabelGroupFreeze) and the node service's loop
// that answers them (csi/node/freeze.go).
func (d *Driver) followFreezes(ctx context.Context) error {
	if d.opts.Config == nil {
		return nil
	}
	sel := labels.SelectorFromSet(labels.Set{storev1.LabelGroupFreeze: "true"})
	ca, err := cache.New(d.opts.Config, cache.Options{Scheme: d.scheme,
		ByObject: map[client.Object]cache.ByObject{&storev1.VolumeSnapshotState{}: {Label: sel}}})
	if err != nil {
		return fmt.Errorf("freeze cache: %w", err)
	}
	inf, err := ca.GetInformer(ctx, &storev1.VolumeSnapshotState{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("freeze informer: %w", err)
	}
	kick := func(obj any) {
		if ss, ok := obj.(*storev1.VolumeSnapshotState); ok && ss.Labels[storev1.LabelGroup] != "" {
			d.node.Kick(ss.Labels[storev1.LabelGroup])
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    kick,
		UpdateFunc: func(_, obj any) { kick(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			kick(obj)
		},
	}); err != nil {
		return err
	}
	go func() {
		if err := ca.Start(ctx); err != nil {
			d.log.Error(err, "freeze cache stopped")
		}
	}()
	syncCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if !ca.WaitForCacheSync(syncCtx) {
		return fmt.Errorf("freeze cache did not sync: %w", syncCtx.Err())
	}
	// before the plugin serves: no NodeUnstageVolume of a leftover freeze first
	if err := d.node.ThawLeftovers(ctx, ca); err != nil {
		return err
	}
	go d.node.FollowFreezes(ctx, ca)
	return nil
}
