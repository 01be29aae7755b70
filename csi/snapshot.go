package csi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Snapshots (CSI CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, GET_SNAPSHOT) are VolumeSnapshotState
// objects: CreateSnapshot creates one on the Store of the source volume and waits (watch, no
// polling) until that node's agent reports it ready to use; DeleteSnapshot deletes it and waits
// until the agent removed it from the backend and released its finalizer. A snapshot lives on
// its source's Store; volumes restored or cloned from it are made on that Store too.

// waitSnapshot is waitVolume for a VolumeSnapshotState (through waitOn): done sees the live state (nil when
// absent), then every state the informer delivers, until it says finished or fails, or the
// wait is over. States of an earlier object of the same name are ignored once one is known.
func (d *Driver) waitSnapshot(ctx context.Context, name string, ss *storev1.VolumeSnapshotState, ch <-chan *storev1.VolumeSnapshotState, done func(*storev1.VolumeSnapshotState) (bool, error)) error {
	// The first read counts against the wait too.
	ctx, cancel := context.WithTimeout(ctx, d.opts.WaitTimeout)
	defer cancel()
	if ch == nil {
		c, unsubscribe := d.snaps.subscribe(name)
		defer unsubscribe()
		ch = c
		ss = &storev1.VolumeSnapshotState{}
		if err := d.live.Get(ctx, client.ObjectKey{Name: name}, ss); apierrors.IsNotFound(err) {
			ss = nil
		} else if err != nil {
			return err
		}
	}
	return waitOn(ctx, d.opts.WaitTimeout, ch, ss, done)
}

// snapshotReady is the wait condition of CreateSnapshot: ready to use, or failed.
func snapshotReady(ss *storev1.VolumeSnapshotState) (bool, error) {
	if ss == nil {
		return false, nil
	}
	if ss.Status.ReadyToUse && ss.Status.ObservedGeneration >= ss.Generation {
		return true, nil
	}
	if c := meta.FindStatusCondition(ss.Status.Conditions, storev1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
		switch c.Reason {
		case storev1.ReasonInsufficientCapacity:
			return false, fmt.Errorf("%w: %s", errCapacity, c.Message)
		case storev1.ReasonSnapshotUnsupported:
			return false, fmt.Errorf("%w: %s", errSnapshotUnsupported, c.Message)
		case storev1.ReasonSnapshotFailed:
			return false, fmt.Errorf("agent reports the snapshot failed: %s", c.Message)
		}
	}
	return false, nil
}

var errSnapshotUnsupported = errors.New("the backend takes no snapshots")

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
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if src == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume id is required")
	}
	id := storev1.SnapshotID(name)
	release, err := s.d.locks.acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()

	ch, unsubscribe := s.d.snaps.subscribe(id)
	defer unsubscribe()
	ss := &storev1.VolumeSnapshotState{}
	switch err := s.d.live.Get(ctx, client.ObjectKey{Name: id}, ss); {
	case err == nil:
		if ss.Spec.CSIName != name {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot id %s belongs to another name", id)
		}
		if ss.Spec.SourceVolume != src {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists of volume %s, not %s", name, ss.Spec.SourceVolume, src)
		}
		if ss.DeletionTimestamp != nil {
			return nil, status.Errorf(codes.Aborted, "snapshot %s is being deleted", id)
		}
		return s.answerSnapshot(ctx, id, ss, ch)
	case !apierrors.IsNotFound(err):
		return nil, status.Errorf(codes.Unavailable, "read VolumeSnapshotState %s: %v", id, err)
	}

	vs := &storev1.VolumeState{}
	if err := s.d.live.Get(ctx, client.ObjectKey{Name: src}, vs); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, status.Errorf(codes.NotFound, "source volume %s does not exist", src)
		}
		return nil, status.Errorf(codes.Unavailable, "read VolumeState %s: %v", src, err)
	}
	if why := snapshotsSupported(vs.Spec.Policy.Backend); why != "" {
		return nil, status.Errorf(codes.InvalidArgument, "snapshot of volume %s: %s", src, why)
	}
	node, err := s.storeNode(ctx, vs)
	if err != nil {
		return nil, err
	}
	accessible := ""
	if !isNVMe(vs) {
		accessible = node
		if reqd := topologyNodes(req.GetAccessibilityRequirements().GetRequisite()); len(reqd) > 0 && !slices.Contains(reqd, node) {
			return nil, status.Errorf(codes.InvalidArgument, "local volume %s lives on node %s, outside the requested topology %v: its snapshot can only be there", src, node, reqd)
		}
	}
	if vs.DeletionTimestamp != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "source volume %s is being deleted", src)
	}
	if err := s.d.waitVolume(ctx, src, readyOrFailed); err != nil {
		return nil, waitError("snapshot source volume "+src, err)
	}
	ss = &storev1.VolumeSnapshotState{
		ObjectMeta: metav1.ObjectMeta{
			Name: id,
			Labels: map[string]string{
				policyv1.LabelPool: storev1.NameLabelValue(vs.Spec.Policy.Pool),
				policyv1.LabelNode: storev1.NameLabelValue(node),
			},
		},
		Spec: storev1.VolumeSnapshotStateSpec{CSIName: name, SourceVolume: src, StoreName: vs.Spec.StoreName, Pool: vs.Spec.Policy.Pool, AccessibleNode: accessible},
	}
	if err := s.d.kube.Create(ctx, ss); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, status.Errorf(codes.Aborted, "snapshot %s is being created by another call", id)
		}
		return nil, status.Errorf(codes.Internal, "create VolumeSnapshotState %s: %v", id, err)
	}
	return s.answerSnapshot(ctx, id, ss, ch)
}

