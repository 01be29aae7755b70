package move

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Protocol kinds of a volume (its frozen Protocol: exactly one of local or nvmeofTcp).
const (
	ProtocolLocal  = "local"
	ProtocolNVMeoF = "nvmeofTcp"
)

// Disruption is what a volume's consumer sees while it moves.
type Disruption string

const (
	// DisruptionNone: no pod uses the volume (no VolumeAttachment): nothing to stop.
	DisruptionNone Disruption = "None"
	// DisruptionPodRestart: the consumer stops for the copy and starts again once the volume
	// is switched (NVMe-oF: same volume handle, reconnected to the target; local: the claim
	// is rebound to a new PV on the target node, where the pod is scheduled).
	DisruptionPodRestart Disruption = "PodRestart"
	// DisruptionBlocked: the move cannot be made (Move.Blocked says why); the volume stays.
	DisruptionBlocked Disruption = "Blocked"
)

// Reasons a move is blocked (Move.Blocked).
const (
	// BlockedNoRoom: no eligible Store of the target pool has the volume's size available,
	// after the moves planned before it (larger volumes first).
	BlockedNoRoom = "NoRoom"
	// BlockedNoProtocol: no Store of the target pool can serve the volume's protocol or
	// take part in the copy (NVMe-oF target or initiator missing), or the source cannot
	// export it for the copy.
	BlockedNoProtocol = "NoProtocol"
	// BlockedSnapshots: the volume has snapshots, which are not moved: moving the volume would
	// strand them on the source, so the move is refused until they are deleted.
	BlockedSnapshots = "Snapshots"
)

// Cause names the policy field that asks for a move: StoragePool spec.evacuateNodes or
// Placement spec.existingVolumes.
type Cause struct {
	Kind  string `json:"kind"`
	Name  string `json:"name"`
	Field string `json:"field"`
}

// Store is one Store as the planner sees it. Bytes are int64 bytes.
type Store struct {
	Name, Pool, Node string
	// Evacuate: the pool evacuates the Store's node: a source, never a target.
	Evacuate bool
	// Draining: kept for its volumes after it left the policy: never a target.
	Draining bool
	// Reported: the agent reported a capacity; a Store that has not is never a target.
	Reported bool
	// Available is status.capacity.available (room for new volumes); Provisioned is
	// status.capacity.provisioned.
	Available, Provisioned int64
	// CapabilitiesKnown: the node's agent reported its kernel modules. Export: nvmet and
	// nvmet_tcp are loaded (the node can export a volume); Initiator: nvme_tcp is loaded (the
	// node can read another node's export). Unknown capabilities are not judged.
	CapabilitiesKnown, Export, Initiator bool
	// ServesNVMeoF: the node's Agent is rendered with an NVMe-oF endpoint (some Placement
	// serves the pool over NVMe-oF), so an NVMe-oF volume can be exported there.
	ServesNVMeoF bool
	// RateBytesPerSecond is the measured copy rate of the Store's disks and link; 0 when not
	// measured (the plan then uses Options.AssumedRate and says so).
	RateBytesPerSecond int64
	// MaxParallel is how many moves the Store takes part in at once, as source or target
	// (StoragePool maxParallelMovesPerStore); below 1 counts as 1.
	MaxParallel int
}

// Volume is one volume that is to leave its Store.
type Volume struct {
	// ID is the CSI volume id (the VolumeState name); Store the Store that holds it.
	ID, Store string
	// TargetPool is the pool it goes to: its own when its Store is evacuated, the
	// Placement's new pool when it follows a change of poolRef.
	TargetPool string
	// Cause is the policy field that asks for the move.
	Cause Cause
	// SizeBytes is the volume's size: what a copy of its device carries and what it takes
	// on the target.
	SizeBytes int64
	// Protocol is ProtocolLocal or ProtocolNVMeoF.
	Protocol string
	// PV and Claim ("namespace/name") name the PersistentVolume and its claim, when known.
	PV, Claim string
	// Consumers are the nodes a pod uses it from (attached VolumeAttachments).
	Consumers []string
	// Snapshots are the ids of its snapshots (VolumeSnapshotStates).
	Snapshots []string
}

// Options tune Plan.
type Options struct {
	// AssumedRate is the copy rate in bytes per second used for a move whose Stores report
	// no measured rate. Must be positive.
	AssumedRate int64
}

