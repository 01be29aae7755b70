package diff

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/move"
	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// DefaultMoveRate is the copy rate `plinth diff` assumes for a move whose Stores report no
// measured rate: 100 MiB/s, about what one 1 Gbit/s link carries. Bytes per second.
const DefaultMoveRate = 100 << 20

// Violation rules of planned moves (StoragePool spec.evacuateNodes, Placement
// spec.existingVolumes): a move that cannot succeed as the cluster stands.
const (
	// RuleMoveNoRoom: no Store of the target pool that takes new volumes has room for the
	// volume, after the moves planned before it (move.BlockedNoRoom).
	RuleMoveNoRoom = "MoveNoRoom"
	// RuleMoveNoProtocol: no Store of the target pool can serve the volume's protocol or read
	// the copy over NVMe-oF/TCP, or its source cannot export it (move.BlockedNoProtocol).
	RuleMoveNoProtocol = "MoveNoProtocol"
	// RuleMoveSnapshots: the volume has snapshots, which are not moved: the move is refused
	// rather than strand them (move.BlockedSnapshots).
	RuleMoveSnapshots = "MoveSnapshots"
	// RuleEvacuateNodeNotInPool: spec.evacuateNodes names a node the pool does not select
	// (no Store of the pool there): nothing would be evacuated.
	RuleEvacuateNodeNotInPool = "EvacuateNodeNotInPool"
)

var blockedRules = map[string]string{
	move.BlockedNoRoom:     RuleMoveNoRoom,
	move.BlockedNoProtocol: RuleMoveNoProtocol,
	move.BlockedSnapshots:  RuleMoveSnapshots,
}

// readMoveInputs lists what the move plan needs beyond readCluster: the VolumeSnapshotStates
// (snapshots of each volume, by source volume id) and the attached VolumeAttachments (the
// nodes a pod uses each PV from, by PV name).
func readMoveInputs(ctx context.Context, c client.Client, cl *cluster) error {
	var snaps storev1.VolumeSnapshotStateList
	if err := c.List(ctx, &snaps); err != nil {
		return fmt.Errorf("list VolumeSnapshotStates: %w", err)
	}
	cl.snapshotsOf = map[string][]string{}
	for _, s := range snaps.Items {
		cl.snapshotsOf[s.Spec.SourceVolume] = append(cl.snapshotsOf[s.Spec.SourceVolume], s.Name)
	}
	var vas storagev1.VolumeAttachmentList
	if err := c.List(ctx, &vas); err != nil {
		return fmt.Errorf("list VolumeAttachments: %w", err)
	}
	cl.attachedTo = map[string][]string{}
	for _, va := range vas.Items {
		if pv := va.Spec.Source.PersistentVolumeName; pv != nil && va.Spec.Attacher == policyv1.DriverName && va.Status.Attached {
			cl.attachedTo[*pv] = append(cl.attachedTo[*pv], va.Spec.NodeName)
		}
	}
	return nil
}