// answerSnapshot waits until the agent took the snapshot and answers CreateSnapshot. A
// snapshot the agent had no room for, or that its backend cannot take, is deleted so that a
// retry starts afresh.
func (s *controller) answerSnapshot(ctx context.Context, id string, ss *storev1.VolumeSnapshotState, ch <-chan *storev1.VolumeSnapshotState) (*csipb.CreateSnapshotResponse, error) {
	var ready *storev1.VolumeSnapshotState
	err := s.d.waitSnapshot(ctx, id, ss, ch, func(ss *storev1.VolumeSnapshotState) (bool, error) {
		ok, err := snapshotReady(ss)
		if ok {
			ready = ss
		}
		return ok, err
	})
	if errors.Is(err, errCapacity) || errors.Is(err, errSnapshotUnsupported) {
		if derr := s.d.kube.Delete(ctx, &storev1.VolumeSnapshotState{ObjectMeta: metav1.ObjectMeta{Name: id}}); derr != nil && !apierrors.IsNotFound(derr) {
			s.d.log.Error(derr, "delete VolumeSnapshotState that could not be taken", "snapshot", id)
		}
	}
	if errors.Is(err, errSnapshotUnsupported) {
		return nil, status.Errorf(codes.InvalidArgument, "create snapshot %s: %v", id, err)
	}
	if err != nil {
		return nil, waitError("create snapshot "+id, err)
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
		return nil, status.Error(codes.InvalidArgument, "snapshot id is required")
	}
	if !storev1.IsSnapshotID(id) {
		return &csipb.DeleteSnapshotResponse{}, nil // never ours: nothing to delete
	}
	release, err := s.d.locks.acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	var store string
	if ss := (&storev1.VolumeSnapshotState{}); s.d.live.Get(ctx, client.ObjectKey{Name: id}, ss) == nil {
		store = ss.Spec.StoreName
	}
	if err := s.d.kube.Delete(ctx, &storev1.VolumeSnapshotState{ObjectMeta: metav1.ObjectMeta{Name: id}}); err != nil {
		if apierrors.IsNotFound(err) {
			return &csipb.DeleteSnapshotResponse{}, nil
		}
		return nil, status.Errorf(codes.Unavailable, "delete VolumeSnapshotState %s: %v", id, err)
	}
	// As DeleteVolume: an agent that cannot answer would keep this call for the whole wait.
	if why, _ := s.storeAgentAbsent(ctx, store); why != "" {
		return nil, status.Errorf(codes.Unavailable, "delete snapshot %s: marked for deletion, but %s; the agent deletes it when it reports again", id, why)
	}
	if err := s.d.waitSnapshot(ctx, id, nil, nil, func(ss *storev1.VolumeSnapshotState) (bool, error) { return ss == nil, nil }); err != nil {
		return nil, waitError("delete snapshot "+id, err)
	}
	return &csipb.DeleteSnapshotResponse{}, nil
}

func (s *controller) GetSnapshot(ctx context.Context, req *csipb.GetSnapshotRequest) (*csipb.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot id is required")
	}
	ss := &storev1.VolumeSnapshotState{}
	if err := s.d.live.Get(ctx, client.ObjectKey{Name: id}, ss); err != nil {
		if apierrors.IsNotFound(err) || !storev1.IsSnapshotID(id) {
			return nil, status.Errorf(codes.NotFound, "snapshot %s does not exist", id)
		}
		return nil, status.Errorf(codes.Unavailable, "read VolumeSnapshotState %s: %v", id, err)
	}
	return &csipb.GetSnapshotResponse{Snapshot: csiSnapshot(ss)}, nil
}

