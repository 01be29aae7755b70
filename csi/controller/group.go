package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Group snapshots (CSI GroupController, CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT). A group
// snapshot has no object of its own: it is its member VolumeSnapshotStates, one per source
// volume (id GroupMemberSnapshotID), labelled storage.plinth.dev/group=<group id> and listing
// every member's id in spec.groupMembers. A group its Store's backend takes at one instant
// alone (one ZFS or file Store, one thin LV) is taken by the node agent in one crash-consistent
// backend operation once every member object exists; a group on several Stores, or of several
// thin LVs (lvm2 takes one thin snapshot per command, and an origin suspended outside lvm2 makes
// lvcreate skip the thin pool's create_snap message), is taken under a freeze of its consumers'
// filesystems by their node plugins (spec.freeze; docs/design.md#group-snapshots). Each member
// is then a snapshot like any other (GetSnapshot, ListSnapshots, a CreateVolume content source).
// DeleteVolumeGroupSnapshot deletes every member.

// GroupService is the CSI GroupController service; it shares the controller Service's access.
type GroupService struct {
	csipb.UnimplementedGroupControllerServer
	s *Service
}

// NewGroup returns the GroupController service of s.
func NewGroup(s *Service) *GroupService { return &GroupService{s: s} }

// maxGroupMembers bounds a group (the CRD's spec.groupMembers maxItems).
const maxGroupMembers = 64

func (g *GroupService) GroupControllerGetCapabilities(context.Context, *csipb.GroupControllerGetCapabilitiesRequest) (*csipb.GroupControllerGetCapabilitiesResponse, error) {
	return &csipb.GroupControllerGetCapabilitiesResponse{Capabilities: []*csipb.GroupControllerServiceCapability{{
		Type: &csipb.GroupControllerServiceCapability_Rpc{Rpc: &csipb.GroupControllerServiceCapability_RPC{
			Type: csipb.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}},
	}}}, nil
}

// CreateVolumeGroupSnapshot snapshots source_volume_ids at one instant. Errors: INVALID_ARGUMENT
// (no name, no or repeated source, more than 64, a backend without snapshots), NOT_FOUND
// naming the first source volume that does not exist (nothing is created), ALREADY_EXISTS (the
// name exists with other sources), FAILED_PRECONDITION (a source being deleted; in a group
// that needs the consumers' freeze, a raw block source usable on a node or one published to more
// than 16 nodes), INVALID_ARGUMENT also for a freeze timeout parameter out of 1-300 s, ABORTED (the group is being deleted or created by another call), and the agent's
// failure; on the agent's failure every member is deleted, so a retry takes the group afresh.
func (g *GroupService) CreateVolumeGroupSnapshot(ctx context.Context, req *csipb.CreateVolumeGroupSnapshotRequest) (*csipb.CreateVolumeGroupSnapshotResponse, error) {
	s := g.s
	name, srcs := req.GetName(), req.GetSourceVolumeIds()
	if name == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "name is required")
	}
	if len(srcs) == 0 {
		return nil, volume.Errorf(volume.ErrInvalid, "source volume ids are required")
	}
	if len(srcs) > maxGroupMembers {
		return nil, volume.Errorf(volume.ErrInvalid, "%d source volumes: a group snapshot has at most %d", len(srcs), maxGroupMembers)
	}
	sorted := slices.Sorted(slices.Values(srcs))
	if len(slices.Compact(slices.Clone(sorted))) != len(sorted) {
		return nil, volume.Errorf(volume.ErrInvalid, "source volume ids %v name a volume twice", srcs)
	}
	id := storev1.GroupSnapshotID(name)
	// the group's lock: one call per group at a time (members' locks are taken by their handles)
	gh, err := s.snapshots.Open(id)
	if err != nil {
		return nil, err
	}
	defer gh.Close()
	memberIDs := make([]string, len(sorted))
	bySrc := map[string]string{}
	for i, v := range sorted {
		memberIDs[i] = storev1.GroupMemberSnapshotID(id, v)
		bySrc[memberIDs[i]] = v
	}
	slices.Sort(memberIDs)
	existing, err := g.members(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, m := range existing {
		if !slices.Equal(m.Spec.GroupMembers, memberIDs) {
			return nil, volume.Errorf(volume.ErrExists, "group snapshot %q exists of other volumes than %v", name, srcs)
		}
		if m.DeletionTimestamp != nil {
			return nil, volume.Errorf(volume.ErrConflict, "group snapshot %s is being deleted", id)
		}
	}
	if len(existing) < len(memberIDs) {
		if err := g.createMembers(ctx, name, id, sorted, memberIDs, existing, req.GetParameters()); err != nil {
			return nil, err
		}
	}
	return g.answer(ctx, id, memberIDs)
}

