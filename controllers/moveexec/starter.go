package moveexec

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/plinth-storage/plinth/controllers/move"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// EvacuatingCondition is the StoragePool condition of an evacuation (spec.evacuateNodes):
// the type the policy controller sets while no executor has reported (reason
// MovesNotExecuted); the Starter replaces it with the progress of the moves.
const EvacuatingCondition = "Evacuating"

// Reasons of EvacuatingCondition written by the Starter.
const (
	// ReasonMovesInProgress surfaces with Evacuating=True while a volume of an evacuated
	// Store is being moved or waits for a free slot (maxParallelMovesPerStore).
	ReasonMovesInProgress = "MovesInProgress"
	// ReasonMovesBlocked surfaces with Evacuating=True when volumes are left on the evacuated
	// Stores and none of them can move: each is blocked (no room, no protocol, snapshots) or
	// its target is on another node (not carried out yet); the message names them.
	ReasonMovesBlocked = "MovesBlocked"
	// ReasonEvacuated surfaces with Evacuating=False once the evacuated Stores hold no volume.
	ReasonEvacuated = "Evacuated"
)

// ReasonMoveStarted is the event on a VolumeState whose spec.move the Starter set.
const ReasonMoveStarted = "MoveStarted"

// DefaultAssumedRate is the copy rate the Starter's plan assumes for Stores that measure none,
// in bytes per second: the same as plinth diff's default (--move-rate), so both plan alike.
const DefaultAssumedRate = 100 << 20

// startKey is the one work item of the Starter: every change re-plans the whole cluster
// (moves compete for the same Stores' slots and room).
var startKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "volume-moves"}}

// Starter admits planned moves: it computes move.Plan from the live objects (the inputs
// plinth diff reads, LiveInputs) and sets spec.move on the planned volumes, at most
// maxParallelMovesPerStore moves per Store at once (as source or target, counting the moves
// in flight), in plan order; the next ones start when earlier ones end. Only moves between
// two Stores of one node are started (the agent carries out no other); the rest, and the
// blocked ones, are named on the pool's Evacuating condition, never silently left. Each
// spec.move is one Update under the resourceVersion read. Client must list the inputs,
// update VolumeStates and patch StoragePool status.
type Starter struct {
	Client client.Client
	// Events records MoveStarted on the VolumeState; nil records none.
	Events events.EventRecorder
	// AssumedRate is passed to move.Plan (bytes per second); 0 means DefaultAssumedRate.
	AssumedRate int64
	// Resync re-plans this often without an event (capacity reports, agent capabilities);
	// 0 means one minute.
	Resync time.Duration
	// SkipNameValidation lets tests start several managers in one process.
	SkipNameValidation bool
}

// SetupWithManager re-plans on every change of a VolumeState, Store, StoragePool or Placement.
func (s *Starter) SetupWithManager(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{startKey}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("volume-move-start").
		WithOptions(controller.Options{SkipNameValidation: &s.SkipNameValidation, MaxConcurrentReconciles: 1}).
		Watches(&storev1.VolumeState{}, all).
		Watches(&storev1.Store{}, all).
		Watches(&policyv1.StoragePool{}, all).
		Watches(&policyv1.Placement{}, all).
		Complete(s)
}

// Live is what the Starter read, and what it plans from.
type Live struct {
	Pools      []policyv1.StoragePool
	Placements []policyv1.Placement
	Stores     []storev1.Store
	Agents     []storev1.Agent
	Volumes    []storev1.VolumeState
	Snapshots  []storev1.VolumeSnapshotState
	PVs        []corev1.PersistentVolume
	Attached   []storagev1.VolumeAttachment
}