// moves plans the volume moves the proposed policy asks for (live only): the volumes of the
// Stores it evacuates (rendered Store spec.evacuate) and of Placements with existingVolumes
// Move whose volumes are in another pool than the Placement's. Blocked moves are violations
// at the field that asks for them; evacuateNodes naming a node the pool does not select is
// one too.
func (b *builder) moves(out *render.Output, rate int64) error {
	if b.cl == nil {
		return nil
	}
	rendered := map[string]*storev1.Store{}
	poolNodes := map[string]map[string]bool{}
	for i := range out.Stores {
		s := &out.Stores[i]
		rendered[s.Name] = s
		if poolNodes[s.Spec.Pool] == nil {
			poolNodes[s.Spec.Pool] = map[string]bool{}
		}
		poolNodes[s.Spec.Pool][s.Spec.NodeName] = true
	}
	for _, name := range names(b.after.pools, b.after.pools) {
		p := b.after.pools[name]
		var missing []string
		for _, n := range p.Spec.EvacuateNodes {
			if !poolNodes[name][n] {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 && b.causedHere("StoragePool", name) {
			b.violation(RuleEvacuateNodeNotInPool, "StoragePool", name, "spec.evacuateNodes", fmt.Sprintf(
				"nodes %s: the pool selects no such node (no Store of pool %s there), so nothing would be evacuated", strings.Join(missing, ", "), name))
		}
	}
	servesNVMeoF := map[string]bool{}
	for _, a := range out.Agents {
		servesNVMeoF[a.Name] = a.Spec.NVMeoF != nil
	}
	parallel := func(pool string) int {
		if p := b.after.pools[pool]; p != nil && p.Spec.MaxParallelMovesPerStore > 0 {
			return int(p.Spec.MaxParallelMovesPerStore)
		}
		return int(policyv1.DefaultMaxParallelMovesPerStore)
	}
	var stores []move.Store
	for _, name := range sortedKeys(b.cl.stores, rendered) {
		live, r := b.cl.stores[name], rendered[name]
		s := move.Store{Name: name}
		if r != nil {
			s.Pool, s.Node, s.Evacuate = r.Spec.Pool, r.Spec.NodeName, r.Spec.Evacuate
		} else {
			// left the policy: kept draining while it holds volumes, never a target
			s.Pool, s.Node, s.Draining = live.Spec.Pool, live.Spec.NodeName, true
		}
		if live != nil {
			s.Draining = s.Draining || live.IsMarkedDraining()
			if c := live.Status.Capacity; c != nil {
				s.Reported, s.Available, s.Provisioned = true, c.Available, c.Provisioned
			}
		}
		s.MaxParallel = parallel(s.Pool)
		s.ServesNVMeoF = servesNVMeoF[s.Node]
		if a := b.cl.agents[s.Node]; a != nil && a.Status.LastHeartbeatTime != nil {
			mods := a.Status.Capabilities.KernelModules
			s.CapabilitiesKnown = true
			s.Export = slices.Contains(mods, "nvmet") && slices.Contains(mods, "nvmet_tcp")
			s.Initiator = slices.Contains(mods, "nvme_tcp")
		}
		stores = append(stores, s)
	}
	var vols []move.Volume
	for _, storeName := range sortedKeys[[]storev1.VolumeState, bool](b.cl.volumes, nil) {
		for i := range b.cl.volumes[storeName] {
			v := &b.cl.volumes[storeName][i]
			if !v.DeletionTimestamp.IsZero() || v.Status.Phase == storev1.VolumeDeleting {
				continue // on its way out: nothing to move
			}
			mv := move.Volume{ID: v.Name, Store: storeName, SizeBytes: max(v.Spec.CapacityBytes, v.Status.ActualBytes),
				Protocol: move.ProtocolLocal, Snapshots: b.cl.snapshotsOf[v.Name]}
			if v.Spec.Policy.ProtocolSpec.NVMeoFTCP != nil {
				mv.Protocol = move.ProtocolNVMeoF
			}
			pl := b.after.places[v.Spec.Policy.Placement]
			r := rendered[storeName]
			switch {
			case pl != nil && pl.Spec.ExistingVolumes == policyv1.ExistingVolumesMove && v.Spec.Policy.Pool != pl.Spec.PoolRef.Name:
				mv.TargetPool = pl.Spec.PoolRef.Name
				mv.Cause = move.Cause{Kind: "Placement", Name: pl.Name, Field: "spec.existingVolumes"}
			case r != nil && r.Spec.Evacuate:
				mv.TargetPool = r.Spec.Pool
				mv.Cause = move.Cause{Kind: "StoragePool", Name: r.Spec.Pool, Field: "spec.evacuateNodes"}
			default:
				continue
			}
			if pv := b.cl.pvByID[v.Name]; pv != nil {
				mv.PV = pv.Name
				if c := pv.Spec.ClaimRef; c != nil {
					mv.Claim = c.Namespace + "/" + c.Name
				}
				mv.Consumers = b.cl.attachedTo[pv.Name]
			}
			vols = append(vols, mv)
		}
	}
	if len(vols) == 0 {
		return nil
	}
	res, err := move.Plan(stores, vols, move.Options{AssumedRate: rate})
	if err != nil {
		return err
	}
	b.rep.Storage.Moves = res
	for _, m := range res.Moves {
		if m.Disruption != move.DisruptionBlocked || !b.causedHere(m.Cause.Kind, m.Cause.Name) {
			continue // a move blocked already before this change stays in the plan, not a violation
		}
		what := "volume " + m.Volume
		if m.Claim != "" {
			what += " (PVC " + m.Claim + ")"
		}
		b.violation(blockedRules[m.Blocked], m.Cause.Kind, m.Cause.Name, m.Cause.Field, fmt.Sprintf(
			"%s on Store %s cannot move to pool %s: %s", what, m.Source, m.Pool, m.Reason))
	}
	return nil
}

// sortedKeys returns the keys of a and b, sorted, once each.
func sortedKeys[V, W any](a map[string]V, b map[string]W) []string {
	seen := map[string]bool{}
	for k := range a {
		seen[k] = true
	}
	for k := range b {
		seen[k] = true
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// causedHere reports whether the policy object kind/name is new in the proposed tree or its
// spec differs from the live one: a violation is reported only when this change causes it,
// so an evacuation already merged whose moves stay blocked does not fail every later change.
func (b *builder) causedHere(kind, name string) bool {
	switch kind {
	case "StoragePool":
		old, cur := b.before.pools[name], b.after.pools[name]
		return old == nil || cur != nil && len(specPaths(&old.Spec, &cur.Spec)) > 0
	case "Placement":
		old, cur := b.before.places[name], b.after.places[name]
		return old == nil || cur != nil && len(specPaths(&old.Spec, &cur.Spec)) > 0
	}
	return true
}
