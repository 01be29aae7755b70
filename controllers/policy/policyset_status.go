package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The status of the policy objects, computed by small pure functions from what a reconcile
// recorded (outcome, scope) and written by writeStatus, once per reconcile.

// writeStatus sets every policy object's status from what the reconcile recorded, emits its
// events and condition metrics, and patches it; nothing is sent for an object whose status did
// not change.
func (r *Reconciler) writeStatus(ctx context.Context, s *scope) error {
	var errs []error
	PolicyCondition.Reset()
	setMsg := setInvalidMessage(s)
	quiet := setWaiting(s)
	var stores poolStores
	if s.rendered != nil && s.complete {
		stores = indexPoolStores(s.rendered, s.stores)
	}
	for _, p := range s.objs {
		setObserved(p, s.inUse)
		setReady(p, s, setMsg)
		if !s.setInvalid {
			setDrifted(p, p.out.drifted, p.out.corrected)
		}
		setSynced(p.setter, p.out.sync)
		if pool, ok := p.obj.(*policyv1.StoragePool); ok && s.rendered != nil && s.complete {
			setPoolStatus(pool, stores)
		}
		r.emitTransition(p, quiet)
		r.emitOutcome(p)
		for _, c := range p.status.Conditions {
			setConditionMetric(p.kind, p.obj.GetName(), c)
		}
		if err := kerrors.FilterOut(r.patch(ctx, p), apierrors.IsNotFound); err != nil {
			// An object deleted meanwhile needs no status.
			errs = append(errs, fmt.Errorf("patch %s: %w", p.key(), err))
		}
	}
	return errors.Join(errs...)
}

// setObserved records the generation acted on and, on a Placement, its finalizer, its
// StorageClass and the class's PVC count.
func setObserved(p *policyObject, inUse map[string]int) {
	p.status.ObservedGeneration = p.obj.GetGeneration()
	pl, ok := p.obj.(*policyv1.Placement)
	if !ok {
		return
	}
	controllerutil.AddFinalizer(pl, policyv1.FinalizerInUse)
	p.status.StorageClass = pl.Spec.StorageClass.Name
	if n, ok := inUse[pl.Spec.StorageClass.Name]; ok {
		n32 := int32(n)
		p.status.InUseBy = &n32
	}
}

// setReady sets Ready, Reconciling and Stalled: the object's own problems stall it; a problem
// elsewhere in the set, a failed write or a replacement in progress keep it reconciling; a
// replacement its policy forbids stalls it; otherwise it is Ready.
func setReady(p *policyObject, s *scope, setMsg string) {
	o := &p.out
	switch {
	case len(o.invalid) > 0:
		markStalled(p.setter, ReasonInvalidPolicy, strings.Join(o.invalid, "\n"))
	case s.setInvalid:
		markReconciling(p.setter, ReasonPolicySetInvalid, setMsg)
	case len(o.applyErrs) > 0:
		msgs := make([]string, len(o.applyErrs))
		for i, err := range o.applyErrs {
			msgs[i] = err.Error()
		}
		markReconciling(p.setter, ReasonApplyFailed, strings.Join(msgs, "; "))
	case o.replacementRequired != "":
		markStalled(p.setter, ReasonReplacementRequired, o.replacementRequired)
	case o.replacing != "":
		markReconciling(p.setter, ReasonReplacementInProgress, o.replacing)
	default:
		markReady(p.setter, ReasonApplied, readyMessage(p, s.inUse))
		p.status.LastAppliedRevision = o.revision
		if s.rendered != nil {
			p.status.Produced = sortRefs(o.produced)
		}
	}
}

// markStalled: Ready False and Stalled, no Reconciling (nothing changes until the policy does).
func markStalled(obj conditions.Setter, reason, msg string) {
	conditions.MarkFalse(obj, meta.ReadyCondition, reason, "%s", msg)
	conditions.MarkStalled(obj, reason, "%s", msg)
	conditions.Delete(obj, meta.ReconcilingCondition)
}

