package capacity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Name is the plugin's name in KubeSchedulerConfiguration profiles.
const Name = "PlinthCapacity"

const stateKey fwk.StateKey = Name

// Args are the plugin's arguments (pluginConfig[].args, JSON/YAML); see README.md.
type Args struct {
	// ReservationTimeoutSeconds is how long a booking made in Reserve may live before it is
	// dropped even though the claim's volume was never seen in the Store's capacity
	// (provisioning stuck or the agent not reporting). Default 300.
	ReservationTimeoutSeconds int64 `json:"reservationTimeoutSeconds,omitempty"`
	// DefaultStrategy is used when a StorageClass names a Placement the plugin has not seen:
	// Binpack (default) or Spreadout.
	DefaultStrategy policyv1.Strategy `json:"defaultStrategy,omitempty"`
}

// DefaultArgs returns the defaults of Args.
func DefaultArgs() Args {
	return Args{ReservationTimeoutSeconds: 300, DefaultStrategy: policyv1.StrategyBinpack}
}

// decodeArgs reads the plugin's args: nil, *runtime.Unknown with JSON (what the scheduler
// passes for out-of-tree plugins), or *Args.
func decodeArgs(obj runtime.Object) (Args, error) {
	a := DefaultArgs()
	switch o := obj.(type) {
	case nil:
	case *runtime.Unknown:
		if len(o.Raw) > 0 {
			if err := json.Unmarshal(o.Raw, &a); err != nil {
				return a, fmt.Errorf("decode %s args: %w", Name, err)
			}
		}
	default:
		return a, fmt.Errorf("%s args: unexpected type %T", Name, obj)
	}
	if a.ReservationTimeoutSeconds <= 0 {
		return a, fmt.Errorf("%s args: reservationTimeoutSeconds must be > 0, got %d", Name, a.ReservationTimeoutSeconds)
	}
	switch a.DefaultStrategy {
	case "":
		a.DefaultStrategy = policyv1.StrategyBinpack
	case policyv1.StrategyBinpack, policyv1.StrategySpreadout:
	default:
		return a, fmt.Errorf("%s args: defaultStrategy must be Binpack or Spreadout, got %q", Name, a.DefaultStrategy)
	}
	return a, nil
}

// Plugin is the PlinthCapacity scheduler plugin. It keeps what it needs of Stores,
// Placements and Protocols in memory (fed by informers) plus the bookings of pods in
// flight, so Filter and Score make no API call.
type Plugin struct {
	args  Args
	cache *view
	pvcs  corelisters.PersistentVolumeClaimLister
	pvs   corelisters.PersistentVolumeLister
	// pods lists a workload's pods that are not in the scheduler's snapshot (spreadAcross).
	pods      corelisters.PodLister
	classes   storagelisters.StorageClassLister
	synced    func() bool
	nodeGone  func(node string) bool
	nodeLabel func(name string) string
}

var (
	_ fwk.PreFilterPlugin   = (*Plugin)(nil)
	_ fwk.FilterPlugin      = (*Plugin)(nil)
	_ fwk.PreScorePlugin    = (*Plugin)(nil)
	_ fwk.ScorePlugin       = (*Plugin)(nil)
	_ fwk.ScoreExtensions   = (*Plugin)(nil)
	_ fwk.ReservePlugin     = (*Plugin)(nil)
	_ fwk.EnqueueExtensions = (*Plugin)(nil)
	_ fwk.SignPlugin        = (*Plugin)(nil)
)

// Name returns Name.
func (p *Plugin) Name() string { return Name }

// claimDemand is one unbound claim of a local placement.
type claimDemand struct {
	claim   string // namespace/name
	poolKey string // plinth.dev/pool label value
	bytes   int64
}

// poolDemand is the pod's summed request on one pool.
type poolDemand struct {
	pool    string
	poolKey string
	bytes   int64
	// slots are the pool's slots by node (view.pools[poolKey]) as PreFilter found them; nil
	// when no Store of the pool had been seen, and Filter and Score then look again.
	slots map[string]slot
}

