package csi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/internal/failpoint"
	"github.com/plinth-storage/plinth/internal/hostnqn"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Keys of the volume context (CreateVolume → PV volumeAttributes → NodeStage) and of the
// publish context (ControllerPublish → NodeStage/NodePublish).
const (
	// ContextKind is the protocol kind: "local" or "nvmeofTcp" (both contexts).
	ContextKind = "plinth.dev/protocol-kind"
	// ContextFSType is the filesystem the placement asked for (ext4, xfs).
	ContextFSType = "plinth.dev/fstype"
	// ContextMkfsOptions and ContextMountOptions are JSON lists of strings from the placement.
	ContextMkfsOptions  = "plinth.dev/mkfs-options"
	ContextMountOptions = "plinth.dev/mount-options"
	// PublishDevicePath is the local block device (local volumes).
	PublishDevicePath = "devicePath"
	// PublishNQN, PublishAddress and PublishPort locate an NVMe-oF/TCP export.
	PublishNQN     = "nqn"
	PublishAddress = "address"
	PublishPort    = "port"
	// PublishCtrlLossTmo and PublishReconnectDelay carry the frozen protocol's timers (seconds).
	PublishCtrlLossTmo    = "ctrlLossTmo"
	PublishReconnectDelay = "reconnectDelay"
	// PublishQueueSize carries the frozen protocol's maxQueueSize: the I/O queue depth the node
	// connects with (queue_size, nvme connect --queue-size).
	PublishQueueSize = "queueSize"
	// PublishAuth is "DHHMACCHAP" when the frozen protocol asks for in-band authentication: the
	// node plugin then connects with its host Secret (never without); absent otherwise.
	// PublishAuthBidirectional is "true" when the host must authenticate the target too. The
	// secrets themselves never travel in the publish context (it is kept in VolumeAttachments).
	PublishAuth              = "auth"
	PublishAuthBidirectional = "authBidirectional"
	// PublishTargetNode names the storage node (the Node of the volume's Store): the node
	// plugin asks for its keys toward that node (docs/design.md#key-distribution).
	PublishTargetNode = "targetNode"
)

// controller is the CSI Controller service. It reads and writes only API objects.
type controller struct {
	csipb.UnimplementedControllerServer
	d *Driver
}

func (s *controller) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	var caps []*csipb.ControllerServiceCapability
	for _, c := range []csipb.ControllerServiceCapability_RPC_Type{
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csipb.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csipb.ControllerServiceCapability_RPC_GET_CAPACITY,
		csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		// snapshot.go
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csipb.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csipb.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csipb.ControllerServiceCapability_RPC_CLONE_VOLUME,
	} {
		caps = append(caps, &csipb.ControllerServiceCapability{Type: &csipb.ControllerServiceCapability_Rpc{Rpc: &csipb.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// supportedModes are RWO, RWOP (and SINGLE_NODE_MULTI_WRITER, which the capability brings),
// single-node read-only, and ROX.
var supportedModes = []csipb.VolumeCapability_AccessMode_Mode{
	csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
	csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
	csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
}

// checkCapabilities returns the volume mode ("Block" or "Filesystem") and the fs_type the
// capabilities ask for, or why they are unsupported.
func checkCapabilities(caps []*csipb.VolumeCapability) (mode, fsType string, err error) {
	if len(caps) == 0 {
		return "", "", errors.New("volume capabilities are required")
	}
	for _, c := range caps {
		if c.GetAccessMode() == nil || !slices.Contains(supportedModes, c.GetAccessMode().GetMode()) {
			return "", "", fmt.Errorf("access mode %v is not supported", c.GetAccessMode().GetMode())
		}
		m := ""
		switch {
		case c.GetBlock() != nil:
			m = "Block"
		case c.GetMount() != nil:
			m = "Filesystem"
			switch t := c.GetMount().GetFsType(); t {
			case "", "ext4", "xfs":
				if t != "" {
					if fsType != "" && fsType != t {
						return "", "", errors.New("capabilities ask for two filesystems")
					}
					fsType = t
				}
			default:
				return "", "", fmt.Errorf("filesystem %q is not supported (ext4, xfs)", t)
			}
		default:
			return "", "", errors.New("capability has neither block nor mount access type")
		}
		if mode != "" && mode != m {
			return "", "", errors.New("capabilities mix block and mount access")
		}
		mode = m
	}
	return mode, fsType, nil
}

func singleNode(m csipb.VolumeCapability_AccessMode_Mode) bool {
	return m != csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

func isNVMe(vs *storev1.VolumeState) bool { return vs.Spec.Policy.ProtocolSpec.NVMeoFTCP != nil }

func protocolKind(p policyv1.ProtocolSpec) string {
	if p.NVMeoFTCP != nil {
		return "nvmeofTcp"
	}
	return "local"
}

func (s *controller) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "name is required")
	}
	mode, capFS, err := checkCapabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, volume.Errorf(volume.ErrInvalid, "%w", err)
	}
	params := req.GetParameters()
	if params[policyv1.ParamPlacement] == "" || params[policyv1.ParamPool] == "" || params[policyv1.ParamProtocol] == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "StorageClass parameters %s, %s and %s are required", policyv1.ParamPlacement, policyv1.ParamPool, policyv1.ParamProtocol)
	}
	id := storev1.VolumeID(req.GetName())
	// The subscription comes with the lock, before any read or write: the agent's answer
	// cannot slip between them and the wait, and the state read or created is where the wait
	// starts (no second read).
	h, err := s.d.volumes.Open(id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	// The informer cache answers "new name" without a round trip; a volume the cache has not
	// seen yet still cannot be created twice: Create then fails with AlreadyExists below.
	if err := h.ReadCached(ctx); err != nil {
		return nil, err
	}
	if h.Exists() {
		if err := h.ReadLive(ctx); err != nil {
			return nil, err
		}
		if h.Exists() {
			return s.existingVolume(ctx, req, h, mode)
		}
	}
	vs, err := s.newVolumeState(ctx, req, id, mode, capFS)
	if err != nil {
		return nil, err
	}
	if err := h.Create(ctx, vs); err != nil {
		if apierrors.IsAlreadyExists(err) { // another controller replica won the race
			if err := h.ReadLive(ctx); err != nil {
				return nil, volume.Errorf(volume.ErrConflict, "VolumeState %s: %w", id, err)
			}
			if !h.Exists() {
				return nil, volume.Errorf(volume.ErrConflict, "VolumeState %s: created by another call and gone again", id)
			}
			return s.existingVolume(ctx, req, h, mode)
		}
		return nil, volume.Errorf(volume.ErrInternal, "create VolumeState %s: %w", id, err)
	}
	return s.answerCreated(ctx, h)
}