// markReconciling: Ready False and Reconciling, no Stalled (the controller retries or waits).
func markReconciling(obj conditions.Setter, reason, msg string) {
	conditions.MarkFalse(obj, meta.ReadyCondition, reason, "%s", msg)
	conditions.MarkReconciling(obj, reason, "%s", msg)
	conditions.Delete(obj, meta.StalledCondition)
}

// markReady: Ready True, neither Stalled nor Reconciling.
func markReady(obj conditions.Setter, reason, msg string) {
	conditions.MarkTrue(obj, meta.ReadyCondition, reason, "%s", msg)
	conditions.Delete(obj, meta.StalledCondition)
	conditions.Delete(obj, meta.ReconcilingCondition)
}

// setInvalidMessage is the PolicySetInvalid message: which objects have problems, and the
// problems that name no object.
func setInvalidMessage(s *scope) string {
	var keys []string
	if len(s.setProblems) > 0 {
		keys = append(keys, "")
	}
	for _, p := range s.objs {
		if len(p.out.invalid) > 0 {
			keys = append(keys, p.key())
		}
	}
	sort.Strings(keys)
	msg := "not applied: the policy set has problems in " + strings.Join(keys, ", ")
	if len(s.setProblems) > 0 {
		msg += ": " + strings.Join(s.setProblems, "; ")
	}
	return msg
}

// setWaiting reports whether every problem of an invalid set is a reference to a policy
// object not in the set yet: the set waits for the rest of a sync, which is no warning.
func setWaiting(s *scope) bool {
	if !s.setInvalid || len(s.setProblems) > 0 {
		return false
	}
	waiting := false
	for _, p := range s.objs {
		if len(p.out.invalid) == 0 {
			continue
		}
		if len(p.out.waitingFor) == 0 {
			return false
		}
		waiting = true
	}
	return waiting
}

func readyMessage(p *policyObject, inUse map[string]int) string {
	msg := ""
	switch p.kind {
	case "Placement":
		pl := p.obj.(*policyv1.Placement)
		msg = "StorageClass " + pl.Spec.StorageClass.Name + " applied"
		if n := inUse[pl.Spec.StorageClass.Name]; n > 0 {
			msg += fmt.Sprintf(", in use by %d PVCs", n)
		}
	case "StoragePool":
		msg = fmt.Sprintf("%d objects applied", len(p.out.produced))
	default:
		msg = fmt.Sprintf("used by %d StorageClasses", len(p.out.produced))
	}
	if m := p.out.replaced; m != "" {
		msg += "; " + m
	}
	if rev := p.out.revision; rev != "" {
		msg += "; revision " + rev
	}
	return msg
}

// setSynced sets Synced from what the sync tool said (rev); nil (it could not be read) keeps
// the condition as it was, no sync tool removes it.
func setSynced(obj conditions.Setter, rev *syncRevision) {
	switch {
	case rev == nil:
	case rev.tool == "":
		conditions.Delete(obj, SyncedCondition)
	case rev.refused != "":
		applied := rev.applied
		if applied == "" {
			applied = "none"
		}
		msg := fmt.Sprintf("revision %s is applied; newer revision %s was not: %s refused it", applied, rev.refused, rev.tool)
		if rev.why != "" {
			msg += ": " + rev.why
		}
		conditions.MarkFalse(obj, SyncedCondition, ReasonRevisionRefused, "%s", msg)
	case rev.applied == "":
		conditions.MarkUnknown(obj, SyncedCondition, ReasonRevisionPending, "%s has applied no revision yet", rev.tool)
	default:
		conditions.MarkTrue(obj, SyncedCondition, ReasonRevisionApplied, "revision %s applied by %s", rev.applied, rev.tool)
	}
}