// podState is what PreFilter learns of the pod; read-only afterwards.
type podState struct {
	pools      []poolDemand
	claims     []claimDemand
	nvme       bool
	strategy   policyv1.Strategy
	totalBytes int64
	// boundNodes hold the pod's bound local Plinth volumes (from the PVs' node affinity).
	boundNodes []string
	// spreads are the spreadAcross constraints of the pod's unbound claims, one per
	// (placement, label key), counted over the snapshot in PreFilter.
	spreads []spreadDemand
}

// Clone returns the state itself: it is never modified after PreFilter.
func (s *podState) Clone() fwk.StateData { return s }

func readState(cs fwk.CycleState) (*podState, bool) {
	d, err := cs.Read(stateKey)
	if err != nil {
		return nil, false
	}
	s, ok := d.(*podState)
	return s, ok
}

func claimNames(pod *corev1.Pod, fn func(name string) bool) bool {
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		switch {
		case v.PersistentVolumeClaim != nil:
			if !fn(v.PersistentVolumeClaim.ClaimName) {
				return false
			}
		case v.Ephemeral != nil:
			// Generic ephemeral volumes: the claim is named <pod>-<volume>.
			if !fn(pod.Name + "-" + v.Name) {
				return false
			}
		}
	}
	return true
}

func hasClaims(pod *corev1.Pod) bool {
	return !claimNames(pod, func(string) bool { return false })
}

// PreFilter collects the pod's claims of StorageClasses provisioned by csi.plinth.dev:
// unbound ones of WaitForFirstConsumer classes with their requests, pools and placement
// strategy, and bound local ones with their node. For unbound claims of classes with
// plinth.dev/spread-across it counts the workload's volumes per domain (see countSpread).
// A pod without such claims is skipped (Filter and Score do not run for it).
func (p *Plugin) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if !hasClaims(pod) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if p.synced != nil && !p.synced() {
		// an error, not Unschedulable: retried with backoff rather than on a cluster event
		return nil, fwk.AsStatus(errors.New("waiting for the Store, Placement and Protocol caches to sync"))
	}
	st := &podState{}
	var strategyBytes int64 = -1
	var status *fwk.Status
	claimNames(pod, func(name string) bool {
		pvc, err := p.pvcs.PersistentVolumeClaims(pod.Namespace).Get(name)
		if apierrors.IsNotFound(err) {
			status = fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("persistentvolumeclaim %q not found", name))
			return false
		} else if err != nil {
			status = fwk.AsStatus(err)
			return false
		}
		if pvc.Spec.VolumeName != "" {
			if node := p.boundNode(pvc.Spec.VolumeName); node != "" {
				st.boundNodes = append(st.boundNodes, node)
			}
			return true
		}
		if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName == "" {
			return true
		}
		sc, err := p.classes.Get(*pvc.Spec.StorageClassName)
		if err != nil || sc.Provisioner != policyv1.DriverName {
			return true // not ours; a missing class is VolumeBinding's to report
		}
		if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
			return true // Immediate: provisioned without regard to the pod
		}
		pool, proto, placement := sc.Parameters[policyv1.ParamPool], sc.Parameters[policyv1.ParamProtocol], sc.Parameters[policyv1.ParamPlacement]
		strategy, known, kind := p.cache.lookupPolicy(placement, proto)
		switch kind {
		case protoNVMeoF:
			st.nvme = true
			return true
		case protoUnknown:
			status = fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("Protocol %q of StorageClass %q is not known yet", proto, sc.Name))
			return false
		}
		var req int64
		if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok && q.Sign() > 0 {
			req = q.Value()
		}
		if !known {
			strategy = p.args.DefaultStrategy
		} else if v := pvc.Annotations[policyv1.OverrideAnnotations[policyv1.OverrideStrategy]]; v != "" && p.cache.strategyOverridable(placement) {
			// A value the schema refuses is CreateVolume's to report; scoring keeps the
			// placement's own strategy for it.
			if s := policyv1.Strategy(v); s == policyv1.StrategyBinpack || s == policyv1.StrategySpreadout {
				strategy = s
			}
		}
		// Mixed placements: the strategy of the largest request decides the score.
		if req > strategyBytes {
			strategyBytes, st.strategy = req, strategy
		}
		key := storev1.NameLabelValue(pool)
		if k := sc.Parameters[policyv1.ParamSpreadAcross]; k != "" && !slices.ContainsFunc(st.spreads, func(d spreadDemand) bool {
			return d.placement == placement && d.key == k
		}) {
			st.spreads = append(st.spreads, spreadDemand{placement: placement, key: k, pool: pool, poolKey: key})
		}
		st.claims = append(st.claims, claimDemand{claim: pvc.Namespace + "/" + pvc.Name, poolKey: key, bytes: req})
		st.totalBytes = addSat(st.totalBytes, req)
		for i := range st.pools {
			if st.pools[i].poolKey == key {
				st.pools[i].bytes = addSat(st.pools[i].bytes, req)
				return true
			}
		}
		st.pools = append(st.pools, poolDemand{pool: pool, poolKey: key, bytes: req, slots: p.cache.poolSlots(key)})
		return true
	})
	if status != nil {
		return nil, status
	}
	if len(st.pools) == 0 && !st.nvme && len(st.boundNodes) == 0 {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	for i := range st.spreads {
		p.countSpread(pod, nodes, &st.spreads[i])
	}
	cs.Write(stateKey, st)
	return nil, nil
}