// createMembers creates the member objects that do not exist yet, after checking every source:
// all exist (else NOT_FOUND naming the first missing one, and nothing is created), take
// snapshots and are ready. A group its backend cannot take at one instant alone (members on
// several Stores, or several thin LVs) gets spec.freeze on every member: the consumers' node
// plugins freeze the filesystems first (groupFreeze).
func (g *GroupService) createMembers(ctx context.Context, name, id string, srcs, memberIDs []string, existing []storev1.VolumeSnapshotState, params map[string]string) error {
	s := g.s
	timeout, err := freezeTimeout(params)
	if err != nil {
		return err
	}
	var objs []*storev1.VolumeSnapshotState
	var vols []*storev1.VolumeState
	stores := map[string]bool{}
	thin := 0
	for _, src := range srcs {
		ss, err := s.newSnapshotState(ctx, &csipb.CreateSnapshotRequest{Name: id + "/" + src, SourceVolumeId: src}, storev1.GroupMemberSnapshotID(id, src))
		if err != nil {
			if volume.KindOf(err) == volume.ErrNotFound {
				return volume.Errorf(volume.ErrNotFound, "group snapshot %q: source volume %s does not exist; no member was taken", name, src)
			}
			return fmt.Errorf("group snapshot %q: %w", name, err)
		}
		vs, err := s.volumes.Get(ctx, src)
		if err != nil || vs == nil {
			return volume.Errorf(volume.ErrUnavailable, "group snapshot %q: read source volume %s: %v", name, src, err)
		}
		if vs.Spec.Policy.Backend.LVM != nil {
			thin++
		}
		stores[ss.Spec.StoreName] = true
		ss.Labels[storev1.LabelGroup] = id
		ss.Spec.Group = id
		ss.Spec.GroupMembers = memberIDs
		objs = append(objs, ss)
		vols = append(vols, vs)
	}
	if len(stores) > 1 || thin > 1 {
		for i, vs := range vols {
			f, err := groupFreeze(name, vs, objs[i].Spec.AccessibleNode, timeout)
			if err != nil {
				return err
			}
			objs[i].Spec.Freeze = f
			objs[i].Labels[storev1.LabelGroupFreeze] = "true"
		}
	}
	for _, ss := range objs {
		if slices.ContainsFunc(existing, func(e storev1.VolumeSnapshotState) bool { return e.Name == ss.Name }) {
			continue
		}
		if err := s.kube.Create(ctx, ss); err != nil && !apierrors.IsAlreadyExists(err) {
			g.cleanup(ctx, id)
			return volume.Errorf(volume.ErrUnavailable, "create member %s of group snapshot %s: %v", ss.Name, id, err)
		}
	}
	return nil
}

// groupFreeze is the consumer freeze of source vs in group snapshot name: the nodes it is
// published to over NVMe-oF (spec.publications), or local's node, the only one a local
// volume is used on (its publication names that node too). A raw block volume is
// FAILED_PRECONDITION when it may be in use: it has no filesystem to freeze, and nothing else
// holds its writes across the group.
func groupFreeze(name string, vs *storev1.VolumeState, local string, timeout int32) (*storev1.GroupFreeze, error) {
	var nodes []string
	for _, p := range vs.Spec.Publications {
		nodes = append(nodes, p.NodeName)
	}
	if local != "" {
		nodes = []string{local}
	}
	nodes = slices.Compact(slices.Sorted(slices.Values(nodes)))
	if len(nodes) > maxFreezeNodes {
		return nil, volume.Errorf(volume.ErrPrecondition, "group snapshot %q: volume %s is published to %d nodes: a group freezes at most %d consumers per volume", name, vs.Name, len(nodes), maxFreezeNodes)
	}
	if vs.Spec.VolumeMode == "Block" && len(nodes) > 0 {
		return nil, volume.Errorf(volume.ErrPrecondition, "group snapshot %q: volume %s is a raw block volume usable on %v: a group on several stores or of several thin LVs is taken under a freeze of its consumers' filesystems, and a block volume has none (take such volumes on one ZFS store, or unpublish it)", name, vs.Name, nodes)
	}
	return &storev1.GroupFreeze{Nodes: nodes, TimeoutSeconds: timeout}, nil
}