// newVolumeState makes the VolumeState id of a new volume for req: the live policy the
// StorageClass names frozen into it (with the PVC's overrides), on the store chosen for it
// (chooseStore, or sourceStore for a restore or clone), at the rounded size.
func (s *controller) newVolumeState(ctx context.Context, req *csipb.CreateVolumeRequest, id, mode, capFS string) (*storev1.VolumeState, error) {
	params := req.GetParameters()
	placementName, poolName, protocolName := params[policyv1.ParamPlacement], params[policyv1.ParamPool], params[policyv1.ParamProtocol]
	var placement policyv1.Placement
	var pool policyv1.StoragePool
	var protocol policyv1.Protocol
	for _, g := range []struct {
		name string
		obj  client.Object
	}{{placementName, &placement}, {poolName, &pool}, {protocolName, &protocol}} {
		if err := s.d.kube.Get(ctx, client.ObjectKey{Name: g.name}, g.obj); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, volume.Errorf(volume.ErrInvalid, "%T %q named by the StorageClass does not exist", g.obj, g.name)
			}
			return nil, volume.Errorf(volume.ErrUnavailable, "read %T %q: %v", g.obj, g.name, err)
		}
	}
	if placement.Spec.PoolRef.Name != poolName || placement.Spec.ProtocolRef.Name != protocolName {
		return nil, volume.Errorf(volume.ErrInvalid, "Placement %q refers to pool %q and protocol %q, the StorageClass to %q and %q",
			placementName, placement.Spec.PoolRef.Name, placement.Spec.ProtocolRef.Name, poolName, protocolName)
	}
	fs := placement.Spec.Filesystem
	if t := params[policyv1.ParamFSType]; t != "" {
		fs.FSType = t
	}
	if capFS != "" {
		fs.FSType = capFS
	}
	if fs.FSType == "" {
		fs.FSType = "ext4"
	}
	strategy := placement.Spec.Strategy
	ov, err := s.pvcOverrides(ctx, params, &placement, fs.FSType)
	if err != nil {
		return nil, err
	}
	ov.Apply(&fs, &strategy)
	store, size, src, err := s.placeVolume(ctx, req, poolName, protocol.Spec.NVMeoFTCP != nil, strategy)
	if err != nil {
		return nil, err
	}
	vs := &storev1.VolumeState{
		ObjectMeta: metav1.ObjectMeta{
			Name: id,
			// The agent's finalizer, set here: otherwise the agent's first act on a new
			// volume is a write of its own, one more per volume in a burst under its client
			// limit. The agent releases it also for a volume it never acted on.
			Finalizers: []string{storev1.FinalizerVolume},
			Labels: map[string]string{
				policyv1.LabelPool: storev1.NameLabelValue(poolName),
				policyv1.LabelNode: storev1.NameLabelValue(store.Spec.NodeName),
			},
		},
		Spec: storev1.VolumeStateSpec{
			CSIName:       req.GetName(),
			StoreName:     store.Name,
			CapacityBytes: size,
			VolumeMode:    mode,
			Policy: storev1.FrozenPolicy{
				Placement:    placementName,
				Pool:         poolName,
				Protocol:     protocolName,
				Backend:      pool.Spec.Backend,
				ProtocolSpec: protocol.Spec,
				Filesystem:   fs,
			},
		},
	}
	if ov != nil {
		vs.Spec.Policy.Overrides = ov.Annotations
	}
	if src != nil {
		vs.Spec.ContentSource = &src.spec
	}
	return vs, nil
}