// boundNode returns the node of a bound local Plinth PV (its required node affinity on
// topology.plinth.dev/node), or "".
func (p *Plugin) boundNode(pvName string) string {
	pv, err := p.pvs.Get(pvName)
	if err != nil || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != policyv1.DriverName ||
		pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, t := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			if e.Key == policyv1.TopologyKeyNode && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

// PreFilterExtensions returns nil: other pods on a node do not change Store capacity.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Filter passes a node when, for every pool of the pod's local claims, the pool's Store on
// the node has valid capacity and available − booked ≥ the pod's request on that pool
// (bytes, exact), and, for NVMe-oF claims, the node is labelled
// plinth.dev/nvme-initiator=true, and, for claims of a Placement with spreadAcross, the
// node carries the label and its domain holds no more of the workload's volumes of the
// placement than the least-loaded one (filterSpread). Failures are
// UnschedulableAndUnresolvable for a missing initiator, missing spread label, missing Store
// or broken capacity data, and Unschedulable when the Store is merely full (capacity may
// free up) or the domain already holds more of the workload's volumes.
func (p *Plugin) Filter(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	st, ok := readState(cs)
	if !ok {
		return fwk.NewStatus(fwk.Error, "PlinthCapacity: no PreFilter state")
	}
	node := ni.Node()
	if node == nil {
		return fwk.NewStatus(fwk.Error, "node not found")
	}
	if st.nvme && node.Labels[policyv1.LabelNVMeInitiator] != "true" {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, FilterReasonNoInitiator+" (label "+policyv1.LabelNVMeInitiator+"=true missing)")
	}
	if len(st.pools) == 0 {
		return nil
	}
	if s := filterSpread(st.spreads, node); s != nil {
		return s
	}
	nk := p.nodeLabel(node.Name)
	p.cache.mu.RLock()
	defer p.cache.mu.RUnlock()
	for i := range st.pools {
		d := &st.pools[i]
		s := p.cache.slotsOf(d)[nk]
		state := capStoreAbsent
		if s.hasStore {
			state = s.state
		}
		if state != capOK {
			return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, state.reason()+" (pool "+d.pool+")")
		}
		if !fits(s.available, s.reserved, d.bytes) {
			return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("%s (pool %s: need %d bytes, free %d bytes of which %d booked by pods in flight)",
				FilterReasonInsufficient, d.pool, d.bytes, free(s.available, 0), s.reserved))
		}
	}
	return nil
}