// setDrifted sets Drifted from the drift found and corrected in this reconcile.
func setDrifted(p *policyObject, drifted, corrected []drift.Item) {
	switch {
	case len(drifted) > 0:
		conditions.MarkTrue(p.setter, DriftedCondition, ReasonDriftDetected, "%s (driftPolicy Report: not corrected)", drift.Summary(drifted, 10))
	case len(corrected) > 0:
		conditions.MarkFalse(p.setter, DriftedCondition, ReasonDriftCorrected, "corrected %s", drift.Summary(corrected, 10))
	default:
		c := conditions.Get(p.setter, DriftedCondition)
		if c != nil && c.Reason == ReasonDriftCorrected && c.ObservedGeneration == p.obj.GetGeneration() {
			return // keep saying what was last corrected until the policy changes
		}
		conditions.MarkFalse(p.setter, DriftedCondition, ReasonNoDrift, "no drift")
	}
}

// poolStores indexes, by StoragePool name, how many Stores the render has for each pool and
// the live Stores among them, so the status of every pool is filled in one pass over the
// Stores (3,334 pools over 33,340 Stores: not a pass per pool).
type poolStores struct {
	rendered map[string]int
	live     map[string][]*storev1.Store
	// evacuated are the names of the rendered Stores with spec.evacuate, by pool, sorted.
	evacuated map[string][]string
}

// indexPoolStores indexes the rendered Stores and the live stores by pool: a live Store counts
// for the pool whose rendered Store has its name.
func indexPoolStores(rendered *render.Output, stores []storev1.Store) poolStores {
	idx := poolStores{rendered: map[string]int{}, live: map[string][]*storev1.Store{}, evacuated: map[string][]string{}}
	poolOf := make(map[string]string, len(rendered.Stores))
	for i := range rendered.Stores {
		s := &rendered.Stores[i]
		if _, dup := poolOf[s.Name]; !dup {
			idx.rendered[s.Spec.Pool]++
			if s.Spec.Evacuate {
				idx.evacuated[s.Spec.Pool] = append(idx.evacuated[s.Spec.Pool], s.Name)
			}
		}
		poolOf[s.Name] = s.Spec.Pool
	}
	for _, names := range idx.evacuated {
		sort.Strings(names)
	}
	for i := range stores {
		if p, ok := poolOf[stores[i].Name]; ok {
			idx.live[p] = append(idx.live[p], &stores[i])
		}
	}
	return idx
}

// setPoolStatus fills matchedNodes, capacity and StoresReady from the render's and the live
// Stores of pool (idx).
func setPoolStatus(pool *policyv1.StoragePool, idx poolStores) {
	want := idx.rendered[pool.Name]
	n := int32(want)
	pool.Status.MatchedNodes = &n
	capacity := &policyv1.PoolCapacity{}
	var notReady []string
	ready := 0
	for _, s := range idx.live[pool.Name] {
		if c := s.Status.Capacity; c != nil {
			capacity.Total += c.Total
			capacity.Allocatable += c.Allocatable
			capacity.Provisioned += c.Provisioned
			capacity.Available += c.Available
			capacity.ReportingStores++
		}
		if conditions.IsReady(s) {
			ready++
		} else {
			notReady = append(notReady, s.Name)
		}
	}
	pool.Status.Capacity = capacity
	sort.Strings(notReady)
	setStoresReady(pool, want, ready, capacity.ReportingStores, notReady)
	setEvacuating(pool, idx.evacuated[pool.Name], idx.live[pool.Name])
}