// Move is one planned move. Bytes are int64 bytes, times whole seconds from the start of
// the plan.
type Move struct {
	Volume string `json:"volume"`
	PV     string `json:"pv,omitempty"`
	Claim  string `json:"claim,omitempty"`
	// Protocol is ProtocolLocal or ProtocolNVMeoF.
	Protocol string `json:"protocol"`
	// Source and Target are Store names (Target empty when blocked); Pool is the target pool.
	Source     string `json:"source"`
	SourceNode string `json:"sourceNode"`
	Target     string `json:"target,omitempty"`
	TargetNode string `json:"targetNode,omitempty"`
	Pool       string `json:"pool"`
	// Bytes is what the copy carries: the volume's size.
	Bytes int64 `json:"bytes"`
	// RateBytesPerSecond is the copy rate the estimate uses; RateMeasured is false when it is
	// Options.AssumedRate.
	RateBytesPerSecond int64 `json:"rateBytesPerSecond,omitempty"`
	RateMeasured       bool  `json:"rateMeasured"`
	// StartSeconds and DurationSeconds place the copy in the plan's schedule, which runs at
	// most MaxParallel moves per Store at once.
	StartSeconds    int64 `json:"startSeconds"`
	DurationSeconds int64 `json:"durationSeconds"`
	// Disruption is what the consumer sees; Reason says why in words.
	Disruption Disruption `json:"disruption"`
	Reason     string     `json:"reason"`
	// Blocked is BlockedNoRoom, BlockedNoProtocol or BlockedSnapshots when Disruption is
	// DisruptionBlocked.
	Blocked string `json:"blocked,omitempty"`
	// Cause is the policy field that asks for the move.
	Cause Cause `json:"cause"`
}

// PoolCapacity is a pool's capacity before and after the planned moves, in bytes.
type PoolCapacity struct {
	Pool string `json:"pool"`
	// Provisioned sums status.capacity.provisioned over the pool's reported Stores, after:
	// minus what moves out, plus what moves in.
	ProvisionedBefore int64 `json:"provisionedBefore"`
	ProvisionedAfter  int64 `json:"provisionedAfter"`
	// Available sums status.capacity.available over the pool's reported Stores that take
	// new volumes (before: as they are; after: evacuated and draining Stores excluded, minus
	// what moves in).
	AvailableBefore int64 `json:"availableBefore"`
	AvailableAfter  int64 `json:"availableAfter"`
	// MovesIn and MovesOut count planned (not blocked) moves into and out of the pool's
	// Stores; Left is provisioned on evacuated Stores after the plan (blocked moves).
	MovesIn  int   `json:"movesIn"`
	MovesOut int   `json:"movesOut"`
	Left     int64 `json:"leftBytes"`
}

// Result is a plan.
type Result struct {
	// Moves in plan order: largest volume first, then by id; blocked moves included.
	Moves []Move `json:"moves"`
	// Pools touched by a move, by name.
	Pools []PoolCapacity `json:"pools"`
	// Bytes sums the planned (not blocked) moves; Seconds is when the last one ends.
	Bytes   int64 `json:"bytes"`
	Seconds int64 `json:"seconds"`
	// AssumedRate is Options.AssumedRate when some move uses it (no measured rate), else 0.
	AssumedRate int64 `json:"assumedRateBytesPerSecond,omitempty"`
	// Blocked counts the blocked moves.
	Blocked int `json:"blocked"`
}

// Plan assigns each volume a target Store and schedules the copies. Targets are the Stores
// of the volume's target pool that reported a capacity, take new volumes (not evacuated, not
// draining) and are not its source; a volume's protocol must be servable there and, on
// another node than the source's, the copy path must exist (the source exports the volume,
// the target reads it over NVMe-oF/TCP; a copy within one node needs neither).
// Volumes are placed largest first onto an eligible Store of the source's node if one has
// room (a local copy), else onto the eligible Store with the most room left (worst fit: it
// spreads the copies and leaves the most room on each Store), each taking its size from that
// Store's room. A volume with snapshots, or for which no Store qualifies, is
// blocked with the reason. Copies are scheduled in plan order, each as early as a slot of
// its source and of its target is free (each Store has MaxParallel slots). The error is for
// invalid options only.
func Plan(stores []Store, vols []Volume, o Options) (*Result, error) {
	if o.AssumedRate <= 0 {
		return nil, fmt.Errorf("assumed copy rate must be positive, got %d bytes/s", o.AssumedRate)
	}
	byName := make(map[string]*Store, len(stores))
	for i := range stores {
		byName[stores[i].Name] = &stores[i]
	}
	room := make(map[string]int64, len(stores))
	for _, s := range stores {
		if s.Reported {
			room[s.Name] = s.Available
		}
	}
	order := slices.Clone(vols)
	slices.SortStableFunc(order, func(a, b Volume) int {
		return cmp.Or(cmp.Compare(b.SizeBytes, a.SizeBytes), cmp.Compare(a.ID, b.ID))
	})
	res := &Result{Moves: []Move{}, Pools: []PoolCapacity{}}
	for _, v := range order {
		res.Moves = append(res.Moves, place(v, byName, stores, room))
	}
	schedule(res, byName, o.AssumedRate)
	res.Pools = pools(stores, res.Moves, byName)
	return res, nil
}