// placeVolume chooses the store of a new volume of pool and its size: by chooseStore among the
// pool's Stores, or, for a volume with a content source, the source's store (sourceStore).
func (s *controller) placeVolume(ctx context.Context, req *csipb.CreateVolumeRequest, pool string, nvme bool, strategy policyv1.Strategy) (*storev1.Store, int64, *source, error) {
	var stores storev1.StoreList
	if err := s.d.kube.List(ctx, &stores, client.MatchingLabels{policyv1.LabelPool: storev1.NameLabelValue(pool)}); err != nil {
		return nil, 0, nil, volume.Errorf(volume.ErrUnavailable, "list Stores: %v", err)
	}
	rng := req.GetCapacityRange()
	cs := req.GetVolumeContentSource()
	if cs == nil {
		store, size, err := chooseStore(stores.Items, nvme, strategy, req.GetAccessibilityRequirements(), rng.GetRequiredBytes(), rng.GetLimitBytes())
		return store, size, nil, err
	}
	src, err := s.contentSource(ctx, cs)
	if err != nil {
		return nil, 0, nil, err
	}
	store, size, err := sourceStore(src, stores.Items, pool, nvme, strategy, req.GetAccessibilityRequirements(), rng.GetRequiredBytes(), rng.GetLimitBytes())
	return store, size, src, err
}

// existingVolume answers a CreateVolume whose name already has a VolumeState, h.State (read
// live after h was opened): compatible → the same volume (after waiting for it from that state
// on), incompatible → ALREADY_EXISTS.
func (s *controller) existingVolume(ctx context.Context, req *csipb.CreateVolumeRequest, h *volume.Handle[*storev1.VolumeState], mode string) (*csipb.CreateVolumeResponse, error) {
	vs := h.State
	if vs.DeletionTimestamp != nil {
		return nil, volume.Errorf(volume.ErrConflict, "volume %s is being deleted", vs.Name)
	}
	if vs.Spec.CSIName != req.GetName() {
		return nil, volume.Errorf(volume.ErrExists, "volume id %s belongs to another name", vs.Name)
	}
	size := max(vs.Spec.CapacityBytes, vs.Status.ActualBytes)
	rng := req.GetCapacityRange()
	if !InRange(size, rng.GetRequiredBytes(), rng.GetLimitBytes()) {
		return nil, volume.Errorf(volume.ErrExists, "volume %q exists with %d bytes, outside [%d, %d]", req.GetName(), size, rng.GetRequiredBytes(), rng.GetLimitBytes())
	}
	if vs.Spec.VolumeMode != mode {
		return nil, volume.Errorf(volume.ErrExists, "volume %q exists in %s mode", req.GetName(), vs.Spec.VolumeMode)
	}
	if !sameSource(req.GetVolumeContentSource(), vs.Spec.ContentSource) {
		return nil, volume.Errorf(volume.ErrExists, "volume %q exists with another content source", req.GetName())
	}
	if p := req.GetParameters()[policyv1.ParamPool]; p != vs.Spec.Policy.Pool {
		return nil, volume.Errorf(volume.ErrExists, "volume %q exists in pool %q", req.GetName(), vs.Spec.Policy.Pool)
	}
	if !isNVMe(vs) && len(req.GetAccessibilityRequirements().GetRequisite()) > 0 {
		node, err := s.storeNode(ctx, vs)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(topologyNodes(req.GetAccessibilityRequirements().GetRequisite()), node) {
			return nil, volume.Errorf(volume.ErrExists, "volume %q exists on node %q, outside the requested topology", req.GetName(), node)
		}
	}
	return s.answerCreated(ctx, h)
}

// answerCreated waits for the agent from h.State on (created, or read live after h was opened),
// and answers CreateVolume. A volume the agent found no room for is deleted (so a retry may
// choose another store) and reported RESOURCE_EXHAUSTED (the provisioner then reschedules,
// where any other code would retry the full node forever).
func (s *controller) answerCreated(ctx context.Context, h *volume.Handle[*storev1.VolumeState]) (*csipb.CreateVolumeResponse, error) {
	id := h.ID
	var ready *storev1.VolumeState
	err := h.WaitFrom(ctx, h.State, func(vs *storev1.VolumeState) (bool, error) {
		ok, err := volume.ReadyOrFailed(vs)
		if ok {
			ready = vs
		}
		return ok, err
	})
	if errors.Is(err, volume.ErrAgentNoRoom) {
		if derr := h.Delete(ctx); derr != nil && !apierrors.IsNotFound(derr) {
			s.d.log.Error(derr, "delete VolumeState the agent had no room for", "volume", id)
		}
	}
	if err != nil {
		return nil, volume.WaitError("create volume "+id, err)
	}
	v, err := s.csiVolume(ctx, ready)
	if err != nil {
		return nil, err
	}
	return &csipb.CreateVolumeResponse{Volume: v}, nil
}

