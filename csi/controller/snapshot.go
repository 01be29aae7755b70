package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Snapshots (CSI CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, GET_SNAPSHOT) are VolumeSnapshotState
// objects: CreateSnapshot creates one on the Store of the source volume and waits (watch, no
// polling) until that node's agent reports it ready to use; DeleteSnapshot deletes it and waits
// until the agent removed it from the backend and released its finalizer. A snapshot lives on
// its source's Store; volumes restored or cloned from it are made on that Store too.

// snapshotsSupported says why volumes of backend b can have no snapshots or clones, or "".
// Thick (linear) LVM LVs have none: an LVM snapshot of a linear LV is a copy-on-write
// volume of fixed size that fails when full, no safe base for a restore that outlives it.
// Raw partitions and disks have none either: nothing below them keeps a point in time. The
// capabilities are the driver's, not a class's, so such requests are INVALID_ARGUMENT.
func snapshotsSupported(b policyv1.Backend) string {
	if b.LVM != nil && b.LVM.ThinPool == nil {
		return fmt.Sprintf("volume group %s has no thin pool: thick LVM volumes have no snapshots or clones (use a pool with lvm.thinPool)", b.LVM.VolumeGroup)
	}
	if b.Raw != nil {
		return "raw partitions and disks have no snapshots or clones (use a pool with lvm.thinPool, zfs or file)"
	}
	return ""
}

func (s *Service) CreateSnapshot(ctx context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	name, src := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "name is required")
	}
	if src == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "source volume id is required")
	}
	id := storev1.SnapshotID(name)
	h, err := s.snapshots.OpenLive(ctx, id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if ss := h.State; ss != nil {
		if ss.Spec.CSIName != name {
			return nil, volume.Errorf(volume.ErrExists, "snapshot id %s belongs to another name", id)
		}
		if ss.Spec.SourceVolume != src {
			return nil, volume.Errorf(volume.ErrExists, "snapshot %q exists of volume %s, not %s", name, ss.Spec.SourceVolume, src)
		}
		if ss.DeletionTimestamp != nil {
			return nil, volume.Errorf(volume.ErrConflict, "snapshot %s is being deleted", id)
		}
		return s.answerSnapshot(ctx, h)
	}
	ss, err := s.newSnapshotState(ctx, req, id)
	if err != nil {
		return nil, err
	}
	if err := h.Create(ctx, ss); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, volume.Errorf(volume.ErrConflict, "snapshot %s is being created by another call", id)
		}
		return nil, volume.Errorf(volume.ErrInternal, "create VolumeSnapshotState %s: %v", id, err)
	}
	return s.answerSnapshot(ctx, h)
}

// newSnapshotState makes the VolumeSnapshotState id of a new snapshot for req, once its source
// volume is ready: on the source's Store and, for a local volume, accessible on its node only.
func (s *Service) newSnapshotState(ctx context.Context, req *csipb.CreateSnapshotRequest, id string) (*storev1.VolumeSnapshotState, error) {
	name, src := req.GetName(), req.GetSourceVolumeId()
	vs, err := s.volumes.Get(ctx, src)
	if err != nil {
		return nil, err
	}
	if vs == nil {
		return nil, volume.Errorf(volume.ErrNotFound, "source volume %s does not exist", src)
	}
	if why := snapshotsSupported(vs.Spec.Policy.Backend); why != "" {
		return nil, volume.Errorf(volume.ErrInvalid, "snapshot of volume %s: %s", src, why)
	}
	node, err := s.storeNode(ctx, vs)
	if err != nil {
		return nil, err
	}
	accessible := ""
	if !isNVMe(vs) {
		accessible = node
		if reqd := topologyNodes(req.GetAccessibilityRequirements().GetRequisite()); len(reqd) > 0 && !slices.Contains(reqd, node) {
			return nil, volume.Errorf(volume.ErrInvalid, "local volume %s lives on node %s, outside the requested topology %v: its snapshot can only be there", src, node, reqd)
		}
	}
	if vs.DeletionTimestamp != nil {
		return nil, volume.Errorf(volume.ErrPrecondition, "source volume %s is being deleted", src)
	}
	if err := s.volumes.Watch(ctx, src, volume.ReadyOrFailed); err != nil {
		return nil, volume.WaitError("snapshot source volume "+src, err)
	}
	enc, origin := snapshotEncryption(vs, id)
	return &storev1.VolumeSnapshotState{
		ObjectMeta: metav1.ObjectMeta{
			Name: id,
			Labels: map[string]string{
				policyv1.LabelPool: storev1.NameLabelValue(vs.Spec.Policy.Pool),
				policyv1.LabelNode: storev1.NameLabelValue(node),
			},
		},
		Spec: storev1.VolumeSnapshotStateSpec{CSIName: name, SourceVolume: src, Encryption: enc, KeyOrigin: origin, StoreName: vs.Spec.StoreName, Pool: vs.Spec.Policy.Pool, AccessibleNode: accessible},
	}, nil
}