// place chooses the target of v and takes its size from the target's room.
func place(v Volume, byName map[string]*Store, stores []Store, room map[string]int64) Move {
	m := Move{Volume: v.ID, PV: v.PV, Claim: v.Claim, Protocol: v.Protocol, Source: v.Store, Pool: v.TargetPool,
		Bytes: v.SizeBytes, Cause: v.Cause}
	src := byName[v.Store]
	if src != nil {
		m.SourceNode = src.Node
	}
	block := func(rule, format string, args ...any) Move {
		m.Disruption, m.Blocked, m.Reason = DisruptionBlocked, rule, fmt.Sprintf(format, args...)
		return m
	}
	if n := len(v.Snapshots); n > 0 {
		return block(BlockedSnapshots, "has %d snapshots (%s), which are not moved: delete them or keep the volume where it is",
			n, strings.Join(firstN(slices.Sorted(slices.Values(v.Snapshots)), 3), ", "))
	}
	// a copy to another node reads the source over NVMe-oF/TCP: the source exports it, the
	// target connects; a copy between two Stores of one node reads the device locally
	srcExports := src == nil || !src.CapabilitiesKnown || src.Export
	var eligible, noProto []string
	for _, t := range stores {
		if t.Pool != v.TargetPool || t.Name == v.Store || t.Evacuate || t.Draining || !t.Reported {
			continue
		}
		sameNode := src != nil && t.Node == src.Node
		switch {
		case !sameNode && !srcExports:
			noProto = append(noProto, t.Node+" (another node: the source node "+src.Node+" cannot export the volume for the copy, no nvmet and nvmet_tcp modules)")
		case !sameNode && t.CapabilitiesKnown && !t.Initiator:
			noProto = append(noProto, t.Node+" (no nvme_tcp: cannot read the source's export)")
		case v.Protocol == ProtocolNVMeoF && !t.ServesNVMeoF:
			noProto = append(noProto, t.Node+" (no NVMe-oF endpoint: no Placement serves the pool over NVMe-oF there)")
		case v.Protocol == ProtocolNVMeoF && t.CapabilitiesKnown && !t.Export:
			noProto = append(noProto, t.Node+" (no nvmet and nvmet_tcp modules)")
		default:
			eligible = append(eligible, t.Name)
		}
	}
	if len(eligible) == 0 {
		if len(noProto) > 0 {
			slices.Sort(noProto)
			return block(BlockedNoProtocol, "no Store of pool %s can take a %s volume: %s", v.TargetPool, v.Protocol, strings.Join(firstN(noProto, 3), "; "))
		}
		return block(BlockedNoRoom, "pool %s has no other Store that takes new volumes and reported its capacity", v.TargetPool)
	}
	// a Store on the source's node first (a local copy: no network, and the only kind carried
	// out yet), then the most room
	local := func(n string) bool { return src != nil && byName[n].Node == src.Node }
	best := ""
	for _, n := range eligible {
		if room[n] < v.SizeBytes {
			continue
		}
		if best == "" || local(n) && !local(best) ||
			local(n) == local(best) && (room[n] > room[best] || room[n] == room[best] && n < best) {
			best = n
		}
	}
	if best == "" {
		most := eligible[0]
		for _, n := range eligible {
			if room[n] > room[most] || room[n] == room[most] && n < most {
				most = n
			}
		}
		return block(BlockedNoRoom, "needs %s; the most room left on an eligible Store of pool %s is %s (%s, after the moves planned before)",
			storev1.HumanBytes(v.SizeBytes), v.TargetPool, storev1.HumanBytes(max(room[most], 0)), most)
	}
	room[best] -= v.SizeBytes
	t := byName[best]
	m.Target, m.TargetNode = best, t.Node
	switch {
	case len(v.Consumers) == 0 && v.Protocol == ProtocolLocal:
		m.Disruption, m.Reason = DisruptionNone, fmt.Sprintf("no pod uses it: the claim is rebound to a new PV on node %s", t.Node)
	case len(v.Consumers) == 0:
		m.Disruption, m.Reason = DisruptionNone, "no pod uses it: copied while unpublished, same volume handle"
	case v.Protocol == ProtocolLocal:
		m.Disruption, m.Reason = DisruptionPodRestart, fmt.Sprintf(
			"local volume: a PV's node affinity is immutable, so the claim is rebound to a new PV on node %s and its pod restarts there", t.Node)
	default:
		m.Disruption, m.Reason = DisruptionPodRestart, fmt.Sprintf(
			"offline copy: its pod on %s stops for the copy and reconnects to the target under the same volume handle", strings.Join(firstN(slices.Sorted(slices.Values(v.Consumers)), 3), ", "))
	}
	return m
}