func (s *Starter) read(ctx context.Context) (*Live, error) {
	l := &Live{}
	var (
		pools  policyv1.StoragePoolList
		places policyv1.PlacementList
		stores storev1.StoreList
		agents storev1.AgentList
		vols   storev1.VolumeStateList
		snaps  storev1.VolumeSnapshotStateList
		pvs    corev1.PersistentVolumeList
		vas    storagev1.VolumeAttachmentList
	)
	// read-only views of the cache (no copy of every object per round): what is written is
	// copied first (start, report)
	for _, ls := range []client.ObjectList{&pools, &places, &stores, &agents, &vols, &snaps, &pvs, &vas} {
		if err := s.Client.List(ctx, ls, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list %T: %w", ls, err)
		}
	}
	l.Pools, l.Placements, l.Stores, l.Agents = pools.Items, places.Items, stores.Items, agents.Items
	l.Volumes, l.Snapshots, l.PVs, l.Attached = vols.Items, snaps.Items, pvs.Items, vas.Items
	return l, nil
}

// LiveInputs builds move.Plan's inputs from the live objects, by the rules plinth diff applies
// to its proposed policy (controllers/diff/moves.go): a Store is evacuated when it carries
// spec.evacuate, draining when marked so; a volume moves to its Placement's pool when the
// Placement says existingVolumes Move and its frozen pool differs (this wins), else to its
// own pool when its Store is evacuated. Volumes being deleted are left out.
func LiveInputs(l *Live) ([]move.Store, []move.Volume) {
	pools := map[string]*policyv1.StoragePool{}
	for i := range l.Pools {
		pools[l.Pools[i].Name] = &l.Pools[i]
	}
	places := map[string]*policyv1.Placement{}
	for i := range l.Placements {
		places[l.Placements[i].Name] = &l.Placements[i]
	}
	agents := map[string]*storev1.Agent{}
	for i := range l.Agents {
		agents[l.Agents[i].Name] = &l.Agents[i]
	}
	var stores []move.Store
	evacuated := map[string]*storev1.Store{}
	for i := range l.Stores {
		st := &l.Stores[i]
		ms := move.Store{Name: st.Name, Pool: st.Spec.Pool, Node: st.Spec.NodeName, Evacuate: st.Spec.Evacuate,
			Draining: st.IsMarkedDraining(), MaxParallel: maxParallel(pools[st.Spec.Pool])}
		if st.Spec.Evacuate {
			evacuated[st.Name] = st
		}
		if c := st.Status.Capacity; c != nil {
			ms.Reported, ms.Available, ms.Provisioned = true, c.Available, c.Provisioned
		}
		if a := agents[st.Spec.NodeName]; a != nil {
			ms.ServesNVMeoF = a.Spec.NVMeoF != nil
			if a.Status.LastHeartbeatTime != nil {
				mods := a.Status.Capabilities.KernelModules
				ms.CapabilitiesKnown = true
				ms.Export = slices.Contains(mods, "nvmet") && slices.Contains(mods, "nvmet_tcp")
				ms.Initiator = slices.Contains(mods, "nvme_tcp")
			}
		}
		stores = append(stores, ms)
	}
	snapsOf := map[string][]string{}
	for _, sn := range l.Snapshots {
		snapsOf[sn.Spec.SourceVolume] = append(snapsOf[sn.Spec.SourceVolume], sn.Name)
	}
	pvOf := map[string]*corev1.PersistentVolume{}
	for i := range l.PVs {
		if c := l.PVs[i].Spec.CSI; c != nil && c.Driver == policyv1.DriverName {
			pvOf[c.VolumeHandle] = &l.PVs[i]
		}
	}
	attachedTo := map[string][]string{}
	for _, va := range l.Attached {
		if pv := va.Spec.Source.PersistentVolumeName; pv != nil && va.Spec.Attacher == policyv1.DriverName && va.Status.Attached {
			attachedTo[*pv] = append(attachedTo[*pv], va.Spec.NodeName)
		}
	}
	var vols []move.Volume
	for i := range l.Volumes {
		v := &l.Volumes[i]
		if !v.DeletionTimestamp.IsZero() || v.Status.Phase == storev1.VolumeDeleting {
			continue
		}
		mv := move.Volume{ID: v.Name, Store: v.Spec.StoreName, SizeBytes: max(v.Spec.CapacityBytes, v.Status.ActualBytes),
			Protocol: move.ProtocolLocal, Snapshots: snapsOf[v.Name]}
		if v.Spec.Policy.ProtocolSpec.NVMeoFTCP != nil {
			mv.Protocol = move.ProtocolNVMeoF
		}
		pl := places[v.Spec.Policy.Placement]
		switch src := evacuated[v.Spec.StoreName]; {
		case pl != nil && pl.Spec.ExistingVolumes == policyv1.ExistingVolumesMove && v.Spec.Policy.Pool != pl.Spec.PoolRef.Name:
			mv.TargetPool = pl.Spec.PoolRef.Name
			mv.Cause = move.Cause{Kind: "Placement", Name: pl.Name, Field: "spec.existingVolumes"}
		case src != nil:
			mv.TargetPool = src.Spec.Pool
			mv.Cause = move.Cause{Kind: "StoragePool", Name: src.Spec.Pool, Field: "spec.evacuateNodes"}
		default:
			continue
		}
		if pv := pvOf[v.Name]; pv != nil {
			mv.PV = pv.Name
			if c := pv.Spec.ClaimRef; c != nil {
				mv.Claim = c.Namespace + "/" + c.Name
			}
			mv.Consumers = attachedTo[pv.Name]
		}
		vols = append(vols, mv)
	}
	return stores, vols
}

