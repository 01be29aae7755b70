package csi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

func (s *controller) CreateSnapshot(ctx context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	name, src := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "name is required")
	}
	if src == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "source volume id is required")
	}
	id := storev1.SnapshotID(name)
	h, err := s.d.snapshots.OpenLive(ctx, id)
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
func (s *controller) newSnapshotState(ctx context.Context, req *csipb.CreateSnapshotRequest, id string) (*storev1.VolumeSnapshotState, error) {
	name, src := req.GetName(), req.GetSourceVolumeId()
	vs, err := s.d.volumes.Get(ctx, src)
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
	if err := s.d.volumes.Watch(ctx, src, volume.ReadyOrFailed); err != nil {
		return nil, volume.WaitError("snapshot source volume "+src, err)
	}
	return &storev1.VolumeSnapshotState{
		ObjectMeta: metav1.ObjectMeta{
			Name: id,
			Labels: map[string]string{
				policyv1.LabelPool: storev1.NameLabelValue(vs.Spec.Policy.Pool),
				policyv1.LabelNode: storev1.NameLabelValue(node),
			},
		},
		Spec: storev1.VolumeSnapshotStateSpec{CSIName: name, SourceVolume: src, StoreName: vs.Spec.StoreName, Pool: vs.Spec.Policy.Pool, AccessibleNode: accessible},
	}, nil
}

// answerSnapshot waits from h.State on until the agent took the snapshot and answers
// CreateSnapshot. A snapshot the agent had no room for, or that its backend cannot take, is
// deleted so that a retry starts afresh.
func (s *controller) answerSnapshot(ctx context.Context, h *volume.Handle[*storev1.VolumeSnapshotState]) (*csipb.CreateSnapshotResponse, error) {
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
			s.d.log.Error(derr, "delete VolumeSnapshotState that could not be taken", "snapshot", id)
		}
	}
	if errors.Is(err, volume.ErrSnapshotUnsupported) {
		return nil, volume.Errorf(volume.ErrInvalid, "create snapshot %s: %v", id, err)
	}
	if err != nil {
		return nil, volume.WaitError("create snapshot "+id, err)
	}
	return &csipb.CreateSnapshotResponse{Snapshot: csiSnapshot(ready)}, nil
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
		SizeBytes:      ss.Status.SizeBytes,
		CreationTime:   timestamppb.New(t),
		ReadyToUse:     ss.Status.ReadyToUse && ss.DeletionTimestamp == nil,
	}
	if n := ss.Spec.AccessibleNode; n != "" {
		snap.AccessibleTopology = []*csipb.Topology{{Segments: map[string]string{policyv1.TopologyKeyNode: n}}}
	}
	return snap
}

func (s *controller) DeleteSnapshot(ctx context.Context, req *csipb.DeleteSnapshotRequest) (*csipb.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "snapshot id is required")
	}
	if !storev1.IsSnapshotID(id) {
		return &csipb.DeleteSnapshotResponse{}, nil // never ours: nothing to delete
	}
	h, err := s.d.snapshots.Open(id)
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

func (s *controller) GetSnapshot(ctx context.Context, req *csipb.GetSnapshotRequest) (*csipb.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "snapshot id is required")
	}
	ss, err := s.d.snapshots.Get(ctx, id)
	if ss == nil && (err == nil || !storev1.IsSnapshotID(id)) {
		return nil, volume.Errorf(volume.ErrNotFound, "snapshot %s does not exist", id)
	}
	if err != nil {
		return nil, err
	}
	return &csipb.GetSnapshotResponse{Snapshot: csiSnapshot(ss)}, nil
}

