package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/plinth-storage/plinth/agents/backend"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// FinalizerSnapshot keeps a VolumeSnapshotState until the agent removed the snapshot from the
// backend.
const FinalizerSnapshot = "plinth.dev/snapshot"

// snapshotReconciler takes and removes the snapshots of this node's Stores. Snapshots need no
// fencing mark: their spec is immutable (the CRD refuses a change), so there is no older
// version of the work to refuse, and a snapshot id reused after a deletion finds nothing left,
// because the finalizer is released only after the backend removed the snapshot.
type snapshotReconciler struct{ *node }

func (r *snapshotReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("volumesnapshotstate").
		For(&storev1.VolumeSnapshotState{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// Reconcile takes the snapshot once, or removes it when the object is deleted.
func (r *snapshotReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ss storev1.VolumeSnapshotState
	if err := r.client.Get(ctx, req.NamespacedName, &ss); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	deleting := !ss.DeletionTimestamp.IsZero()
	if deleting && !controllerutil.ContainsFinalizer(&ss, FinalizerSnapshot) {
		return ctrl.Result{}, nil
	}
	before := ss.DeepCopy()
	var store storev1.Store
	err := r.client.Get(ctx, client.ObjectKey{Name: ss.Spec.StoreName}, &store)
	if err == nil && store.Spec.NodeName != r.opts.NodeName {
		err = fmt.Errorf("store %s belongs to node %s: %w", store.Name, store.Spec.NodeName, errOtherNode)
	}
	if err != nil {
		if !apierrors.IsNotFound(err) && !errors.Is(err, errOtherNode) {
			return ctrl.Result{}, err
		}
		setCond(&ss.Status.Conditions, ss.Generation, CondReady, false, ReasonStoreNotReady,
			fmt.Sprintf("store %s is not a store of node %s: %v", ss.Spec.StoreName, r.opts.NodeName, err))
		return r.status(ctx, &ss, before, ctrl.Result{RequeueAfter: r.opts.RefreshInterval})
	}
	be, err := r.backend(ctx, &store, r.runtime(&store))
	if err != nil {
		setCond(&ss.Status.Conditions, ss.Generation, CondReady, false, ReasonStoreNotReady, fmt.Sprintf("store %s: %v", store.Name, err))
		return r.status(ctx, &ss, before, ctrl.Result{RequeueAfter: r.opts.RefreshInterval})
	}
	sn, ok := be.(backend.Snapshotter)
	if deleting {
		if ss.Status.Phase != storev1.SnapshotDeleting {
			ss.Status.Phase = storev1.SnapshotDeleting
			ss.Status.ReadyToUse = false
			setCond(&ss.Status.Conditions, ss.Generation, CondReady, false, ReasonDeleting, "removing the snapshot")
			if _, err := r.status(ctx, &ss, before, ctrl.Result{}); err != nil {
				return ctrl.Result{}, err
			}
		}
		if ok {
			if err := sn.DeleteSnapshot(ctx, ss.Name); err != nil {
				return ctrl.Result{}, fmt.Errorf("delete snapshot %s: %w", ss.Name, err)
			}
		}
		controllerutil.RemoveFinalizer(&ss, FinalizerSnapshot)
		if err := r.client.Update(ctx, &ss); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, nil
	}
	if !ok {
		ss.Status.Phase = storev1.SnapshotFailed
		setCond(&ss.Status.Conditions, ss.Generation, CondReady, false, storev1.ReasonSnapshotUnsupported,
			fmt.Sprintf("the %s backend of store %s takes no snapshots", store.Spec.Backend.Kind(), store.Name))
		return r.status(ctx, &ss, before, ctrl.Result{})
	}
	if ss.Status.ReadyToUse && ss.Status.ObservedGeneration == ss.Generation {
		return ctrl.Result{}, nil // taken once; the spec never changes
	}
	if !controllerutil.ContainsFinalizer(&ss, FinalizerSnapshot) {
		controllerutil.AddFinalizer(&ss, FinalizerSnapshot)
		if err := r.client.Update(ctx, &ss); err != nil {
			return ctrl.Result{}, err
		}
		before = ss.DeepCopy()
	}
	if ss.Status.Phase == "" || ss.Status.Phase == storev1.SnapshotPending {
		ss.Status.Phase = storev1.SnapshotCreating
		if _, err := r.status(ctx, &ss, before, ctrl.Result{}); err != nil {
			return ctrl.Result{}, err
		}
		before = ss.DeepCopy()
	}
	if ss.Spec.Group != "" {
		return r.takeGroup(ctx, &ss, sn, &store)
	}
	snap, err := r.timedSnapshot(func() (backend.Snapshot, error) { return sn.CreateSnapshot(ctx, ss.Name, ss.Spec.SourceVolume) })
	if err != nil {
		reason := snapshotFailureReason(err)
		ss.Status.Phase = storev1.SnapshotFailed
		setCond(&ss.Status.Conditions, ss.Generation, CondReady, false, reason, err.Error())
		return r.status(ctx, &ss, before, ctrl.Result{RequeueAfter: r.opts.RefreshInterval})
	}
	markSnapshotReady(&ss, snap, "")
	return r.status(ctx, &ss, before, ctrl.Result{})
}

// markSnapshotReady records a taken snapshot in ss's status: Ready, its size and creation time,
// and a Ready condition naming it, with more appended to the message (a group member says how
// it was taken).
func markSnapshotReady(ss *storev1.VolumeSnapshotState, snap backend.Snapshot, more string) {
	ss.Status.Phase = storev1.SnapshotReady
	ss.Status.ReadyToUse = true
	ss.Status.SizeBytes = snap.SizeBytes
	if !snap.CreationTime.IsZero() {
		t := metav1.NewTime(snap.CreationTime)
		ss.Status.CreationTime = &t
	}
	ss.Status.ObservedGeneration = ss.Generation
	setCond(&ss.Status.Conditions, ss.Generation, CondReady, true, ReasonSucceeded,
		fmt.Sprintf("snapshot %s of %s, %d bytes%s", snap.Name, ss.Spec.SourceVolume, snap.SizeBytes, more))
}

func (r *snapshotReconciler) timedSnapshot(f func() (backend.Snapshot, error)) (backend.Snapshot, error) {
	start := time.Now()
	s, err := f()
	OperationDuration.WithLabelValues("snapshot").Observe(time.Since(start).Seconds())
	return s, err
}

// status patches the status when it changed, with the optimistic lock of the volume reconciler.
func (r *snapshotReconciler) status(ctx context.Context, ss, before *storev1.VolumeSnapshotState, res ctrl.Result) (ctrl.Result, error) {
	if equality.Semantic.DeepEqual(before.Status, ss.Status) {
		return res, nil
	}
	if err := r.client.Status().Patch(ctx, ss, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	return res, nil
}

// createVolume makes a new volume: empty, or from its content source (a snapshot or a volume
// of the same Store) when the backend can copy; a backend that cannot is ErrUnsupported.
func createVolume(ctx context.Context, be backend.Backend, vs *storev1.VolumeState) (backend.Volume, error) {
	cs := vs.Spec.ContentSource
	if cs == nil {
		return be.Create(ctx, vs.Name, vs.Spec.CapacityBytes)
	}
	sn, ok := be.(backend.Snapshotter)
	if !ok {
		return backend.Volume{}, fmt.Errorf("volume %s from a content source: %w", vs.Name, backend.ErrUnsupported)
	}
	src := cs.Snapshot
	if src == "" {
		src = cs.Volume
	}
	return sn.CreateVolumeFrom(ctx, vs.Name, src, vs.Spec.CapacityBytes)
}

// snapshotFailureReason is the Ready condition's reason for a backend's snapshot error: the
// backend cannot snapshot (Unsupported), the pool is full (InsufficientCapacity), or any other
// failure (SnapshotFailed).
func snapshotFailureReason(err error) string {
	switch {
	case errors.Is(err, backend.ErrUnsupported):
		return storev1.ReasonSnapshotUnsupported
	case errors.Is(err, backend.ErrInsufficientCapacity):
		return storev1.ReasonInsufficientCapacity
	}
	return storev1.ReasonSnapshotFailed
}