func maxParallel(p *policyv1.StoragePool) int {
	if p != nil && p.Spec.MaxParallelMovesPerStore > 0 {
		return int(p.Spec.MaxParallelMovesPerStore)
	}
	return int(policyv1.DefaultMaxParallelMovesPerStore)
}

// Why a planned move is not started now (Admission.Held).
const (
	// HeldCrossNode: its target is on another node; moves between nodes are not carried
	// out yet (docs/design.md, "Data mobility").
	HeldCrossNode = "CrossNode"
	// HeldNoSlot: its source or target already takes part in maxParallelMovesPerStore moves.
	HeldNoSlot = "NoSlot"
)

// Admission is what Admit decides for one plan.
type Admission struct {
	// Start are the planned moves to set spec.move for now, in plan order.
	Start []move.Move
	// Held are the planned moves not started now, with HeldCrossNode or HeldNoSlot by
	// volume id; Blocked the plan's blocked moves. Moves in flight are in neither.
	Held    map[string]string
	Blocked []move.Move
}

// Admit chooses the moves of plan to start, in plan order: a move whose volume is in flight
// (inFlight, by volume id) is skipped; one between two nodes is held (HeldCrossNode); one
// whose source or target already takes part in its Store's limit of moves (busy: the moves
// in flight and those admitted before it, by Store name; limit: the Store's
// maxParallelMovesPerStore, at least 1) is held (HeldNoSlot); the others start.
func Admit(plan *move.Result, inFlight map[string]bool, busy map[string]int, limit func(store string) int) Admission {
	a := Admission{Held: map[string]string{}}
	used := map[string]int{}
	for k, v := range busy {
		used[k] = v
	}
	for _, m := range plan.Moves {
		switch {
		case inFlight[m.Volume]:
		case m.Disruption == move.DisruptionBlocked:
			a.Blocked = append(a.Blocked, m)
		case m.SourceNode != m.TargetNode:
			a.Held[m.Volume] = HeldCrossNode
		case used[m.Source] >= max(limit(m.Source), 1) || used[m.Target] >= max(limit(m.Target), 1):
			a.Held[m.Volume] = HeldNoSlot
		default:
			used[m.Source]++
			used[m.Target]++
			a.Start = append(a.Start, m)
		}
	}
	return a
}

