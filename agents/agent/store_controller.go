package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/driftmetric"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Condition types and reasons the agent writes (defined with the API types: see storev1 for
// when each surfaces).
const (
	CondReady       = storev1.ConditionReady
	CondDrifted     = storev1.ConditionDrifted
	CondStalled     = storev1.ConditionStalled
	CondReconciling = storev1.ConditionReconciling
	CondFenced      = storev1.ConditionFenced

	ReasonDeviceNotEmpty = storev1.ReasonDeviceNotEmpty
	ReasonBackendFailed  = storev1.ReasonBackendFailed
	ReasonDrifted        = storev1.ReasonDrifted
	ReasonNoDrift        = storev1.ReasonNoDrift
	ReasonSucceeded      = storev1.ReasonSucceeded
)

type storeReconciler struct{ *node }

func (r *storeReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("store").
		// creation, spec changes and deletion only: the agent's own status
		// writes do not wake it (the periodic refresh does)
		For(&storev1.Store{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

var (
	driftMu      sync.Mutex
	driftByStore = map[string]map[string]int{}
)

func setCond(conds *[]metav1.Condition, gen int64, typ string, status bool, reason, msg string) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	apimeta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// Reconcile ensures the store's backend, observes it (one vgs+lvs pair for
// LVM), publishes capacity and drift, wakes drifted VolumeStates, and comes
// back after RefreshInterval.
func (r *storeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var s storev1.Store
	if err := r.client.Get(ctx, req.NamespacedName, &s); err != nil {
		if apierrors.IsNotFound(err) {
			r.dropStore(req.Name)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	if s.Spec.NodeName != r.opts.NodeName || !s.DeletionTimestamp.IsZero() {
		r.dropStore(s.Name)
		return ctrl.Result{}, nil
	}
	start := time.Now()
	before := s.DeepCopy()
	st := &s.Status
	st.ObservedGeneration = s.Generation
	now := metav1.Now()
	st.LastHeartbeatTime = &now
	rt := r.runtime(&s)

	drift, vols, capErr := r.refresh(ctx, &s, rt)
	OperationDuration.WithLabelValues("refresh").Observe(time.Since(start).Seconds())
	st.Drift = drift

	var wake []string
	if capErr == nil {
		wake = r.volumeDrift(ctx, &s, rt, vols, &st.Drift)
	}
	setDriftGauge(&s, st.Drift)

	switch {
	case capErr != nil:
		reason := ReasonBackendFailed
		switch {
		case errors.Is(capErr, backend.ErrDeviceNotEmpty):
			reason = ReasonDeviceNotEmpty
			setCond(&st.Conditions, s.Generation, CondStalled, true, reason, capErr.Error())
		case errors.Is(capErr, backend.ErrMissingKernelModule):
			// the pool asks for what this kernel lacks (bcache): no volume, never a plain one
			reason = ReasonMissingKernelModules
			setCond(&st.Conditions, s.Generation, CondStalled, true, reason, capErr.Error())
		}
		setCond(&st.Conditions, s.Generation, CondReady, false, reason, capErr.Error())
		log.Info("store not ready", "store", s.Name, "reason", reason, "error", capErr.Error())
	default:
		apimeta.RemoveStatusCondition(&st.Conditions, CondStalled)
		setCond(&st.Conditions, s.Generation, CondReady, true, ReasonSucceeded, "backend ready, capacity published")
	}
	if len(st.Drift) > 0 {
		var msgs []string
		for _, d := range st.Drift {
			msgs = append(msgs, d.Message)
		}
		setCond(&st.Conditions, s.Generation, CondDrifted, true, ReasonDrifted, strings.Join(msgs, "; "))
	} else {
		setCond(&st.Conditions, s.Generation, CondDrifted, false, ReasonNoDrift, "kernel matches the declaration")
	}
	if err := r.client.Status().Patch(ctx, &s, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("store %s status: %w", s.Name, err)
	}
	for _, name := range wake {
		vs := &storev1.VolumeState{}
		vs.Name = name
		select {
		case r.wake <- event.GenericEvent{Object: vs}:
		default: // queue full: the next refresh wakes it again
		}
	}
	return ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil
}

// refresh ensures and observes the backend and fills the store's capacity.
// It returns the store-level drift, the volumes seen and the error that
// keeps the store from being Ready.
func (r *storeReconciler) refresh(ctx context.Context, s *storev1.Store, rt *storeRuntime) ([]storev1.DriftItem, []backend.Volume, error) {
	be, err := r.backend(ctx, s, rt)
	if err != nil {
		return nil, nil, err
	}
	c, vols, err := observe(ctx, be)
	var drift []storev1.DriftItem
	if errors.Is(err, backend.ErrNotFound) {
		// the VG, thin pool, dataset, directory or disk vanished after it was ensured
		drift = append(drift, storeMissing(s.Spec.Backend, err))
		if s.Spec.DriftPolicy == policyv1.DriftPolicyCorrect {
			rt.mu.Lock()
			rt.ensured = false
			rt.mu.Unlock()
			if be, err = r.backend(ctx, s, rt); err != nil {
				return drift, nil, err
			}
			c, vols, err = observe(ctx, be)
			if err == nil {
				drift = nil
			}
		}
	}
	if err != nil {
		return drift, nil, err
	}
	rt.mu.Lock()
	rt.total = c.TotalBytes
	rt.mu.Unlock()
	reserve, err := policyv1.ReserveBytes(s.Spec.Reserve, c.TotalBytes)
	if err != nil {
		return drift, nil, err
	}
	capacity := storev1.Capacity{
		Total:       c.TotalBytes,
		Allocatable: c.Allocatable(reserve),
		Provisioned: c.ProvisionedBytes,
		Available:   c.Available(reserve, int64(s.Spec.OvercommitPercent)),
		Snapshots:   c.SnapshotBytes,
	}
	s.Status.Capacity = &capacity
	s.Status.CapacityText = &storev1.CapacityText{Total: storev1.HumanBytes(capacity.Total),
		Provisioned: storev1.HumanBytes(capacity.Provisioned), Available: storev1.HumanBytes(capacity.Available)}
	s.Status.ExtentBytes = c.ExtentBytes
	labels := map[string]int64{"total": capacity.Total, "allocatable": capacity.Allocatable, "provisioned": capacity.Provisioned, "available": capacity.Available, "snapshots": capacity.Snapshots}
	for t, v := range labels {
		StoreCapacityBytes.WithLabelValues(s.Name, s.Spec.Pool, t).Set(float64(v))
	}
	if s.Spec.Backend.LVM != nil && s.Spec.Backend.LVM.ThinPool != nil {
		s.Status.Thin = &storev1.ThinUsage{
			DataPercent:     fmt.Sprintf("%.2f", c.DataUsedRatio*100),
			MetadataPercent: fmt.Sprintf("%.2f", c.MetadataUsedRatio*100),
		}
		StoreThinUsedRatio.WithLabelValues(s.Name, "data").Set(c.DataUsedRatio)
		StoreThinUsedRatio.WithLabelValues(s.Name, "metadata").Set(c.MetadataUsedRatio)
	} else {
		s.Status.Thin = nil
	}
	s.Status.Cache = nil
	if c.CacheRatioPercent > 0 {
		s.Status.Cache = &storev1.CacheCapacity{Total: c.CacheTotalBytes, Free: c.CacheFreeBytes, Provisioned: c.CacheProvisionedBytes, RatioPercent: int32(c.CacheRatioPercent)}
		for t, v := range map[string]int64{"cache_total": c.CacheTotalBytes, "cache_free": c.CacheFreeBytes, "cache_provisioned": c.CacheProvisionedBytes} {
			StoreCapacityBytes.WithLabelValues(s.Name, s.Spec.Pool, t).Set(float64(v))
		}
	}
	return drift, vols, nil
}

// volumeDrift compares the volumes and exports of the kernel with the
// store's VolumeStates, appends what differs (and orphans) to drift, and
// returns the VolumeStates whose Drifted condition is out of date.
func (r *storeReconciler) volumeDrift(ctx context.Context, s *storev1.Store, rt *storeRuntime, vols []backend.Volume, drift *[]storev1.DriftItem) []string {
	var list storev1.VolumeStateList
	if err := r.client.List(ctx, &list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "list volume states")
		return nil
	}
	byID := map[string]*backend.Volume{}
	for i := range vols {
		byID[vols[i].ID] = &vols[i]
	}
	var exports map[string]*nvmet.Export
	rt.mu.Lock()
	be := rt.be
	rt.mu.Unlock()
	known := map[string]bool{}
	var wake []string
	for i := range list.Items {
		vs := &list.Items[i]
		// any VolumeState of this node owns its volume: two Stores that share a directory or
		// VG by mistake must not see each other's volumes as orphans (Correct deletes them)
		known[vs.Name] = true
		if vs.Spec.StoreName != s.Name {
			continue
		}
		if !vs.DeletionTimestamp.IsZero() {
			continue
		}
		if be != nil {
			r.stampVolume(ctx, s, be, vs, byID[vs.Name])
		}
		var items []storev1.DriftItem
		if d := volumeDrift(vs, byID[vs.Name]); d != nil {
			items = append(items, *d)
		}
		if isNVMeoF(vs) && vs.Status.Export != nil && vs.Status.DevicePath != "" {
			if exports == nil {
				exports = r.listExports(ctx)
			}
			if want, err := exportOf(vs, vs.Status.DevicePath, r.opts.Addrs); err == nil {
				if d := exportDrift(want.spec, exports[want.spec.NQN]); d != nil {
					items = append(items, *d)
				}
			}
		}
		*drift = append(*drift, items...)
		drifted := apimeta.IsStatusConditionTrue(vs.Status.Conditions, CondDrifted)
		// wake when the condition is out of date, and on every refresh while
		// drift persists under Correct (the volume's reconcile corrects it)
		if (len(items) > 0) != drifted || (len(items) > 0 && s.Spec.DriftPolicy == policyv1.DriftPolicyCorrect) {
			wake = append(wake, vs.Name)
		}
	}
	*drift = append(*drift, r.orphans(ctx, s, rt, vols, known)...)
	s.Status.Unclaimed, s.Status.UnclaimedOmitted = unclaimed(vols, known)
	return wake
}

func (r *storeReconciler) listExports(ctx context.Context) map[string]*nvmet.Export {
	out := map[string]*nvmet.Export{}
	list, err := r.target.List(ctx)
	if err != nil {
		return out // no configfs: every export reads as missing
	}
	for i := range list {
		out[list[i].NQN] = &list[i]
	}
	return out
}

// setDriftGauge publishes plinth_drift_objects{source="kernel"} for this
// node: the count by kind over every store refreshed so far.
func setDriftGauge(s *storev1.Store, items []storev1.DriftItem) {
	driftMu.Lock()
	defer driftMu.Unlock()
	counts := map[string]int{}
	for _, d := range items {
		counts[d.Kind]++
	}
	driftByStore[s.Name] = counts
	total := map[string]int{KindLogicalVolume: 0, KindExport: 0, KindVolumeGroup: 0, KindThinPool: 0, KindDataset: 0, KindDirectory: 0, KindDisk: 0}
	for _, c := range driftByStore {
		for k, v := range c {
			total[k] += v
		}
	}
	for k, v := range total {
		DriftObjects.WithLabelValues(driftmetric.SourceKernel, k).Set(float64(v))
	}
}