// answerSnapshot waits from h.State on until the agent took the snapshot and answers
// CreateSnapshot. A snapshot the agent had no room for, or that its backend cannot take, is
// deleted so that a retry starts afresh.
func (s *Service) answerSnapshot(ctx context.Context, h *volume.Handle[*storev1.VolumeSnapshotState]) (*csipb.CreateSnapshotResponse, error) {
	id := h.ID
	var ready *storev1.VolumeSnapshotState
	err := h.WaitFrom(ctx, h.State, func(ss *storev1.VolumeSnapshotState) (bool, error) {
		ok, err := volume.SnapshotReady(ss)
		if ok {
			ready = ss
		}
		return ok, err
	})
	if errors.Is(err, volume.ErrAgentNoRoom) || errors.Is(err, volume.ErrSnapshotUnsupported) {
		if derr := h.Delete(ctx); derr != nil && !apierrors.IsNotFound(derr) {
			s.log.Error(derr, "delete VolumeSnapshotState that could not be taken", "snapshot", id)
		}
	}
	if errors.Is(err, volume.ErrSnapshotUnsupported) {
		return nil, volume.Errorf(volume.ErrInvalid, "create snapshot %s: %v", id, err)
	}
	if err != nil {
		return nil, volume.WaitError("create snapshot "+id, err)
	}
	if err := s.ensureSnapshotKey(ctx, ready); err != nil {
		return nil, err
	}
	return &csipb.CreateSnapshotResponse{Snapshot: csiSnapshot(ready)}, nil
}

// snapshotEncryption is the frozen encryption and key origin of snapshot id of volume vs
// (nil, nil for a clear volume): the source's encryption, its header's labels (the source's id
// first) and, when the source has a key of its own, a key Secret of the snapshot's own that
// copies it (ensureSnapshotKey), so that a restore opens after the source is deleted.
func snapshotEncryption(vs *storev1.VolumeState, id string) (*policyv1.Encryption, *storev1.KeyOrigin) {
	e := vs.Spec.Policy.Encryption
	if e == nil {
		return nil, nil
	}
	enc := e.DeepCopy()
	if isVolumeKey(e.KeySecret) {
		enc.KeySecret = &policyv1.SecretReference{Name: policyv1.VolumeKeyPrefix + id, Namespace: policyv1.VolumeKeyNamespace}
	}
	return enc, keyOrigin(volumeHeaderLabels(vs), e.KeySecret, enc.KeySecret)
}