// Reconcile plans, starts what may start, and reports each evacuating pool's progress.
func (s *Starter) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	resync := s.Resync
	if resync <= 0 {
		resync = time.Minute
	}
	l, err := s.read(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	stores, vols := LiveInputs(l)
	rate := s.AssumedRate
	if rate <= 0 {
		rate = DefaultAssumedRate
	}
	var plan *move.Result
	if len(vols) > 0 {
		if plan, err = move.Plan(stores, vols, move.Options{AssumedRate: rate}); err != nil {
			return ctrl.Result{}, err
		}
	} else {
		plan = &move.Result{}
	}
	inFlight, busy := map[string]bool{}, map[string]int{}
	for _, v := range l.Volumes {
		if m := v.Spec.Move; m != nil {
			inFlight[v.Name] = true
			busy[m.SourceStore]++
			busy[m.TargetStore]++
		}
	}
	limit := map[string]int{}
	for _, st := range stores {
		limit[st.Name] = st.MaxParallel
	}
	adm := Admit(plan, inFlight, busy, func(n string) int { return limit[n] })
	byName := map[string]*storev1.VolumeState{}
	for i := range l.Volumes {
		byName[l.Volumes[i].Name] = &l.Volumes[i]
	}
	var errs []error
	for _, m := range adm.Start {
		started, err := s.start(ctx, byName[m.Volume].DeepCopy(), m)
		if err != nil {
			errs = append(errs, err)
		}
		if started {
			inFlight[m.Volume] = true
		}
	}
	waiting, cross := 0, 0
	for _, h := range adm.Held {
		if h == HeldCrossNode {
			cross++
		} else {
			waiting++
		}
	}
	MovesPlanned.WithLabelValues(StateInFlight).Set(float64(len(inFlight)))
	MovesPlanned.WithLabelValues(StateWaiting).Set(float64(waiting))
	MovesPlanned.WithLabelValues(StateCrossNode).Set(float64(cross))
	MovesPlanned.WithLabelValues(StateBlocked).Set(float64(len(adm.Blocked)))
	for i := range l.Pools {
		if err := s.report(ctx, l.Pools[i].DeepCopy(), l, plan, adm, inFlight); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return ctrl.Result{}, fmt.Errorf("volume moves: %v", errs)
	}
	return ctrl.Result{RequeueAfter: resync}, nil
}

// start sets spec.move on vs for m. The id is "move-<generation>" of the generation the
// write makes: unique among the volume's moves, so no earlier move's status counts for it.
// A conflict (the volume changed since it was read) starts nothing: its new version brings
// a new round.
func (s *Starter) start(ctx context.Context, vs *storev1.VolumeState, m move.Move) (bool, error) {
	id := fmt.Sprintf("move-%d", vs.Generation+1)
	vs.Spec.Move = &storev1.VolumeMove{ID: id, SourceStore: m.Source, TargetStore: m.Target}
	if err := s.Client.Update(ctx, vs); err != nil {
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return false, fmt.Errorf("start move of %s: %w", vs.Name, err)
	}
	if s.Events != nil {
		s.Events.Eventf(vs, nil, corev1.EventTypeNormal, ReasonMoveStarted, "Move", "move %s: %s → %s, %d bytes, asked by %s %s %s",
			id, m.Source, m.Target, m.Bytes, m.Cause.Kind, m.Cause.Name, m.Cause.Field)
	}
	return true, nil
}

// report writes pool's Evacuating condition from the volumes that leave its evacuated Stores
// (whatever the cause: evacuateNodes, or a Placement that moves its volumes elsewhere), in
// one merge patch guarded by the resourceVersion read; nothing is sent when it is unchanged.
// A pool without evacuated Stores is left alone (the policy controller removes the condition
// when the evacuation leaves the policy).
func (s *Starter) report(ctx context.Context, pool *policyv1.StoragePool, l *Live, plan *move.Result, adm Admission, inFlight map[string]bool) error {
	c, ok := EvacuationStatus(pool, l, plan, adm, inFlight)
	if !ok {
		return nil
	}
	before := pool.DeepCopy()
	c.ObservedGeneration = pool.Generation
	meta.SetStatusCondition(&pool.Status.Conditions, c)
	if old := meta.FindStatusCondition(before.Status.Conditions, EvacuatingCondition); old != nil &&
		old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration {
		return nil
	}
	// a conflict: the pool changed since it was read, and its new version brings a new round
	if err := ignoreConflict(s.Client.Status().Patch(ctx, pool, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))); err != nil {
		return fmt.Errorf("StoragePool %s: Evacuating: %w", pool.Name, err)
	}
	return nil
}