// csiVolume is the CSI view of a VolumeState: its real size, contexts and accessible topology
// (local: the store's node; NVMe-oF: the nodes labelled as initiators).
func (s *controller) csiVolume(ctx context.Context, vs *storev1.VolumeState) (*csipb.Volume, error) {
	fs := vs.Spec.Policy.Filesystem
	mkfs, _ := json.Marshal(fs.MkfsOptions)
	mnt, _ := json.Marshal(fs.MountOptions)
	v := &csipb.Volume{
		VolumeId:      vs.Name,
		CapacityBytes: max(vs.Status.ActualBytes, vs.Spec.CapacityBytes),
		VolumeContext: map[string]string{
			ContextKind:         protocolKind(vs.Spec.Policy.ProtocolSpec),
			ContextFSType:       fs.FSType,
			ContextMkfsOptions:  string(mkfs),
			ContextMountOptions: string(mnt),
		},
	}
	if cs := vs.Spec.ContentSource; cs != nil { // CSI: a volume made from a source says so
		if cs.Snapshot != "" {
			v.ContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: cs.Snapshot}}}
		} else {
			v.ContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: cs.Volume}}}
		}
	}
	if isNVMe(vs) {
		var nodes corev1.NodeList
		if err := s.d.kube.List(ctx, &nodes, client.MatchingLabels{policyv1.LabelNVMeInitiator: "true"}); err != nil {
			return nil, volume.Errorf(volume.ErrUnavailable, "list initiator Nodes: %v", err)
		}
		for _, n := range nodes.Items {
			v.AccessibleTopology = append(v.AccessibleTopology, &csipb.Topology{Segments: map[string]string{policyv1.TopologyKeyNode: n.Name}})
		}
		return v, nil
	}
	node, err := s.storeNode(ctx, vs)
	if err != nil {
		return nil, err
	}
	v.AccessibleTopology = []*csipb.Topology{{Segments: map[string]string{policyv1.TopologyKeyNode: node}}}
	return v, nil
}

func (s *controller) storeNode(ctx context.Context, vs *storev1.VolumeState) (string, error) {
	var st storev1.Store
	if err := s.d.kube.Get(ctx, client.ObjectKey{Name: vs.Spec.StoreName}, &st); err != nil {
		return "", volume.Errorf(volume.ErrInternal, "Store %q of volume %s: %v", vs.Spec.StoreName, vs.Name, err)
	}
	return st.Spec.NodeName, nil
}

// agentSilentAfter is how old a Store's heartbeat may be before its agent counts as gone: four
// of the agent's default 30 s refreshes (agents/agent DefaultRefreshInterval).
const agentSilentAfter = 2 * time.Minute

// agentAnswerGrace is how long DeleteVolume waits for the agent before it reads whether the
// agent can answer at all (its Store and Node, two live reads): the agent writes its own
// progress after a second of work (agents/agent Options.ProgressAfter), so a volume still there
// after it is one the agent is slow with, or one no agent is working on.
const agentAnswerGrace = time.Second

// releaseOfGoneNode removes the agent's finalizer from the volume of h, marked for deletion,
// whose node left the cluster: no agent will ever remove it, and the volume left with the node.
// It rereads h.State. A conflict (the object moved meanwhile) is UNAVAILABLE: the provisioner
// retries.
func (s *controller) releaseOfGoneNode(ctx context.Context, h *volume.Handle[*storev1.VolumeState], why string) error {
	if err := h.ReadLive(ctx); err != nil {
		return fmt.Errorf("delete volume %s: %w", h.ID, err)
	}
	vs := h.State
	if vs == nil || !slices.Contains(vs.Finalizers, storev1.FinalizerVolume) {
		return nil
	}
	vs.Finalizers = slices.DeleteFunc(vs.Finalizers, func(f string) bool { return f == storev1.FinalizerVolume })
	if err := h.Update(ctx); err != nil && !apierrors.IsNotFound(err) {
		return volume.Errorf(volume.ErrUnavailable, "delete volume %s: %s; release finalizer %s: %v", h.ID, why, storev1.FinalizerVolume, err)
	}
	s.d.log.Info("released the finalizer of a volume whose node left the cluster", "volume", h.ID, "reason", why)
	return nil
}

func topologyNodes(ts []*csipb.Topology) []string {
	var out []string
	for _, t := range ts {
		if n, ok := t.GetSegments()[policyv1.TopologyKeyNode]; ok {
			out = append(out, n)
		}
	}
	return out
}