// schedule fills rates, start times and durations of the planned moves in plan order.
func schedule(res *Result, byName map[string]*Store, assumed int64) {
	slots := map[string][]int64{}
	free := func(name string) []int64 {
		if s, ok := slots[name]; ok {
			return s
		}
		n := 1
		if st := byName[name]; st != nil && st.MaxParallel > 1 {
			n = st.MaxParallel
		}
		slots[name] = make([]int64, n)
		return slots[name]
	}
	earliest := func(s []int64) int {
		i := 0
		for j := range s {
			if s[j] < s[i] {
				i = j
			}
		}
		return i
	}
	for i := range res.Moves {
		m := &res.Moves[i]
		if m.Disruption == DisruptionBlocked {
			res.Blocked++
			continue
		}
		rate, measured := rateOf(byName[m.Source], byName[m.Target])
		if !measured {
			rate = assumed
			res.AssumedRate = assumed
		}
		m.RateBytesPerSecond, m.RateMeasured = rate, measured
		m.DurationSeconds = (m.Bytes + rate - 1) / rate
		ss, ts := free(m.Source), free(m.Target)
		si, ti := earliest(ss), earliest(ts)
		m.StartSeconds = max(ss[si], ts[ti])
		end := m.StartSeconds + m.DurationSeconds
		ss[si], ts[ti] = end, end
		res.Bytes += m.Bytes
		res.Seconds = max(res.Seconds, end)
	}
}

// rateOf is the slower measured rate of the two Stores, or measured false when neither has one.
func rateOf(src, dst *Store) (int64, bool) {
	var r int64
	for _, s := range []*Store{src, dst} {
		if s != nil && s.RateBytesPerSecond > 0 && (r == 0 || s.RateBytesPerSecond < r) {
			r = s.RateBytesPerSecond
		}
	}
	return r, r > 0
}

// pools sums the capacity of every pool a move touches, before and after the plan.
func pools(stores []Store, moves []Move, byName map[string]*Store) []PoolCapacity {
	touched := map[string]bool{}
	for _, m := range moves {
		touched[m.Pool] = true
		if s := byName[m.Source]; s != nil {
			touched[s.Pool] = true
		}
	}
	acc := map[string]*PoolCapacity{}
	for p := range touched {
		acc[p] = &PoolCapacity{Pool: p}
	}
	for _, s := range stores {
		a := acc[s.Pool]
		if a == nil || !s.Reported {
			continue
		}
		a.ProvisionedBefore += s.Provisioned
		a.ProvisionedAfter += s.Provisioned
		if !s.Draining {
			a.AvailableBefore += s.Available
		}
		if !s.Draining && !s.Evacuate {
			a.AvailableAfter += s.Available
		}
		if s.Evacuate {
			a.Left += s.Provisioned
		}
	}
	for _, m := range moves {
		if m.Disruption == DisruptionBlocked {
			continue
		}
		if s := byName[m.Source]; s != nil && acc[s.Pool] != nil {
			a := acc[s.Pool]
			a.MovesOut++
			a.ProvisionedAfter -= m.Bytes
			switch {
			case s.Evacuate:
				a.Left -= m.Bytes
			case !s.Draining:
				a.AvailableAfter += m.Bytes // the source volume is deleted once moved
			}
		}
		if a := acc[m.Pool]; a != nil {
			a.MovesIn++
			a.ProvisionedAfter += m.Bytes
			a.AvailableAfter -= m.Bytes
		}
	}
	out := make([]PoolCapacity, 0, len(acc))
	for _, a := range acc {
		a.Left = max(a.Left, 0)
		out = append(out, *a)
	}
	slices.SortFunc(out, func(a, b PoolCapacity) int { return cmp.Compare(a.Pool, b.Pool) })
	return out
}

func firstN(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("and %d more", len(s)-n))
}