// setEvacuating sets Evacuating from the pool's evacuated Stores (rendered with spec.evacuate)
// and what the live ones among them hold; without any, the condition is removed. Once the move
// executor (controllers/moveexec, in the CSI controller) reported the moves' progress (any
// other reason than MovesNotExecuted) the condition is its own and left as it is.
func setEvacuating(pool *policyv1.StoragePool, evacuated []string, live []*storev1.Store) {
	if len(evacuated) == 0 {
		conditions.Delete(pool, EvacuatingCondition)
		return
	}
	if c := conditions.Get(pool, EvacuatingCondition); c != nil && c.Reason != ReasonMovesNotExecuted {
		return
	}
	var held int64
	reported := 0
	for _, s := range live {
		if c := s.Status.Capacity; c != nil && slices.Contains(evacuated, s.Name) {
			held += c.Provisioned
			reported++
		}
	}
	conditions.MarkTrue(pool, EvacuatingCondition, ReasonMovesNotExecuted,
		"%d Stores evacuated (%s), holding %s (%d of them reported): they take no new volume; moving their volumes is not carried out yet (the move executor of the CSI controller has not reported; plinth diff shows the plan), nothing is moved or deleted",
		len(evacuated), summarize(evacuated, 10), storev1.HumanBytes(held), reported)
}

// setStoresReady sets StoresReady from how many of want Stores are ready and reporting.
func setStoresReady(pool *policyv1.StoragePool, want, ready int, reporting int32, notReady []string) {
	switch {
	case want == 0:
		conditions.MarkUnknown(pool, StoresReadyCondition, ReasonStoresUnknown, "no node matches the nodeSelector")
	case ready == want:
		conditions.MarkTrue(pool, StoresReadyCondition, ReasonStoresReady, "%d of %d Stores ready", ready, want)
	case reporting == 0 && ready == 0:
		conditions.MarkUnknown(pool, StoresReadyCondition, ReasonStoresUnknown, "%d Stores, no agent has reported yet", want)
	default:
		conditions.MarkFalse(pool, StoresReadyCondition, ReasonStoresNotReady, "%d of %d Stores ready; not ready: %s", ready, want, summarize(notReady, 10))
	}
}

// setInUse says on a Placement removed from Git that its StorageClass is kept for n PVCs.
func setInUse(pl *policyv1.Placement, class string, n int) {
	msg := fmt.Sprintf("removed from Git; StorageClass %s is kept: in use by %d PVCs (existing volumes keep working; new PVCs and expansion need the class)", class, n)
	conditions.MarkFalse(pl, meta.ReadyCondition, ReasonInUse, "%s", msg)
	conditions.MarkReconciling(pl, ReasonInUse, "%s", msg)
	conditions.Delete(pl, meta.StalledCondition)
	pl.Status.ObservedGeneration = pl.Generation
	pl.Status.StorageClass = class
	n32 := int32(n)
	pl.Status.InUseBy = &n32
}

// finishDeletedPlacements releases the in-use finalizer of Placements removed from Git once
// their StorageClass is gone or unused, and reports the ones still in use.
func (r *Reconciler) finishDeletedPlacements(ctx context.Context, s *scope) error {
	for _, pl := range s.deleting {
		if !controllerutil.ContainsFinalizer(pl, policyv1.FinalizerInUse) {
			continue
		}
		class := pl.Spec.StorageClass.Name
		if n := s.inUse[class]; n > 0 {
			p := track(pl, "Placement", &pl.Status, pl)
			setInUse(pl, class, n)
			r.emitTransition(p, false)
			if err := kerrors.FilterOut(r.patch(ctx, p), apierrors.IsNotFound); err != nil {
				return fmt.Errorf("patch Placement %s: %w", pl.Name, err)
			}
			continue
		}
		if msg := s.forced[class]; msg != "" && r.Recorder != nil {
			r.Recorder.Eventf(pl, nil, corev1.EventTypeWarning, ReasonPrunedInUse, "Prune", "%s", msg)
		}
		before := pl.DeepCopy()
		controllerutil.RemoveFinalizer(pl, policyv1.FinalizerInUse)
		if err := r.Client.Patch(ctx, pl, client.MergeFrom(before), client.FieldOwner(r.FieldManager)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("release finalizer of Placement %s: %w", pl.Name, err)
		}
	}
	return nil
}