// chooseStore picks the store for a new volume and its rounded size. Local volumes must live on
// a node the requirements allow: when a preferred topology is given its first node is the node
// (the scheduler's selected node with WaitForFirstConsumer; the scheduler plugin already applied
// the strategy and capacity), otherwise the requisite nodes (or all stores) ordered by strategy.
// NVMe-oF volumes may live on any store (the requirements name consumer nodes). A Store marked
// draining (plinth.dev/draining: it left the policy) is never chosen. No store with
// room is RESOURCE_EXHAUSTED (so the provisioner reschedules), a size range that fits no
// store's unit is OUT_OF_RANGE.
func chooseStore(stores []storev1.Store, nvme bool, strategy policyv1.Strategy, req *csipb.TopologyRequirement, required, limit int64) (*storev1.Store, int64, error) {
	if _, err := RoundSize(required, limit, 1); err != nil {
		return nil, 0, volume.Errorf(volume.ErrOutOfRange, "%w", err)
	}
	candidates := stores
	if !nvme {
		var nodes []string
		if pref := topologyNodes(req.GetPreferred()); len(pref) > 0 {
			nodes = pref[:1]
		} else if reqd := topologyNodes(req.GetRequisite()); len(reqd) > 0 {
			nodes = reqd
		}
		if nodes != nil {
			candidates = nil
			for _, st := range stores {
				if slices.Contains(nodes, st.Spec.NodeName) {
					candidates = append(candidates, st)
				}
			}
		}
	}
	type fit struct {
		store *storev1.Store
		size  int64
		avail int64
	}
	var fits []fit
	var rangeErr error
	for i := range candidates {
		st := &candidates[i]
		if st.Status.Capacity == nil || st.IsDraining() {
			continue // agent has not reported yet, or the Store left the policy (plinth.dev/draining)
		}
		size, err := RoundSize(required, limit, st.Status.ExtentBytes)
		if err != nil {
			rangeErr = err
			continue
		}
		if st.Status.Capacity.Available >= size {
			fits = append(fits, fit{st, size, st.Status.Capacity.Available})
		}
	}
	if len(fits) == 0 {
		if rangeErr != nil && len(candidates) > 0 {
			return nil, 0, volume.Errorf(volume.ErrOutOfRange, "%s", rangeErr.Error())
		}
		return nil, 0, volume.Errorf(volume.ErrInsufficientCapacity, "no store of the pool in the requested topology has %d bytes available (%d candidates)", required, len(candidates))
	}
	sort.SliceStable(fits, func(i, j int) bool {
		if fits[i].avail != fits[j].avail {
			if strategy == policyv1.StrategySpreadout {
				return fits[i].avail > fits[j].avail
			}
			return fits[i].avail < fits[j].avail // Binpack (default): the fullest store that fits
		}
		return fits[i].store.Name < fits[j].store.Name
	})
	return fits[0].store, fits[0].size, nil
}

func (s *controller) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if !storev1.IsVolumeID(id) {
		return &csipb.DeleteVolumeResponse{}, nil // never ours: nothing to delete, OK (CSI spec)
	}
	// The subscription comes with the lock, so that the agent's release cannot slip between
	// the read below and the wait.
	h, err := s.d.volumes.Open(id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	// h.State is the VolumeState as last seen: the informer cache's copy when it holds one (a
	// volume CreateVolume answered is there: the answer waited for Ready through the cache),
	// otherwise a live read after the delete, for a volume created a moment ago or by another
	// replica. nil: gone already.
	if err := h.ReadCached(ctx); err != nil {
		return nil, fmt.Errorf("delete volume %s: %w", id, err)
	}
	cached := h.Exists()
	// A retry while the agent works (the VolumeState marked already) sends no second delete.
	if !cached || h.State.DeletionTimestamp.IsZero() {
		if err := h.Delete(ctx); err != nil {
			if apierrors.IsNotFound(err) {
				return &csipb.DeleteVolumeResponse{}, nil
			}
			return nil, volume.Errorf(volume.ErrUnavailable, "delete VolumeState %s: %v", id, err)
		}
	}
	if !cached {
		if err := h.ReadLive(ctx); err != nil {
			return nil, fmt.Errorf("delete volume %s: %w", id, err)
		}
	}
	if err := s.awaitDeletion(ctx, h); err != nil {
		return nil, err
	}
	return &csipb.DeleteVolumeResponse{}, nil
}

// awaitDeletion waits until the volume of h, marked for deletion, is gone: the agent removed
// export and volume and released its finalizer — and the informer cache knows it too (an agent
// quicker than DeleteVolume's read would otherwise leave the volume in ListVolumes, which reads
// the cache, after DeleteVolume returns). An agent answers most deletions within moments; only
// one that has not within agentAnswerGrace is asked about: an agent that cannot answer (its
// node deleted, or silent) would keep the call waiting for the whole wait timeout, so say so
// then (UNAVAILABLE; the provisioner retries with backoff), or release the volume of a node
// that left the cluster.
func (s *controller) awaitDeletion(ctx context.Context, h *volume.Handle[*storev1.VolumeState]) error {
	id, cur := h.ID, h.State
	gone := func(vs *storev1.VolumeState) (bool, error) {
		if vs != nil {
			return false, nil
		}
		err := s.d.kube.Get(ctx, client.ObjectKey{Name: id}, &storev1.VolumeState{})
		return apierrors.IsNotFound(err), nil
	}
	quick, cancel := context.WithTimeout(ctx, agentAnswerGrace)
	err := h.WaitFrom(quick, cur, gone)
	cancel()
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		return volume.WaitError("delete volume "+id, err)
	}
	if cur != nil { // nil: gone already, the cache a moment behind
		if why, nodeGone := s.storeAgentAbsent(ctx, cur.Spec.StoreName); why != "" {
			if nodeGone {
				return s.releaseOfGoneNode(ctx, h, why)
			}
			return volume.Errorf(volume.ErrUnavailable, "delete volume %s: marked for deletion, but %s; the agent deletes it when it reports again", id, why)
		}
	}
	// The states delivered during the grace were consumed there; cur is still a state of the
	// same object (its UID), and the subscription holds whatever came after.
	return volume.WaitError("delete volume "+id, h.WaitFrom(ctx, cur, gone))
}