// maxFreezeNodes bounds the consumers of one member (the CRD's spec.freeze.nodes maxItems).
const maxFreezeNodes = 16

// freezeTimeout reads the class parameter ParamFreezeTimeoutSeconds (seconds, 1 to 300;
// absent: the default). Errors: INVALID_ARGUMENT.
func freezeTimeout(params map[string]string) (int32, error) {
	v, ok := params[policyv1.ParamFreezeTimeoutSeconds]
	if !ok {
		return policyv1.DefaultFreezeTimeoutSeconds, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 1 || n > 300 {
		return 0, volume.Errorf(volume.ErrInvalid, "parameter %s=%q: want whole seconds from 1 to 300", policyv1.ParamFreezeTimeoutSeconds, v)
	}
	return int32(n), nil
}

// answer waits until every member is ready (or one failed: then all are deleted) and answers.
func (g *GroupService) answer(ctx context.Context, id string, memberIDs []string) (*csipb.CreateVolumeGroupSnapshotResponse, error) {
	s := g.s
	snaps := make([]*storev1.VolumeSnapshotState, len(memberIDs))
	for i, mid := range memberIDs {
		h, err := s.snapshots.Open(mid)
		if err != nil {
			return nil, err
		}
		if err := h.ReadLive(ctx); err != nil {
			h.Close()
			return nil, err
		}
		err = h.WaitFrom(ctx, h.State, func(ss *storev1.VolumeSnapshotState) (bool, error) {
			if ss == nil {
				return false, fmt.Errorf("member %s was deleted", mid)
			}
			ok, err := volume.SnapshotReady(ss)
			if ok {
				// taken under a consumer freeze: of the group's instant only if every freeze
				// held until the whole group was taken
				ok, err = volume.FreezeSettled(ss)
			}
			if ok {
				snaps[i] = ss
			}
			return ok, err
		})
		h.Close()
		if err != nil {
			if volume.KindOf(err) == volume.ErrTimeout || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return nil, volume.WaitError("create group snapshot "+id, err)
			}
			g.cleanup(ctx, id)
			if errors.Is(err, volume.ErrSnapshotUnsupported) {
				return nil, volume.Errorf(volume.ErrInvalid, "create group snapshot %s: %v", id, err)
			}
			return nil, volume.WaitError("create group snapshot "+id+" (its members were deleted: a retry takes it afresh)", err)
		}
		if err := s.ensureSnapshotKey(ctx, snaps[i]); err != nil {
			return nil, err
		}
	}
	return &csipb.CreateVolumeGroupSnapshotResponse{GroupSnapshot: csiGroup(id, snaps)}, nil
}

// cleanup deletes every member of group id (best effort: the agent removes what it took).
func (g *GroupService) cleanup(ctx context.Context, id string) {
	ctx = context.WithoutCancel(ctx)
	ms, err := g.members(ctx, id)
	if err != nil {
		g.s.log.Error(err, "list the members of a failed group snapshot", "group", id)
	}
	for i := range ms {
		if err := g.s.kube.Delete(ctx, &ms[i]); err != nil && !apierrors.IsNotFound(err) {
			g.s.log.Error(err, "delete a member of a failed group snapshot", "group", id, "snapshot", ms[i].Name)
		}
	}
}