// patch writes what changed on p since it was read: finalizers first (a merge patch with an
// optimistic lock), then the whole status in one merge patch of the status subresource, so a
// reader never sees new conditions with an old observedGeneration. Nothing changed, nothing sent.
func (r *Reconciler) patch(ctx context.Context, p *policyObject) error {
	if !equality.Semantic.DeepEqual(p.before.GetFinalizers(), p.obj.GetFinalizers()) {
		m := p.before.DeepCopyObject().(client.Object)
		m.SetFinalizers(p.obj.GetFinalizers())
		if err := r.Client.Patch(ctx, m, client.MergeFromWithOptions(p.before, client.MergeFromWithOptimisticLock{}), client.FieldOwner(r.FieldManager)); err != nil {
			return err
		}
	}
	if equality.Semantic.DeepEqual(p.beforeStatus, p.status) {
		return nil
	}
	s := p.obj.DeepCopyObject().(client.Object)
	return r.Client.Status().Patch(ctx, s, client.MergeFrom(p.before), client.FieldOwner(r.FieldManager))
}

// emitTransition records an event when the Ready condition changed: a warning unless it is
// Ready, or quiet (the set waits for objects its references name), then a normal event.
func (r *Reconciler) emitTransition(p *policyObject, quiet bool) {
	c := conditions.Get(p.setter, meta.ReadyCondition)
	if c == nil || r.Recorder == nil {
		return
	}
	if p.oldReady != nil && p.oldReady.status == string(c.Status) && p.oldReady.reason == c.Reason && p.oldReady.message == c.Message {
		return
	}
	typ, reason, msg := corev1.EventTypeNormal, c.Reason, c.Message
	switch {
	case c.Status == "True":
	case quiet && len(p.out.waitingFor) > 0:
		reason, msg = meta.DependencyNotReadyReason, "waiting for "+strings.Join(p.out.waitingFor, ", ")+" to arrive in the policy set"
	case quiet:
		reason, msg = meta.DependencyNotReadyReason, "not applied yet: the policy set waits for objects its Placements name"
	default:
		typ = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(p.obj, nil, typ, reason, "Reconcile", "%s", msg)
}

// emitOutcome records the events of what the reconcile did for p: drift corrected, objects
// applied, pruned and replaced.
func (r *Reconciler) emitOutcome(p *policyObject) {
	for _, it := range p.out.corrected {
		r.event(p, corev1.EventTypeNormal, ReasonDriftCorrected, "corrected "+it.String())
	}
	if len(p.out.applied) > 0 {
		r.event(p, corev1.EventTypeNormal, ReasonApplied, summarize(p.out.applied, 10))
	}
	if len(p.out.pruned) > 0 {
		r.event(p, corev1.EventTypeNormal, ReasonPruned, "pruned "+summarize(p.out.pruned, 10))
	}
	if m := p.out.replaced; m != "" {
		r.event(p, corev1.EventTypeWarning, ReasonReplaced, m)
	}
}

// event records an event on p.
func (r *Reconciler) event(p *policyObject, typ, reason, msg string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(p.obj, nil, typ, reason, "Reconcile", "%s", msg)
	}
}

func summarize(items []string, max int) string {
	if len(items) <= max {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:max], ", ") + fmt.Sprintf(" and %d more", len(items)-max)
}

func sortRefs(refs []policyv1.ObjectReference) []policyv1.ObjectReference {
	out := append([]policyv1.ObjectReference(nil), refs...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// setConditionMetric sets plinth_policy_condition for one condition the way kube-state-metrics
// does for built-in kinds: 1 for its current status and 0 for the two others, so "no policy
// is not Ready" is a 0-valued series rather than no series, which a missing metric would
// also give.
func setConditionMetric(kind, name string, c metav1.Condition) {
	for _, st := range []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown} {
		v := 0.0
		if st == c.Status {
			v = 1
		}
		PolicyCondition.WithLabelValues(kind, name, c.Type, string(st)).Set(v)
	}
}