// csiSnapshot is the CSI view of a VolumeSnapshotState; its size and readiness are what the
// agent read from the backend.
func csiSnapshot(ss *storev1.VolumeSnapshotState) *csipb.Snapshot {
	t := ss.CreationTimestamp.Time
	if ss.Status.CreationTime != nil {
		t = ss.Status.CreationTime.Time
	}
	snap := &csipb.Snapshot{
		SnapshotId:     ss.Name,
		SourceVolumeId: ss.Spec.SourceVolume,
		SizeBytes:      max(ss.Status.SizeBytes-headerBytes(ss.Spec.Encryption), 0), // what a restore gives (key.go)
		CreationTime:   timestamppb.New(t),
		ReadyToUse:     ss.Status.ReadyToUse && ss.DeletionTimestamp == nil,
	}
	if n := ss.Spec.AccessibleNode; n != "" {
		snap.AccessibleTopology = []*csipb.Topology{{Segments: map[string]string{policyv1.TopologyKeyNode: n}}}
	}
	return snap
}

func (s *Service) DeleteSnapshot(ctx context.Context, req *csipb.DeleteSnapshotRequest) (*csipb.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "snapshot id is required")
	}
	if !storev1.IsSnapshotID(id) {
		return &csipb.DeleteSnapshotResponse{}, nil // never ours: nothing to delete
	}
	h, err := s.snapshots.Open(id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var store string
	if h.ReadLive(ctx) == nil && h.Exists() {
		store = h.State.Spec.StoreName
	}
	if err := h.Delete(ctx); err != nil {
		if apierrors.IsNotFound(err) {
			return &csipb.DeleteSnapshotResponse{}, nil
		}
		return nil, volume.Errorf(volume.ErrUnavailable, "delete VolumeSnapshotState %s: %v", id, err)
	}
	// As DeleteVolume: an agent that cannot answer would keep this call for the whole wait.
	if why, _ := s.storeAgentAbsent(ctx, store); why != "" {
		return nil, volume.Errorf(volume.ErrUnavailable, "delete snapshot %s: marked for deletion, but %s; the agent deletes it when it reports again", id, why)
	}
	if err := h.Wait(ctx, func(ss *storev1.VolumeSnapshotState) (bool, error) { return ss == nil, nil }); err != nil {
		return nil, volume.WaitError("delete snapshot "+id, err)
	}
	return &csipb.DeleteSnapshotResponse{}, nil
}

func (s *Service) GetSnapshot(ctx context.Context, req *csipb.GetSnapshotRequest) (*csipb.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "snapshot id is required")
	}
	ss, err := s.snapshots.Get(ctx, id)
	if ss == nil && (err == nil || !storev1.IsSnapshotID(id)) {
		return nil, volume.Errorf(volume.ErrNotFound, "snapshot %s does not exist", id)
	}
	if err != nil {
		return nil, err
	}
	return &csipb.GetSnapshotResponse{Snapshot: csiSnapshot(ss)}, nil
}

// ListSnapshots lists the snapshots by id, filtered by snapshot id or source volume id; the
// token is the last id of the previous page, like ListVolumes. It reads the API server, not the
// informer cache: a snapshot DeleteSnapshot just answered for is no longer listed.
func (s *Service) ListSnapshots(ctx context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, volume.Errorf(volume.ErrInvalid, "max_entries must not be negative")
	}
	var list storev1.VolumeSnapshotStateList
	if err := s.live.List(ctx, &list); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list VolumeSnapshotStates: %v", err)
	}
	items := slices.DeleteFunc(list.Items, func(ss storev1.VolumeSnapshotState) bool {
		return (req.GetSnapshotId() != "" && ss.Name != req.GetSnapshotId()) ||
			(req.GetSourceVolumeId() != "" && ss.Spec.SourceVolume != req.GetSourceVolumeId())
	})
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		if !storev1.IsSnapshotID(tok) {
			return nil, volume.Errorf(volume.ErrConflict, "starting token %q is not valid", tok)
		}
		start = sort.Search(len(items), func(i int) bool { return items[i].Name > tok })
	}
	end := len(items)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &csipb.ListSnapshotsResponse{}
	for i := start; i < end; i++ {
		resp.Entries = append(resp.Entries, &csipb.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(&items[i])})
	}
	if end < len(items) && end > start {
		resp.NextToken = items[end-1].Name
	}
	return resp, nil
}
