package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/fencing"
	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// VolumeState reasons besides storev1.ReasonInsufficientCapacity and the
// fencing reasons (defined with the API types: see storev1 for when each surfaces).
const (
	ReasonStoreNotReady = storev1.ReasonStoreNotReady
	ReasonVolumeFailed  = storev1.ReasonVolumeFailed
	ReasonExportFailed  = storev1.ReasonExportFailed
	ReasonFenced        = storev1.ReasonFenced
	ReasonDeleting      = storev1.ReasonDeleting
)

type volumeReconciler struct{ *node }

func (r *volumeReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("volumestate").
		// per volume, bounded: the queue never hands one name to two workers
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.VolumeWorkers}).
		// creation, spec changes (publications bump publicationGeneration and
		// so metadata.generation) and deletion; never the agent's own status writes
		For(&storev1.VolumeState{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// the Store refresh wakes drifted volumes
		WatchesRawSource(source.Channel(r.wake, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

// Reconcile converges one volume: fencing first, then create/expand or
// delete, export, status.
func (r *volumeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var vs storev1.VolumeState
	if err := r.client.Get(ctx, req.NamespacedName, &vs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	deleting := !vs.DeletionTimestamp.IsZero()
	if deleting && !controllerutil.ContainsFinalizer(&vs, FinalizerVolume) {
		return ctrl.Result{}, nil // never acted on, or already released
	}
	if deleting {
		if released, err := r.releaseUntouched(ctx, &vs); released || err != nil {
			return ctrl.Result{}, err
		}
	}
	before := vs.DeepCopy()
	store, err := r.storeOf(ctx, &vs)
	if err != nil {
		if !apierrors.IsNotFound(err) && !errors.Is(err, errOtherNode) {
			return ctrl.Result{}, err
		}
		r.fail(&vs, ReasonStoreNotReady, fmt.Sprintf("store %s is not a store of node %s: %v", vs.Spec.StoreName, r.opts.NodeName, err))
		return r.status(ctx, &vs, before, ctrl.Result{RequeueAfter: r.opts.RefreshInterval})
	}

	unlock, err := r.marks.Lock(ctx, vs.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer unlock()
	mark, found, err := r.marks.Load(vs.Name)
	if err != nil {
		if errors.Is(err, fencing.ErrCorrupt) {
			return r.fenced(ctx, &vs, before, &fencing.Rejection{Reason: fencing.ReasonCorruptMark, Message: err.Error()})
		}
		return ctrl.Result{}, err
	}
	next, err := fencing.Admit(mark, found, fencing.Work{
		UID: string(vs.UID), Generation: vs.Generation, PublicationGeneration: vs.Spec.PublicationGeneration, Deleting: deleting,
		Adopt: found && mark.UID != string(vs.UID) && !mark.Released && r.adopts(ctx, &vs, store),
	})
	var rej *fencing.Rejection
	if errors.As(err, &rej) {
		return r.fenced(ctx, &vs, before, rej)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	apimeta.RemoveStatusCondition(&vs.Status.Conditions, CondFenced)
	if !found || !next.Equal(mark) {
		// durable before acting: a crash after the act still fences older work
		if err := r.marks.Save(vs.Name, next); err != nil {
			return ctrl.Result{}, err
		}
		failpoint.Hit(failpoint.AgentMarkSaved)
	}

	be, err := r.backend(ctx, store, r.runtime(store))
	if err != nil {
		r.fail(&vs, ReasonStoreNotReady, fmt.Sprintf("store %s: %v", store.Name, err))
		return r.status(ctx, &vs, before, ctrl.Result{RequeueAfter: r.opts.RefreshInterval})
	}
	if deleting {
		return r.delete(ctx, &vs, before, be, next)
	}
	if !controllerutil.ContainsFinalizer(&vs, FinalizerVolume) {
		controllerutil.AddFinalizer(&vs, FinalizerVolume)
		if err := r.client.Update(ctx, &vs); err != nil {
			return ctrl.Result{}, err
		}
		before = vs.DeepCopy()
	}
	res, err := r.converge(ctx, &vs, before, store, be, next)
	if err != nil || vs.Status.Phase != storev1.VolumeReady || vs.Status.ObservedGeneration != vs.Generation ||
		(vs.Spec.Move == nil && vs.Status.Move == nil) {
		return res, err
	}
	// the volume is served from spec.storeName: the move's steps build on that
	mres, err := r.move(ctx, &vs)
	if err != nil {
		return mres, err
	}
	if mres.RequeueAfter > 0 && (res.RequeueAfter == 0 || mres.RequeueAfter < res.RequeueAfter) {
		res.RequeueAfter = mres.RequeueAfter
	}
	return res, nil
}

// releaseUntouched releases the finalizer of a deleted VolumeState this agent never acted on:
// no fencing mark names it (a mark is saved before the first act). The CSI controller creates
// VolumeStates with this agent's finalizer already set, so that a new volume costs the agent
// no write of its own before its status; a volume deleted before its agent got to it, or whose
// Store is gone, must not keep it. Reports whether it released it.
func (r *volumeReconciler) releaseUntouched(ctx context.Context, vs *storev1.VolumeState) (bool, error) {
	unlock, err := r.marks.Lock(ctx, vs.Name)
	if err != nil {
		return false, err
	}
	defer unlock()
	if _, found, err := r.marks.Load(vs.Name); found || err != nil {
		return false, nil // acted on (or a corrupt mark, which the fenced path reports)
	}
	controllerutil.RemoveFinalizer(vs, FinalizerVolume)
	if err := r.client.Update(ctx, vs); err != nil && !apierrors.IsNotFound(err) {
		return false, err
	}
	return true, nil
}

// converge creates, expands and exports the volume. Its status is written once, when it
// returns, from what vs holds then; besides, a create that outlasts Options.ProgressAfter
// writes the phase Creating while it runs (progressMark), so a reader sees a slow volume is
// being made, and a fast one costs a single status write.
func (r *volumeReconciler) converge(ctx context.Context, vs *storev1.VolumeState, before *storev1.VolumeState, store *storev1.Store, be backend.Backend, mark fencing.Mark) (res ctrl.Result, err error) {
	defer func() {
		if err == nil {
			res, err = r.status(ctx, vs, before, res)
		}
	}()
	correct := store.Spec.DriftPolicy == policyv1.DriftPolicyCorrect
	specChanged := vs.Generation != vs.Status.ObservedGeneration
	vol, stop, res, err := r.ensureVolume(ctx, vs, &before, store, be, correct)
	if stop {
		return res, err
	}
	grew := vs.Status.ActualBytes != 0 && vol.SizeBytes > vs.Status.ActualBytes
	dev := vol.DevicePath
	if dev == "" {
		if dev, err = be.DevicePath(ctx, vs.Name); err != nil {
			return r.backendFailed(vs, err), nil
		}
	}
	vs.Status.ActualBytes = vol.SizeBytes
	vs.Status.DevicePath = dev

	if isNVMeoF(vs) {
		if stop, res, err := r.ensureExport(ctx, vs, dev, grew, specChanged, correct, mark); stop {
			return res, err
		}
	} else {
		vs.Status.Export = nil
	}

	vs.Status.Phase = storev1.VolumeReady
	vs.Status.ObservedGeneration = vs.Generation
	vs.Status.ObservedPublicationGeneration = vs.Spec.PublicationGeneration
	apimeta.RemoveStatusCondition(&vs.Status.Conditions, CondStalled)
	setCond(&vs.Status.Conditions, vs.Generation, CondDrifted, false, ReasonNoDrift, "kernel matches the declaration")
	setCond(&vs.Status.Conditions, vs.Generation, CondReady, true, ReasonSucceeded,
		fmt.Sprintf("%d bytes at %s", vol.SizeBytes, dev))
	return ctrl.Result{}, nil
}

// ensureVolume makes the backend volume of vs exist at its size: created (or adopted, after a
// crash before the status said so), or read, re-created under driftPolicy Correct, and grown;
// a draining Store makes no new volume. stop is true when converge must return res and err as
// they are: a failure or drift recorded in vs, or an error to retry. before is converge's
// copy of vs as read, which a progress report moves on.
func (r *volumeReconciler) ensureVolume(ctx context.Context, vs *storev1.VolumeState, before **storev1.VolumeState, store *storev1.Store, be backend.Backend, correct bool) (vol backend.Volume, stop bool, res ctrl.Result, err error) {
	if vs.Status.ActualBytes == 0 && !store.IsDraining() {
		// The cached Store may not show yet a drain written before this volume was created:
		// Stores and VolumeStates come through two watches, with no order between them. A
		// volume about to be made reads its Store live, so a drain the API server holds
		// before the volume existed always refuses it.
		var live storev1.Store
		if err := r.reader.Get(ctx, client.ObjectKeyFromObject(store), &live); err != nil {
			return vol, true, ctrl.Result{}, fmt.Errorf("read Store %s: %w", store.Name, err)
		}
		if live.IsDraining() {
			store = &live
		}
	}
	if vs.Status.ActualBytes == 0 && store.IsDraining() {
		// a volume of a crash before the status said so is adopted; no new one is made
		if _, err := be.Get(ctx, vs.Name); errors.Is(err, backend.ErrNotFound) {
			why := fmt.Sprintf("draining (%s)", storev1.AnnotationDraining)
			if store.Spec.Evacuate {
				why = "evacuated (spec.evacuate: its pool lists this node in evacuateNodes)"
			}
			r.fail(vs, storev1.ReasonStoreDraining, fmt.Sprintf("store %s is %s: it keeps the volumes it holds and takes no new one",
				store.Name, why))
			return vol, true, ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil
		}
	}
	if vs.Status.ActualBytes == 0 {
		// not created yet (or a crash before the status said so: Create adopts)
		var progress *progressMark
		if vs.Status.Phase == "" || vs.Status.Phase == storev1.VolumePending {
			progress = r.progressAfter(ctx, vs, *before, storev1.VolumeCreating, nil)
		}
		vol, err = r.timed("create", func() (backend.Volume, error) { return createVolume(ctx, be, vs) })
		if errors.Is(err, backend.ErrAlreadyExists) {
			// a smaller volume of ours under this id: an expansion cut short
			vol, err = r.timed("expand", func() (backend.Volume, error) { return be.Expand(ctx, vs.Name, vs.Spec.CapacityBytes) })
		}
		if err == nil {
			failpoint.Hit(failpoint.AgentVolumeCreated)
			if r.opts.AfterVolumeCreate != nil {
				err = r.opts.AfterVolumeCreate(vs.Name)
				if err != nil {
					if _, perr := progress.end(vs, before); perr != nil {
						return vol, true, ctrl.Result{}, perr
					}
					return vol, true, ctrl.Result{}, err
				}
			}
		}
		if _, perr := progress.end(vs, before); perr != nil {
			return vol, true, ctrl.Result{}, perr
		}
		if err != nil {
			return vol, true, r.backendFailed(vs, err), nil
		}
	} else {
		vol, err = be.Get(ctx, vs.Name)
		var cur *backend.Volume
		if err == nil {
			cur = &vol
		} else if !errors.Is(err, backend.ErrNotFound) {
			return vol, true, r.backendFailed(vs, err), nil
		}
		if d := volumeDrift(vs, cur); d != nil {
			if !correct {
				return vol, true, r.drifted(vs, []storev1.DriftItem{*d}), nil
			}
			ctrl.LoggerFrom(ctx).Info("correcting drift", "volume", vs.Name, "drift", d.Message)
		}
		if cur == nil {
			vol, err = r.timed("create", func() (backend.Volume, error) {
				return be.Create(ctx, vs.Name, max(vs.Spec.CapacityBytes, vs.Status.ActualBytes))
			})
			if err != nil {
				return vol, true, r.backendFailed(vs, err), nil
			}
		}
		if want := max(vs.Spec.CapacityBytes, vs.Status.ActualBytes); vol.SizeBytes < want {
			vs.Status.Phase = storev1.VolumeExpanding
			vol, err = r.timed("expand", func() (backend.Volume, error) { return be.Expand(ctx, vs.Name, want) })
			if err != nil {
				return vol, true, r.backendFailed(vs, err), nil
			}
			failpoint.Hit(failpoint.AgentVolumeExpanded)
		}
	}
	return vol, false, ctrl.Result{}, nil
}

// ensureExport makes the NVMe-oF export of vs (device dev) match its spec: the subsystem,
// its hosts and their DH-HMAC-CHAP keys, written when missing or drifted (restored after a
// reboot under either driftPolicy), its namespace revalidated when the volume grew; it
// records vs.Status.Export and the boot the export was made in (mark). stop is true when
// converge must return res and err as they are.
func (r *volumeReconciler) ensureExport(ctx context.Context, vs *storev1.VolumeState, dev string, grew, specChanged, correct bool, mark fencing.Mark) (stop bool, res ctrl.Result, err error) {
	want, err := exportOf(vs, dev, r.opts.Addrs)
	if err != nil {
		r.fail(vs, ReasonExportFailed, err.Error())
		return true, ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil
	}
	// Hosts without a usable secret stay out of the ACL (never allowed without
	// authentication) while the rest of the export, revocations included, goes ahead;
	// the volume then reports them and its publications stay unobserved.
	auth, secrets, authErr := r.hostAuth(ctx, vs)
	if authErr != nil && !errors.Is(authErr, errAuthSecret) {
		r.fail(vs, ReasonExportFailed, authErr.Error())
		return true, ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil
	}
	if auth != nil {
		want.spec.HostAuth = auth
		want.spec.Hosts = slices.DeleteFunc(want.spec.Hosts, func(h string) bool { _, ok := auth[h]; return !ok })
	}
	var cur *nvmet.Export
	if e, err := r.target.Inspect(ctx, want.spec.NQN); err == nil {
		cur = &e
	} else if !errors.Is(err, nvmet.ErrNotFound) {
		r.fail(vs, ReasonExportFailed, err.Error())
		return true, ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil
	}
	if d := exportDrift(want.spec, cur); d != nil {
		pubChanged := vs.Spec.PublicationGeneration != vs.Status.ObservedPublicationGeneration
		// A whole export missing in a boot other than the one it was made in: the
		// reboot took it (configfs is in memory), nobody removed it. Restored under
		// either driftPolicy, as the LV is activated again.
		rebooted := cur == nil && mark.ExportBootID != r.bootID
		// a host key that differs from its Secret (a rotation) is always written: the
		// Secret is the only record of the key, there is nothing to report it against
		authDrift := d.Reason == DriftAuthDiffers
		if vs.Status.Export != nil && !specChanged && !pubChanged && !correct && !rebooted && !authDrift {
			return true, r.drifted(vs, []storev1.DriftItem{*d}), nil
		}
		if rebooted && vs.Status.Export != nil {
			ctrl.LoggerFrom(ctx).Info("restoring the export after a reboot", "nqn", want.spec.NQN, "exportBootID", mark.ExportBootID, "bootID", r.bootID)
		}
		start := time.Now()
		_, err := r.target.Export(ctx, want.spec)
		OperationDuration.WithLabelValues("export").Observe(time.Since(start).Seconds())
		if err != nil {
			r.fail(vs, ReasonExportFailed, err.Error())
			return true, ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil
		}
		failpoint.Hit(failpoint.AgentExportCreated)
	} else if grew {
		if err := r.target.RevalidateSize(ctx, want.spec.NQN); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "revalidate namespace size", "nqn", want.spec.NQN)
		}
	}
	// the host entries now hold the secrets of these Secrets (written, or found equal)
	r.recordHostKeys(secrets.keyIDs)
	if authErr != nil {
		r.fail(vs, storev1.ReasonAuthSecretMissing, authErr.Error())
		return true, ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil
	}
	vs.Status.Export = &storev1.Export{NQN: want.spec.NQN, Address: want.spec.Endpoint.Address, Port: want.port}
	if mark.ExportBootID != r.bootID {
		mark.ExportBootID = r.bootID
		if err := r.marks.Save(vs.Name, mark); err != nil {
			return true, ctrl.Result{}, fmt.Errorf("record the export's boot: %w", err)
		}
	}
	return false, ctrl.Result{}, nil
}

// delete removes the export, then the volume, releases the mark and only
// then the finalizer. The phase Deleting is written when that outlasts
// Options.ProgressAfter or fails; a fast deletion goes from its phase to gone.
func (r *volumeReconciler) delete(ctx context.Context, vs *storev1.VolumeState, before *storev1.VolumeState, be backend.Backend, mark fencing.Mark) (ctrl.Result, error) {
	var progress *progressMark
	if vs.Status.Phase != storev1.VolumeDeleting {
		progress = r.progressAfter(ctx, vs, before, storev1.VolumeDeleting, func(vs *storev1.VolumeState) {
			setCond(&vs.Status.Conditions, vs.Generation, CondReady, false, ReasonDeleting, "removing export and volume")
		})
	}
	// failed: the phase says so at once (the error alone is only in the log and the retry)
	failed := func(err error) (ctrl.Result, error) {
		if wrote, perr := progress.end(vs, &before); perr != nil {
			return ctrl.Result{}, perr
		} else if !wrote && progress != nil {
			progress.apply(vs)
			if _, perr := r.status(ctx, vs, before, ctrl.Result{}); perr != nil {
				return ctrl.Result{}, perr
			}
		}
		return ctrl.Result{}, err
	}
	if isNVMeoF(vs) || vs.Status.Export != nil {
		nqn, err := nvmet.VolumeNQN(vs.Name)
		if err != nil {
			return failed(err)
		}
		start := time.Now()
		err = r.target.Unexport(ctx, nqn)
		OperationDuration.WithLabelValues("unexport").Observe(time.Since(start).Seconds())
		if err != nil {
			return failed(fmt.Errorf("unexport %s: %w", nqn, err))
		}
		failpoint.Hit(failpoint.AgentDeleteUnexported)
	}
	if st := vs.Status.Move; st != nil && st.Phase != storev1.MoveDone && st.Phase != storev1.MoveFailed {
		// a move cut short by the deletion: its other copy goes too
		other := st.TargetStore
		if vs.Spec.StoreName == st.TargetStore {
			other = st.SourceStore
		}
		if err := r.deleteCopy(ctx, other, vs.Name); err != nil && !apierrors.IsNotFound(err) {
			return failed(fmt.Errorf("delete the move's copy on %s: %w", other, err))
		}
	}
	start := time.Now()
	err := be.Delete(ctx, vs.Name)
	OperationDuration.WithLabelValues("delete").Observe(time.Since(start).Seconds())
	if err != nil {
		return failed(fmt.Errorf("delete volume %s: %w", vs.Name, err))
	}
	failpoint.Hit(failpoint.AgentDeleteVolumeRemoved)
	if _, err := progress.end(vs, &before); err != nil {
		return ctrl.Result{}, err
	}
	if !mark.Released {
		mark.Released = true
		if err := r.marks.Save(vs.Name, mark); err != nil {
			return ctrl.Result{}, err
		}
		failpoint.Hit(failpoint.AgentDeleteMarkReleased)
	}
	controllerutil.RemoveFinalizer(vs, FinalizerVolume)
	if err := r.client.Update(ctx, vs); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

func (r *volumeReconciler) timed(op string, f func() (backend.Volume, error)) (backend.Volume, error) {
	start := time.Now()
	v, err := f()
	OperationDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	return v, err
}

// backendFailed maps a backend error to status: InsufficientCapacity (the
// CSI controller's RESOURCE_EXHAUSTED), ExpansionRefused (its OUT_OF_RANGE) or
// VolumeFailed; all retried at the refresh interval (room may appear: a raw
// partition's neighbour may go). The caller writes the status.
func (r *volumeReconciler) backendFailed(vs *storev1.VolumeState, err error) ctrl.Result {
	reason := ReasonVolumeFailed
	switch {
	case errors.Is(err, backend.ErrInsufficientCapacity):
		reason = storev1.ReasonInsufficientCapacity
	case errors.Is(err, backend.ErrOutOfRange):
		reason = storev1.ReasonExpansionRefused
	}
	if vs.Status.ActualBytes == 0 {
		vs.Status.Phase = storev1.VolumeFailed
	}
	r.fail(vs, reason, err.Error())
	return ctrl.Result{RequeueAfter: r.opts.RefreshInterval}
}

func (r *volumeReconciler) fail(vs *storev1.VolumeState, reason, msg string) {
	setCond(&vs.Status.Conditions, vs.Generation, CondReady, false, reason, msg)
}

// drifted reports drift under driftPolicy Report: Drifted=True with the
// precise message, Ready=False, nothing changed in the kernel.
func (r *volumeReconciler) drifted(vs *storev1.VolumeState, items []storev1.DriftItem) ctrl.Result {
	msg := ""
	for i, d := range items {
		if i > 0 {
			msg += "; "
		}
		msg += d.Message
	}
	setCond(&vs.Status.Conditions, vs.Generation, CondDrifted, true, items[0].Kind+items[0].Reason, msg)
	setCond(&vs.Status.Conditions, vs.Generation, CondReady, false, ReasonDrifted, msg+" (driftPolicy Report: not corrected)")
	return ctrl.Result{}
}

// fenced records a refusal: the counter, a Warning event on the VolumeState, Fenced=True and
// Ready=False with the reason; once written, no retry (newer work arrives as a new event),
// and a write that conflicted is an error (retried).
func (r *volumeReconciler) fenced(ctx context.Context, vs, before *storev1.VolumeState, rej *fencing.Rejection) (ctrl.Result, error) {
	// One refusal is counted and announced once: a reconcile of the same refused generation
	// (after the status write below, a resync or a restart) finds it already reported. It is
	// counted only once the Fenced condition is written: a write that conflicted leaves no
	// record, and the retry refuses and counts it then.
	c := apimeta.FindStatusCondition(before.Status.Conditions, CondFenced)
	reported := c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == vs.Generation && c.Reason == rej.Reason && c.Message == rej.Message
	setCond(&vs.Status.Conditions, vs.Generation, CondFenced, true, rej.Reason, rej.Message)
	setCond(&vs.Status.Conditions, vs.Generation, CondReady, false, ReasonFenced, rej.Reason+": "+rej.Message)
	if r.opts.BeforeFencedStatus != nil {
		r.opts.BeforeFencedStatus(vs.Name)
	}
	// A write that conflicted (another writer changed the object's metadata or status, which
	// bump no generation, so no event reaches this reconciler: GenerationChangedPredicate) is
	// an error: the reconcile is retried with backoff until the refusal is recorded.
	res, err := r.status(ctx, vs, before, ctrl.Result{})
	if err == nil && !reported {
		FencingRejections.WithLabelValues(rej.Reason).Inc()
		r.events.Eventf(vs, nil, corev1.EventTypeWarning, rej.Reason, "Fence", "node %s refused generation %d (publicationGeneration %d): %s",
			r.opts.NodeName, vs.Generation, vs.Spec.PublicationGeneration, rej.Message)
		ctrl.LoggerFrom(ctx).Info("work refused by fencing", "volume", vs.Name, "uid", vs.UID,
			"generation", vs.Generation, "reason", rej.Reason, "message", rej.Message)
	}
	return res, err
}

// progressMark writes a progress phase (Creating, Deleting) to a VolumeState only when the
// work it marks outlasts Options.ProgressAfter: fast work costs no status write of its own.
// A nil *progressMark marks nothing.
type progressMark struct {
	phase storev1.VolumePhase
	// also changes the status beside the phase (the Ready condition of a deletion)
	also  func(*storev1.VolumeState)
	timer *time.Timer
	// done is closed once the write has ended; written holds the VolumeState as the API
	// server returned it, err the write's error. Both are set before done closes.
	done    chan struct{}
	written *storev1.VolumeState
	err     error
}

// progressAfter arms the progress mark of vs (whose last written status is before).
func (r *volumeReconciler) progressAfter(ctx context.Context, vs, before *storev1.VolumeState, phase storev1.VolumePhase, also func(*storev1.VolumeState)) *progressMark {
	p := &progressMark{phase: phase, also: also, done: make(chan struct{})}
	// copies taken now: the reconcile goes on changing vs while the timer runs
	obj, base := vs.DeepCopy(), before.DeepCopy()
	p.apply(obj)
	p.timer = time.AfterFunc(r.opts.ProgressAfter, func() {
		defer close(p.done)
		if _, err := r.status(ctx, obj, base, ctrl.Result{}); err != nil {
			p.err = err
			return
		}
		p.written = obj
	})
	return p
}

// apply sets the mark's phase (and what goes with it) on vs.
func (p *progressMark) apply(vs *storev1.VolumeState) {
	vs.Status.Phase = p.phase
	if p.also != nil {
		p.also(vs)
	}
}

// end disarms the mark, or waits for its write when the timer fired. When it was written, vs
// takes its phase and resourceVersion and *before becomes the written status, so that the
// next status patch builds on it (its optimistic lock names the new version). It reports
// whether the mark was written, and the write's error.
func (p *progressMark) end(vs *storev1.VolumeState, before **storev1.VolumeState) (bool, error) {
	if p == nil || p.timer.Stop() {
		return false, nil
	}
	<-p.done
	if p.err != nil {
		return false, p.err
	}
	// what the reconcile changed on vs meanwhile stays; the mark goes under it
	p.apply(vs)
	vs.ResourceVersion = p.written.ResourceVersion
	*before = p.written.DeepCopy()
	return true, nil
}

// status patches the status when it changed.
func (r *volumeReconciler) status(ctx context.Context, vs, before *storev1.VolumeState, res ctrl.Result) (ctrl.Result, error) {
	if apiEqualStatus(before, vs) {
		return res, nil
	}
	// optimistic lock: never overwrite the status of a newer version
	if err := r.client.Status().Patch(ctx, vs, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	return res, nil
}

func apiEqualStatus(a, b *storev1.VolumeState) bool {
	return equality.Semantic.DeepEqual(a.Status, b.Status)
}