// ListSnapshots lists the snapshots by id, filtered by snapshot id or source volume id; the
// token is the last id of the previous page, like ListVolumes.
func (s *controller) ListSnapshots(ctx context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	var list storev1.VolumeSnapshotStateList
	if err := s.d.kube.List(ctx, &list); err != nil {
		return nil, status.Errorf(codes.Unavailable, "list VolumeSnapshotStates: %v", err)
	}
	items := slices.DeleteFunc(list.Items, func(ss storev1.VolumeSnapshotState) bool {
		return (req.GetSnapshotId() != "" && ss.Name != req.GetSnapshotId()) ||
			(req.GetSourceVolumeId() != "" && ss.Spec.SourceVolume != req.GetSourceVolumeId())
	})
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		if !storev1.IsSnapshotID(tok) {
			return nil, status.Errorf(codes.Aborted, "starting token %q is not valid", tok)
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
		ss := &storev1.VolumeSnapshotState{}
		if err := s.d.live.Get(ctx, client.ObjectKey{Name: id}, ss); err != nil {
			if apierrors.IsNotFound(err) || !storev1.IsSnapshotID(id) {
				return nil, status.Errorf(codes.NotFound, "source snapshot %s does not exist", id)
			}
			return nil, status.Errorf(codes.Unavailable, "read VolumeSnapshotState %s: %v", id, err)
		}
		if ss.DeletionTimestamp != nil {
			return nil, status.Errorf(codes.NotFound, "source snapshot %s is being deleted", id)
		}
		if !ss.Status.ReadyToUse {
			return nil, status.Errorf(codes.Unavailable, "source snapshot %s is not ready to use yet", id)
		}
		return &source{spec: storev1.ContentSource{Snapshot: id}, storeName: ss.Spec.StoreName, pool: ss.Spec.Pool,
			minBytes: ss.Status.SizeBytes, what: "snapshot " + id}, nil
	}
	if vol := cs.GetVolume(); vol != nil {
		id := vol.GetVolumeId()
		vs := &storev1.VolumeState{}
		if err := s.d.live.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil {
			if apierrors.IsNotFound(err) || !storev1.IsVolumeID(id) {
				return nil, status.Errorf(codes.NotFound, "source volume %s does not exist", id)
			}
			return nil, status.Errorf(codes.Unavailable, "read VolumeState %s: %v", id, err)
		}
		if why := snapshotsSupported(vs.Spec.Policy.Backend); why != "" {
			return nil, status.Errorf(codes.InvalidArgument, "clone of volume %s: %s", id, why)
		}
		if vs.DeletionTimestamp != nil {
			return nil, status.Errorf(codes.NotFound, "source volume %s is being deleted", id)
		}
		if ok, _ := readyOrFailed(vs); !ok {
			return nil, status.Errorf(codes.Unavailable, "source volume %s is not ready yet", id)
		}
		return &source{spec: storev1.ContentSource{Volume: id}, storeName: vs.Spec.StoreName, pool: vs.Spec.Policy.Pool,
			minBytes: max(vs.Spec.CapacityBytes, vs.Status.ActualBytes), what: "volume " + id}, nil
	}
	return nil, status.Error(codes.InvalidArgument, "volume content source names neither a snapshot nor a volume")
}

// sourceStore returns the Store a volume made from src must live on, with the volume's size:
// the source's own Store (the data is there), in the StorageClass's pool; for a local class
// only when the requested topology allows that node (a local volume cannot reach another
// node); for NVMe-oF the volume is made on the storage node and exported to the consumer. The
// size is the request rounded to the store's unit, or the source's size when none is given;
// a request that rounds below the source's size is OUT_OF_RANGE.
func sourceStore(src *source, stores []storev1.Store, pool string, nvme bool, strategy policyv1.Strategy, req *csipb.TopologyRequirement, required, limit int64) (*storev1.Store, int64, error) {
	if src.pool != pool {
		return nil, 0, status.Errorf(codes.InvalidArgument, "%s lives in pool %q; the StorageClass asks for pool %q: a restore or clone stays in its source's pool", src.what, src.pool, pool)
	}
	i := slices.IndexFunc(stores, func(st storev1.Store) bool { return st.Name == src.storeName })
	if i < 0 {
		return nil, 0, status.Errorf(codes.FailedPrecondition, "store %s of %s is gone", src.storeName, src.what)
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
			return nil, 0, status.Errorf(codes.InvalidArgument,
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
		return nil, 0, status.Error(codes.OutOfRange, err.Error())
	}
	if size < src.minBytes {
		return nil, 0, status.Errorf(codes.OutOfRange, "%d bytes asked (%d after rounding to the store's unit of %d): smaller than the %d bytes of %s", required, size, unit, src.minBytes, src.what)
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