func (s *controller) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	switch {
	case id == "":
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	case nodeID == "":
		return nil, volume.Errorf(volume.ErrInvalid, "node id is required")
	case req.GetVolumeCapability() == nil:
		return nil, volume.Errorf(volume.ErrInvalid, "volume capability is required")
	}
	if _, _, err := checkCapabilities([]*csipb.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, volume.Errorf(volume.ErrInvalid, "%w", err)
	}
	h, err := s.d.volumes.OpenLive(ctx, id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if !h.Exists() {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s does not exist", id)
	}
	var node corev1.Node
	if err := s.d.kube.Get(ctx, client.ObjectKey{Name: nodeID}, &node); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, volume.Errorf(volume.ErrNotFound, "node %s does not exist", nodeID)
		}
		return nil, volume.Errorf(volume.ErrUnavailable, "read Node: %v", err)
	}
	if !isNVMe(h.State) {
		return s.publishLocal(ctx, h, nodeID)
	}
	hostNQN := node.Annotations[policyv1.AnnotationHostNQN]
	if hostNQN == "" {
		return nil, volume.Errorf(volume.ErrPrecondition, "node %s has no %s annotation (is the node plugin running?)", nodeID, policyv1.AnnotationHostNQN)
	}
	// The ACL admits by host NQN alone: granting an NQN that another node presents too would
	// admit that node as well. Refused, never granted and never widened to any host.
	others, err := s.nodesPresenting(ctx, nodeID, hostNQN)
	if err != nil {
		return nil, err
	}
	if len(others) > 0 {
		msg := hostnqn.Message(hostNQN, nodeID, others) + fmt.Sprintf("; publication of volume %s refused", id)
		s.d.warn(&node, hostnqn.ReasonDuplicate, "Publish", msg)
		return nil, volume.Errorf(volume.ErrPrecondition, "%s", msg)
	}
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()
	want := storev1.Publication{NodeName: nodeID, HostNQN: hostNQN, AccessMode: mode.String(), ReadOnly: req.GetReadonly()}
	gen, err := s.updatePublications(ctx, h, func(pubs []storev1.Publication) ([]storev1.Publication, error) {
		for _, p := range pubs {
			if p.NodeName == nodeID {
				if p != want {
					return nil, volume.Errorf(volume.ErrExists, "volume %s is published to node %s with another mode", id, nodeID)
				}
				return pubs, nil
			}
		}
		if len(pubs) > 0 && (singleNode(mode) || pubs[0].AccessMode != csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY.String()) {
			return nil, volume.Errorf(volume.ErrPrecondition, "volume %s is published to node %s and its access mode allows one node", id, pubs[0].NodeName)
		}
		return append(pubs, want), nil
	})
	if err != nil {
		return nil, err
	}
	var done *storev1.VolumeState
	err = h.Wait(ctx, func(vs *storev1.VolumeState) (bool, error) {
		ok, err := volume.ReadyOrFailed(vs)
		if !ok || err != nil {
			return ok, err
		}
		if vs.Status.ObservedPublicationGeneration >= gen && vs.Status.Export != nil {
			done = vs
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return nil, volume.WaitError("publish volume "+id, err)
	}
	pc, err := s.nvmePublishContext(ctx, done)
	if err != nil {
		return nil, err
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

// publishLocal answers ControllerPublishVolume of a local volume: only to the node of its
// store, once the volume is ready, with its device path.
func (s *controller) publishLocal(ctx context.Context, h *volume.Handle[*storev1.VolumeState], nodeID string) (*csipb.ControllerPublishVolumeResponse, error) {
	storeNode, err := s.storeNode(ctx, h.State)
	if err != nil {
		return nil, err
	}
	if storeNode != nodeID {
		return nil, volume.Errorf(volume.ErrPrecondition, "local volume %s lives on node %s, not %s", h.ID, storeNode, nodeID)
	}
	if err := h.Wait(ctx, volume.ReadyOrFailed); err != nil {
		return nil, volume.WaitError("publish volume "+h.ID, err)
	}
	if err := h.ReadLive(ctx); err != nil {
		return nil, err
	}
	if !h.Exists() {
		return nil, volume.Errorf(volume.ErrUnavailable, "read VolumeState %s: deleted meanwhile", h.ID)
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: map[string]string{
		ContextKind:       "local",
		PublishDevicePath: h.State.Status.DevicePath,
	}}, nil
}

// nvmePublishContext is the publish context of an NVMe-oF volume vs exported by its agent:
// where the export is, the storage node, and the frozen protocol's timers and authentication.
func (s *controller) nvmePublishContext(ctx context.Context, vs *storev1.VolumeState) (map[string]string, error) {
	pc := map[string]string{
		ContextKind:    "nvmeofTcp",
		PublishNQN:     vs.Status.Export.NQN,
		PublishAddress: vs.Status.Export.Address,
		PublishPort:    strconv.Itoa(int(vs.Status.Export.Port)),
	}
	target, err := s.storeNode(ctx, vs)
	if err != nil {
		return nil, err
	}
	pc[PublishTargetNode] = target
	if t := vs.Spec.Policy.ProtocolSpec.NVMeoFTCP; t != nil {
		if t.CtrlLossTmo != nil {
			pc[PublishCtrlLossTmo] = strconv.Itoa(int(*t.CtrlLossTmo))
		}
		if t.ReconnectDelay > 0 {
			pc[PublishReconnectDelay] = strconv.Itoa(int(t.ReconnectDelay))
		}
		if t.MaxQueueSize > 0 {
			pc[PublishQueueSize] = strconv.Itoa(int(t.MaxQueueSize))
		}
		if t.Auth.Enabled() {
			pc[PublishAuth] = string(t.Auth.Mode)
			if t.Auth.Bidirectional {
				pc[PublishAuthBidirectional] = "true"
			}
		}
	}
	return pc, nil
}

// nodesPresenting returns the Nodes other than nodeID annotated with host NQN nqn (from the
// informer), sorted.
func (s *controller) nodesPresenting(ctx context.Context, nodeID, nqn string) ([]string, error) {
	var nodes corev1.NodeList
	if err := s.d.kube.List(ctx, &nodes); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list Nodes: %v", err)
	}
	var others []string
	for _, n := range nodes.Items {
		if n.Name != nodeID && n.Annotations[policyv1.AnnotationHostNQN] == nqn {
			others = append(others, n.Name)
		}
	}
	slices.Sort(others)
	return others, nil
}

// updatePublications applies change to spec.publications of h.State with a resourceVersion
// compare-and-swap (Update fails with Conflict when another writer came first: reread and
// retry), bumping spec.publicationGeneration when the list changed. It returns the generation
// the agent must reach.
func (s *controller) updatePublications(ctx context.Context, h *volume.Handle[*storev1.VolumeState], change func([]storev1.Publication) ([]storev1.Publication, error)) (int64, error) {
	for attempt := 0; ; attempt++ {
		vs := h.State
		pubs, err := change(slices.Clone(vs.Spec.Publications))
		if err != nil {
			return 0, err
		}
		if slices.Equal(pubs, vs.Spec.Publications) {
			return vs.Spec.PublicationGeneration, nil
		}
		vs.Spec.Publications = pubs
		vs.Spec.PublicationGeneration++
		failpoint.Hit(failpoint.CSIPublishBeforeUpdate)
		err = h.Update(ctx) // carries metadata.resourceVersion: the CAS
		if err == nil {
			return vs.Spec.PublicationGeneration, nil
		}
		if !apierrors.IsConflict(err) || attempt >= 10 {
			return 0, volume.Errorf(volume.ErrConflict, "update publications of %s: %v", vs.Name, err)
		}
		if err := h.ReadLive(ctx); err != nil || !h.Exists() {
			return 0, volume.Errorf(volume.ErrConflict, "reread VolumeState %s: %v", vs.Name, cmp.Or(err, errors.New("deleted meanwhile")))
		}
	}
}

func (s *controller) ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) (*csipb.ControllerUnpublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if !storev1.IsVolumeID(id) {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil
	}
	h, err := s.d.volumes.OpenLive(ctx, id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if !h.Exists() || !isNVMe(h.State) {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil
	}
	gen, err := s.updatePublications(ctx, h, func(pubs []storev1.Publication) ([]storev1.Publication, error) {
		return slices.DeleteFunc(pubs, func(p storev1.Publication) bool { return nodeID == "" || p.NodeName == nodeID }), nil
	})
	if err != nil {
		return nil, err
	}
	err = h.Wait(ctx, func(vs *storev1.VolumeState) (bool, error) {
		return vs == nil || vs.Status.ObservedPublicationGeneration >= gen, nil
	})
	if err != nil {
		return nil, volume.WaitError("unpublish volume "+id, err)
	}
	return &csipb.ControllerUnpublishVolumeResponse{}, nil
}

func (s *controller) ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, volume.Errorf(volume.ErrInvalid, "volume capabilities are required")
	}
	vs, err := s.d.volumes.Get(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if vs == nil {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s does not exist", req.GetVolumeId())
	}
	mode, _, err := checkCapabilities(req.GetVolumeCapabilities())
	if err == nil && mode != vs.Spec.VolumeMode {
		err = fmt.Errorf("volume is in %s mode", vs.Spec.VolumeMode)
	}
	if err != nil {
		return &csipb.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

func (s *controller) ListVolumes(ctx context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, volume.Errorf(volume.ErrInvalid, "max_entries must not be negative")
	}
	var list storev1.VolumeStateList
	if err := s.d.kube.List(ctx, &list); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list VolumeStates: %v", err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	// The token is the last volume id of the previous page (ids sort by name), so deleting or
	// adding volumes between pages neither skips nor repeats the rest.
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		if !storev1.IsVolumeID(tok) {
			return nil, volume.Errorf(volume.ErrConflict, "starting token %q is not valid", tok)
		}
		start = sort.Search(len(list.Items), func(i int) bool { return list.Items[i].Name > tok })
	}
	end := len(list.Items)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &csipb.ListVolumesResponse{}
	for i := start; i < end; i++ {
		vs := &list.Items[i]
		resp.Entries = append(resp.Entries, &csipb.ListVolumesResponse_Entry{Volume: &csipb.Volume{
			VolumeId:      vs.Name,
			CapacityBytes: max(vs.Status.ActualBytes, vs.Spec.CapacityBytes),
		}})
	}
	if end < len(list.Items) && end > start {
		resp.NextToken = list.Items[end-1].Name
	}
	return resp, nil
}

// GetCapacity reports Store status.capacity.available — the number every part uses — for the
// StorageClass's pool: on one node for a local topology segment, otherwise summed over the
// pool's stores; maximum_volume_size is the largest single store's available bytes.
func (s *controller) GetCapacity(ctx context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	if len(req.GetVolumeCapabilities()) > 0 {
		if _, _, err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
			return &csipb.GetCapacityResponse{}, nil // an unsupported capability has no capacity
		}
	}
	opts := []client.ListOption{}
	pool := req.GetParameters()[policyv1.ParamPool]
	if pool != "" {
		opts = append(opts, client.MatchingLabels{policyv1.LabelPool: storev1.NameLabelValue(pool)})
	}
	nvme := false
	if p := req.GetParameters()[policyv1.ParamProtocol]; p != "" {
		var proto policyv1.Protocol
		if err := s.d.kube.Get(ctx, client.ObjectKey{Name: p}, &proto); err == nil {
			nvme = proto.Spec.NVMeoFTCP != nil
		}
	}
	var stores storev1.StoreList
	if err := s.d.kube.List(ctx, &stores, opts...); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list Stores: %v", err)
	}
	node, byNode := req.GetAccessibleTopology().GetSegments()[policyv1.TopologyKeyNode]
	var sum, largest int64
	for _, st := range stores.Items {
		if st.Status.Capacity == nil || st.IsDraining() || (byNode && !nvme && st.Spec.NodeName != node) {
			continue // a draining Store takes no new volumes: it offers no capacity
		}
		sum += st.Status.Capacity.Available
		largest = max(largest, st.Status.Capacity.Available)
	}
	return &csipb.GetCapacityResponse{AvailableCapacity: sum, MaximumVolumeSize: wrapInt64(largest)}, nil
}

