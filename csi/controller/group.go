package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Group snapshots (CSI GroupController, CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT). A group
// snapshot has no object of its own: it is its member VolumeSnapshotStates, one per source
// volume (id GroupMemberSnapshotID), labelled storage.plinth.dev/group=<group id> and listing
// every member's id in spec.groupMembers. The node agent takes all members in one
// crash-consistent operation of the Store's backend (docs/design.md#group-snapshots) once
// every member object exists; each member is then a snapshot like any other (GetSnapshot,
// ListSnapshots, a CreateVolume content source). All members must be on one Store: members on
// several Stores are refused with FAILED_PRECONDITION, since nothing yet makes their instants
// one, and so are groups of several thin LVs (lvm2 takes one thin snapshot per command, and an
// origin suspended outside lvm2 makes lvcreate skip the thin pool's create_snap message, leaving
// the pool's transaction id behind lvm2's metadata). DeleteVolumeGroupSnapshot deletes every
// member.

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
// name exists with other sources), FAILED_PRECONDITION (sources on several Stores, several
// thin LVs, or a source being deleted), ABORTED (the group is being deleted or created by another call), and the agent's
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
		if err := g.createMembers(ctx, name, id, sorted, memberIDs, existing); err != nil {
			return nil, err
		}
	}
	return g.answer(ctx, id, memberIDs)
}

// createMembers creates the member objects that do not exist yet, after checking every source:
// all exist (else NOT_FOUND naming the first missing one, and nothing is created), take
// snapshots, are ready, and share one Store.
func (g *GroupService) createMembers(ctx context.Context, name, id string, srcs, memberIDs []string, existing []storev1.VolumeSnapshotState) error {
	s := g.s
	var objs []*storev1.VolumeSnapshotState
	store := ""
	for _, src := range srcs {
		ss, err := s.newSnapshotState(ctx, &csipb.CreateSnapshotRequest{Name: id + "/" + src, SourceVolumeId: src}, storev1.GroupMemberSnapshotID(id, src))
		if err != nil {
			if volume.KindOf(err) == volume.ErrNotFound {
				return volume.Errorf(volume.ErrNotFound, "group snapshot %q: source volume %s does not exist; no member was taken", name, src)
			}
			return fmt.Errorf("group snapshot %q: %w", name, err)
		}
		if vs, err := s.volumes.Get(ctx, src); err == nil && vs != nil && vs.Spec.Policy.Backend.LVM != nil && len(srcs) > 1 {
			return volume.Errorf(volume.ErrPrecondition, "group snapshot %q: volume %s is a thin LVM volume: Plinth does not take group snapshots of several thin LVs yet, since lvm2 snapshots one origin per command and origins suspended outside it lose the thin pool's messages (a group of one volume, or of zvols or files of one store, is taken)", name, src)
		}
		if store != "" && ss.Spec.StoreName != store {
			return volume.Errorf(volume.ErrPrecondition, "group snapshot %q: source volumes are on stores %s and %s: a group snapshot spanning stores would not be crash-consistent, and Plinth takes it only when all volumes share one store", name, store, ss.Spec.StoreName)
		}
		store = ss.Spec.StoreName
		ss.Labels[storev1.LabelGroup] = id
		ss.Spec.Group = id
		ss.Spec.GroupMembers = memberIDs
		objs = append(objs, ss)
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