// EvacuationStatus is pool's Evacuating condition (type, status, reason, message) from what
// the Starter read and decided; ok is false when the pool has no evacuated Store. Counts: moved
// (status.move Done out of an evacuated Store, spec.move cleared), in flight (spec.move set
// out of one), waiting for a slot, between nodes (not carried out), blocked; total is their
// sum. The message names up to 5 volumes of each kind not carried out, with why.
func EvacuationStatus(pool *policyv1.StoragePool, l *Live, plan *move.Result, adm Admission, inFlight map[string]bool) (metav1.Condition, bool) {
	evac := map[string]bool{}
	var names []string
	for _, st := range l.Stores {
		if st.Spec.Pool == pool.Name && st.Spec.Evacuate {
			evac[st.Name] = true
			names = append(names, st.Name)
		}
	}
	if len(evac) == 0 {
		return metav1.Condition{}, false
	}
	slices.Sort(names)
	moved, flying, left := 0, 0, 0
	for _, v := range l.Volumes {
		switch {
		case v.Spec.Move != nil && evac[v.Spec.Move.SourceStore] || inFlight[v.Name] && evac[v.Spec.StoreName]:
			flying++
		case evac[v.Spec.StoreName]:
			left++
		case v.Status.Move != nil && v.Status.Move.Phase == storev1.MoveDone && evac[v.Status.Move.SourceStore]:
			moved++
		}
	}
	var slot int
	var cross, blocked []string
	for _, m := range plan.Moves {
		if !evac[m.Source] || inFlight[m.Volume] {
			continue
		}
		switch {
		case m.Disruption == move.DisruptionBlocked:
			blocked = append(blocked, fmt.Sprintf("%s (%s: %s)", m.Volume, m.Blocked, m.Reason))
		case adm.Held[m.Volume] == HeldCrossNode:
			cross = append(cross, fmt.Sprintf("%s → %s on node %s", m.Volume, m.Target, m.TargetNode))
		case adm.Held[m.Volume] == HeldNoSlot:
			slot++
		}
	}
	// volumes on an evacuated Store that no plan covers (their Placement keeps them in a
	// pool the Store is not in) are blocked too
	planned := left - slot - len(cross) - len(blocked)
	total := moved + flying + left
	msg := fmt.Sprintf("Stores %s: %d of %d volumes moved, %d in flight (at most %d per Store), %d waiting for a free slot",
		strings.Join(names, ", "), moved, total, flying, maxParallel(pool), slot)
	if len(cross) > 0 {
		msg += fmt.Sprintf("; %d not carried out, their target is on another node (moves between nodes are not carried out yet): %s", len(cross), strings.Join(firstN(cross, 5), "; "))
	}
	if len(blocked) > 0 {
		msg += fmt.Sprintf("; %d blocked: %s", len(blocked), strings.Join(firstN(blocked, 5), "; "))
	}
	if planned > 0 {
		msg += fmt.Sprintf("; %d not planned yet", planned)
	}
	c := metav1.Condition{Type: EvacuatingCondition, Status: metav1.ConditionTrue, Reason: ReasonMovesInProgress, Message: msg}
	switch {
	case flying == 0 && left == 0:
		c.Status, c.Reason = metav1.ConditionFalse, ReasonEvacuated
		c.Message = fmt.Sprintf("Stores %s hold no volume: %d moved", strings.Join(names, ", "), moved)
	case flying == 0 && slot == 0 && planned <= 0:
		c.Reason = ReasonMovesBlocked
	}
	return c, true
}

func firstN(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("and %d more", len(s)-n))
}