// PreScore skips scoring for pods without local requests (all nodes are equal to this
// plugin: a neutral score) unless a node already holds the pod's bound volumes.
func (p *Plugin) PreScore(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	st, ok := readState(cs)
	if !ok || (st.totalBytes == 0 && len(st.boundNodes) == 0) {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score returns the raw score of a node: the bytes left free on it (summed over the pod's
// pools) after the pod's volumes, or scoreHoldsVolumes for a node that holds the pod's
// bound volumes. NormalizeScore turns these into 0–100 by the strategy.
func (p *Plugin) Score(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	st, ok := readState(cs)
	if !ok {
		return 0, fwk.NewStatus(fwk.Error, "PlinthCapacity: no PreFilter state")
	}
	node := ni.Node()
	if node == nil {
		return 0, fwk.NewStatus(fwk.Error, "node not found")
	}
	for _, n := range st.boundNodes {
		if n == node.Name {
			return scoreHoldsVolumes, nil
		}
	}
	nk := p.nodeLabel(node.Name)
	var left int64
	p.cache.mu.RLock()
	for i := range st.pools {
		d := &st.pools[i]
		if s, ok := p.cache.slotsOf(d)[nk]; ok && s.hasStore && s.state == capOK {
			left = addSat(left, max(free(s.available, s.reserved)-d.bytes, 0))
		}
	}
	p.cache.mu.RUnlock()
	return left, nil
}

// ScoreExtensions returns the plugin itself (NormalizeScore).
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore maps raw scores to 0–100: Spreadout prefers the most bytes left, Binpack
// the fewest; strictly ordered for up to 101 distinct values (see normalize).
func (p *Plugin) NormalizeScore(_ context.Context, cs fwk.CycleState, _ *corev1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	st, ok := readState(cs)
	if !ok {
		return fwk.NewStatus(fwk.Error, "PlinthCapacity: no PreFilter state")
	}
	normalize(scores, st.strategy != policyv1.StrategySpreadout)
	return nil
}

// Reserve books the pod's local requests on the chosen node so the next pods see them as
// taken (two pods never get the same free bytes) until the Store's report includes the
// volumes, Unreserve, or the timeout. A node that left the scheduler's snapshot is refused.
func (p *Plugin) Reserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	st, ok := readState(cs)
	if !ok || len(st.claims) == 0 {
		return nil
	}
	if p.nodeGone != nil && p.nodeGone(nodeName) {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("node %q is gone", nodeName))
	}
	p.cache.reserve(pod.UID, p.nodeLabel(nodeName), st.claims)
	klog.FromContext(ctx).V(4).Info("Booked capacity", "pod", klog.KObj(pod), "node", nodeName, "bytes", st.totalBytes)
	return nil
}

// Unreserve drops the pod's bookings.
func (p *Plugin) Unreserve(ctx context.Context, _ fwk.CycleState, pod *corev1.Pod, nodeName string) {
	p.cache.unreserve(pod.UID)
	klog.FromContext(ctx).V(4).Info("Released capacity", "pod", klog.KObj(pod), "node", nodeName)
}

// SignPod lets pods without claims share scheduling results (opportunistic batching) and
// refuses to sign pods with claims: their result depends on capacity booked cycle by cycle.
func (p *Plugin) SignPod(_ context.Context, pod *corev1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if hasClaims(pod) {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pod has volume claims")
	}
	return []fwk.SignFragment{{Key: "plinth.dev/PlinthCapacity.noClaims", Value: true}}, nil
}

// expireLoop drops timed-out bookings until ctx ends.
func (p *Plugin) expireLoop(ctx context.Context) {
	period := min(time.Duration(p.args.ReservationTimeoutSeconds)*time.Second/4, 10*time.Second)
	t := time.NewTicker(max(period, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := p.cache.expire(); n > 0 {
				klog.FromContext(ctx).Info("Dropped timed-out capacity bookings", "count", n)
			}
		}
	}
}