func (s *controller) ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, volume.Errorf(volume.ErrInvalid, "capacity range is required")
	}
	h, err := s.d.volumes.OpenLive(ctx, id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if !h.Exists() {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s does not exist", id)
	}
	vs := h.State
	block := vs.Spec.VolumeMode == "Block" || req.GetVolumeCapability().GetBlock() != nil
	var st storev1.Store
	if err := s.d.kube.Get(ctx, client.ObjectKey{Name: vs.Spec.StoreName}, &st); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "Store %q: %v", vs.Spec.StoreName, err)
	}
	rng := req.GetCapacityRange()
	size, err := RoundSize(rng.GetRequiredBytes(), rng.GetLimitBytes(), st.Status.ExtentBytes)
	if err != nil {
		return nil, volume.Errorf(volume.ErrOutOfRange, "%w", err)
	}
	// Done at ≥ requested, never waiting for equality (sizes round up to the unit).
	if cur := max(vs.Spec.CapacityBytes, vs.Status.ActualBytes); size <= cur {
		if vs.Status.ActualBytes < vs.Spec.CapacityBytes { // an earlier expansion still running
			size = vs.Spec.CapacityBytes
		} else {
			return &csipb.ControllerExpandVolumeResponse{CapacityBytes: cur, NodeExpansionRequired: !block}, nil
		}
	} else {
		vs.Spec.CapacityBytes = size
		if err := h.Update(ctx); err != nil { // resourceVersion CAS
			if apierrors.IsConflict(err) {
				return nil, volume.Errorf(volume.ErrConflict, "VolumeState %s changed meanwhile; retry", id)
			}
			return nil, volume.Errorf(volume.ErrInternal, "update VolumeState %s: %v", id, err)
		}
	}
	var done *storev1.VolumeState
	err = h.Wait(ctx, func(vs *storev1.VolumeState) (bool, error) {
		if vs == nil {
			return false, errors.New("volume deleted during expansion")
		}
		ok, err := volume.ReadyOrFailed(vs)
		if ok && vs.Status.ActualBytes >= size {
			done = vs
			return true, nil
		}
		return false, err
	})
	if errors.Is(err, volume.ErrAgentRefused) {
		s.undoExpansion(ctx, h, size)
	}
	if err != nil {
		return nil, volume.WaitError("expand volume "+id, err)
	}
	return &csipb.ControllerExpandVolumeResponse{CapacityBytes: done.Status.ActualBytes, NodeExpansionRequired: !block}, nil
}

// undoExpansion sets spec.capacityBytes of the volume of h back to its real size
// (status.actualBytes) after the agent refused size for good (ExpansionRefused): the spec then
// no longer asks for a size the volume cannot have, so the agent stops retrying it and
// CreateVolume's idempotency and ListVolumes report the real size. Only when the spec still
// asks for size (optimistic lock): a newer request is left alone. Failures are logged; the
// next expansion retries.
func (s *controller) undoExpansion(ctx context.Context, h *volume.Handle[*storev1.VolumeState], size int64) {
	if err := h.ReadLive(ctx); err != nil || !h.Exists() {
		return
	}
	vs := h.State
	if vs.Spec.CapacityBytes != size || vs.Status.ActualBytes <= 0 || vs.Status.ActualBytes >= size {
		return
	}
	vs.Spec.CapacityBytes = vs.Status.ActualBytes
	if err := h.Update(ctx); err != nil {
		s.d.log.Error(err, "set the refused expansion's size back", "volume", h.ID)
	}
}