// members lists group id's member objects, live.
func (g *GroupService) members(ctx context.Context, id string) ([]storev1.VolumeSnapshotState, error) {
	var list storev1.VolumeSnapshotStateList
	if err := g.s.live.List(ctx, &list, client.MatchingLabels{storev1.LabelGroup: id}); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list the members of group snapshot %s: %v", id, err)
	}
	return list.Items, nil
}

// csiGroup is the CSI view of a group's members; ready when all are, created when the last was.
func csiGroup(id string, members []*storev1.VolumeSnapshotState) *csipb.VolumeGroupSnapshot {
	gs := &csipb.VolumeGroupSnapshot{GroupSnapshotId: id, ReadyToUse: len(members) > 0}
	var t time.Time
	for _, m := range members {
		snap := csiSnapshot(m)
		snap.GroupSnapshotId = id
		gs.Snapshots = append(gs.Snapshots, snap)
		gs.ReadyToUse = gs.ReadyToUse && snap.ReadyToUse
		if ct := snap.CreationTime.AsTime(); ct.After(t) {
			t = ct
		}
	}
	gs.CreationTime = timestamppb.New(t)
	return gs
}

// DeleteVolumeGroupSnapshot deletes every member of the group and waits until the agent removed
// them. snapshot_ids, when given, must be the group's members (FAILED_PRECONDITION otherwise);
// an unknown group is success.
func (g *GroupService) DeleteVolumeGroupSnapshot(ctx context.Context, req *csipb.DeleteVolumeGroupSnapshotRequest) (*csipb.DeleteVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "group snapshot id is required")
	}
	if !storev1.IsGroupSnapshotID(id) {
		return &csipb.DeleteVolumeGroupSnapshotResponse{}, nil // never ours
	}
	gh, err := g.s.snapshots.Open(id)
	if err != nil {
		return nil, err
	}
	defer gh.Close()
	ms, err := g.members(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return &csipb.DeleteVolumeGroupSnapshotResponse{}, nil
	}
	if want := req.GetSnapshotIds(); len(want) > 0 {
		have := make([]string, len(ms))
		for i, m := range ms {
			have[i] = m.Name
		}
		if !slices.Equal(slices.Sorted(slices.Values(want)), slices.Sorted(slices.Values(have))) {
			return nil, volume.Errorf(volume.ErrPrecondition, "group snapshot %s has members %v, not %v", id, have, want)
		}
	}
	for _, m := range ms {
		if _, err := g.s.DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: m.Name}); err != nil {
			return nil, fmt.Errorf("delete group snapshot %s: %w", id, err)
		}
	}
	return &csipb.DeleteVolumeGroupSnapshotResponse{}, nil
}

// GetVolumeGroupSnapshot returns the group and its members. Errors: INVALID_ARGUMENT (no id),
// NOT_FOUND (no such group), FAILED_PRECONDITION (snapshot_ids given that are not its members).
func (g *GroupService) GetVolumeGroupSnapshot(ctx context.Context, req *csipb.GetVolumeGroupSnapshotRequest) (*csipb.GetVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "group snapshot id is required")
	}
	if !storev1.IsGroupSnapshotID(id) {
		return nil, volume.Errorf(volume.ErrNotFound, "group snapshot %s does not exist", id)
	}
	ms, err := g.members(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, volume.Errorf(volume.ErrNotFound, "group snapshot %s does not exist", id)
	}
	ptrs := make([]*storev1.VolumeSnapshotState, len(ms))
	names := make([]string, len(ms))
	for i := range ms {
		ptrs[i], names[i] = &ms[i], ms[i].Name
	}
	if want := req.GetSnapshotIds(); len(want) > 0 && !slices.Equal(slices.Sorted(slices.Values(want)), slices.Sorted(slices.Values(names))) {
		return nil, volume.Errorf(volume.ErrPrecondition, "group snapshot %s has members %v, not %v", id, names, want)
	}
	gs := csiGroup(id, ptrs)
	if n := len(ms[0].Spec.GroupMembers); n != len(ms) {
		gs.ReadyToUse = false // some members not created yet, or already deleted
	}
	return &csipb.GetVolumeGroupSnapshotResponse{GroupSnapshot: gs}, nil
}