// ListSnapshots lists the snapshots by id, filtered by snapshot id or source volume id; the
// token is the last id of the previous page, like ListVolumes.
func (s *controller) ListSnapshots(ctx context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, volume.Errorf(volume.ErrInvalid, "max_entries must not be negative")
	}
	var list storev1.VolumeSnapshotStateList
	if err := s.d.kube.List(ctx, &list); err != nil {
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

// source is a CreateVolume content source resolved to the API objects: where the new volume
// must live and how small it may be.
type source struct {
	spec      storev1.ContentSource
	storeName string
	pool      string
	minBytes  int64 // the source's size: a restore or clone is never smaller
	what      string
}

// contentSource resolves a CreateVolume content source: NOT_FOUND when the snapshot or volume
// does not exist (CSI spec, CreateVolume errors), UNAVAILABLE while a snapshot is not ready to
// use, INVALID_ARGUMENT when its backend has no snapshots or clones.
func (s *controller) contentSource(ctx context.Context, cs *csipb.VolumeContentSource) (*source, error) {
	if snap := cs.GetSnapshot(); snap != nil {
		id := snap.GetSnapshotId()
		ss, err := s.d.snapshots.Get(ctx, id)
		if ss == nil && (err == nil || !storev1.IsSnapshotID(id)) {
			return nil, volume.Errorf(volume.ErrNotFound, "source snapshot %s does not exist", id)
		}
		if err != nil {
			return nil, err
		}
		if ss.DeletionTimestamp != nil {
			return nil, volume.Errorf(volume.ErrNotFound, "source snapshot %s is being deleted", id)
		}
		if !ss.Status.ReadyToUse {
			return nil, volume.Errorf(volume.ErrUnavailable, "source snapshot %s is not ready to use yet", id)
		}
		return &source{spec: storev1.ContentSource{Snapshot: id}, storeName: ss.Spec.StoreName, pool: ss.Spec.Pool,
			minBytes: ss.Status.SizeBytes, what: "snapshot " + id}, nil
	}
	if vol := cs.GetVolume(); vol != nil {
		id := vol.GetVolumeId()
		vs, err := s.d.volumes.Get(ctx, id)
		if vs == nil && (err == nil || !storev1.IsVolumeID(id)) {
			return nil, volume.Errorf(volume.ErrNotFound, "source volume %s does not exist", id)
		}
		if err != nil {
			return nil, err
		}
		if why := snapshotsSupported(vs.Spec.Policy.Backend); why != "" {
			return nil, volume.Errorf(volume.ErrInvalid, "clone of volume %s: %s", id, why)
		}
		if vs.DeletionTimestamp != nil {
			return nil, volume.Errorf(volume.ErrNotFound, "source volume %s is being deleted", id)
		}
		if ok, _ := volume.ReadyOrFailed(vs); !ok {
			return nil, volume.Errorf(volume.ErrUnavailable, "source volume %s is not ready yet", id)
		}
		return &source{spec: storev1.ContentSource{Volume: id}, storeName: vs.Spec.StoreName, pool: vs.Spec.Policy.Pool,
			minBytes: max(vs.Spec.CapacityBytes, vs.Status.ActualBytes), what: "volume " + id}, nil
	}
	return nil, volume.Errorf(volume.ErrInvalid, "volume content source names neither a snapshot nor a volume")
}

// sourceStore returns the Store a volume made from src must live on, with the volume's size:
// the source's own Store (the data is there), in the StorageClass's pool; for a local class
// only when the requested topology allows that node (a local volume cannot reach another
// node); for NVMe-oF the volume is made on the storage node and exported to the consumer. The
// size is the request rounded to the store's unit, or the source's size when none is given;
// a request that rounds below the source's size is OUT_OF_RANGE.
func sourceStore(src *source, stores []storev1.Store, pool string, nvme bool, strategy policyv1.Strategy, req *csipb.TopologyRequirement, required, limit int64) (*storev1.Store, int64, error) {
	if src.pool != pool {
		return nil, 0, volume.Errorf(volume.ErrInvalid, "%s lives in pool %q; the StorageClass asks for pool %q: a restore or clone stays in its source's pool", src.what, src.pool, pool)
	}
	i := slices.IndexFunc(stores, func(st storev1.Store) bool { return st.Name == src.storeName })
	if i < 0 {
		return nil, 0, volume.Errorf(volume.ErrPrecondition, "store %s of %s is gone", src.storeName, src.what)
	}
	st := stores[i]
	if !nvme {
		var allowed []string
		if pref := topologyNodes(req.GetPreferred()); len(pref) > 0 {
			allowed = pref[:1]
		} else {
			allowed = topologyNodes(req.GetRequisite())
		}
		if allowed != nil && !slices.Contains(allowed, st.Spec.NodeName) {
			return nil, 0, volume.Errorf(volume.ErrInvalid,
				"%s lives on node %s, but the volume is asked for on %v: a volume of a local class is made where its source is and cannot reach another node (use an NVMe-oF class to restore across nodes)",
				src.what, st.Spec.NodeName, allowed)
		}
	}
	if required == 0 {
		required = src.minBytes
	}
	unit := st.Status.ExtentBytes
	if unit <= 0 {
		unit = DefaultExtentBytes
	}
	size, err := RoundSize(required, limit, unit)
	if err != nil {
		return nil, 0, volume.Errorf(volume.ErrOutOfRange, "%w", err)
	}
	if size < src.minBytes {
		return nil, 0, volume.Errorf(volume.ErrOutOfRange, "%d bytes asked (%d after rounding to the store's unit of %d): smaller than the %d bytes of %s", required, size, unit, src.minBytes, src.what)
	}
	store, size, err := chooseStore([]storev1.Store{st}, true, strategy, nil, size, limit)
	if err != nil {
		return nil, 0, err
	}
	return store, size, nil
}

// sameSource reports whether a CreateVolume content source names what spec holds (both may be
// empty): a volume that exists under the name with another source is ALREADY_EXISTS.
func sameSource(cs *csipb.VolumeContentSource, spec *storev1.ContentSource) bool {
	var want storev1.ContentSource
	if cs != nil {
		want = storev1.ContentSource{Snapshot: cs.GetSnapshot().GetSnapshotId(), Volume: cs.GetVolume().GetVolumeId()}
	}
	var have storev1.ContentSource
	if spec != nil {
		have = *spec
	}
	return want == have
}

// storeAgentAbsent says why the agent of a Store cannot answer now: the Node of the Store no
// longer exists (nodeGone), or the Store's heartbeat is older than agentSilentAfter. "" means it
// may answer, also when that cannot be told (no Store, no heartbeat yet): then callers wait as
// before. Store and Node are read directly: an informer a moment behind would see a deleted
// Node still there.
func (s *controller) storeAgentAbsent(ctx context.Context, store string) (why string, nodeGone bool) {
	if store == "" {
		return "", false
	}
	var st storev1.Store
	if err := s.d.live.Get(ctx, client.ObjectKey{Name: store}, &st); err != nil {
		return "", false
	}
	var n corev1.Node
	if err := s.d.live.Get(ctx, client.ObjectKey{Name: st.Spec.NodeName}, &n); apierrors.IsNotFound(err) {
		return fmt.Sprintf("node %s of store %s no longer exists", st.Spec.NodeName, st.Name), true
	}
	if hb := st.Status.LastHeartbeatTime; hb != nil && time.Since(hb.Time) > agentSilentAfter {
		return fmt.Sprintf("the agent of node %s has not reported since %s", st.Spec.NodeName, hb.UTC().Format(time.RFC3339)), false
	}
	return "", false
}
