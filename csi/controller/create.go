package controller

import (
	"context"
	"errors"
	"slices"
	"sort"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func (s *Service) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "name is required")
	}
	mode, capFS, err := volume.CheckCapabilities(req.GetVolumeCapabilities())
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
	h, err := s.volumes.Open(id)
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
	vs, release, err := s.newVolumeState(ctx, req, id, mode, capFS)
	if err != nil {
		return nil, err
	}
	err = h.Create(ctx, vs)
	release() // the next create of the workload counts this VolumeState (or its absence)
	if err != nil {
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
// (chooseStore, or sourceStore for a restore or clone), at the rounded size. For a spread
// NVMe-oF volume it holds the workload's lock until the caller has created the VolumeState
// and called release (a no-op otherwise; never nil when err is nil).
func (s *Service) newVolumeState(ctx context.Context, req *csipb.CreateVolumeRequest, id, mode, capFS string) (vs *storev1.VolumeState, release func(), err error) {
	unlock := func() {}
	defer func() {
		if err != nil {
			unlock()
		}
	}()
	params := req.GetParameters()
	placementName, poolName, protocolName := params[policyv1.ParamPlacement], params[policyv1.ParamPool], params[policyv1.ParamProtocol]
	var placement policyv1.Placement
	var pool policyv1.StoragePool
	var protocol policyv1.Protocol
	if err := s.readClassPolicy(ctx, params, &placement, &pool, &protocol); err != nil {
		return nil, nil, err
	}
	fs := filesystemOf(placement.Spec.Filesystem, params[policyv1.ParamFSType], capFS)
	strategy := placement.Spec.Strategy
	pvc, err := s.claimMeta(ctx, params)
	if err != nil {
		return nil, nil, err
	}
	ov, err := s.pvcOverrides(pvc, &placement, fs.FSType)
	if err != nil {
		return nil, nil, err
	}
	ov.Apply(&fs, &strategy)
	attrs, err := s.createAttributes(ctx, req.GetMutableParameters(), placementName) // modify.go
	if err != nil {
		return nil, nil, err
	}
	// Local volumes are spread by plinth-scheduler (the pod's node is the volume's); a restore
	// or clone stays on its source's store.
	var sp *spread
	if key := params[policyv1.ParamSpreadAcross]; key != "" && protocol.Spec.NVMeoFTCP != nil && req.GetVolumeContentSource() == nil {
		sp = &spread{key: key, placement: placementName}
		if pvc != nil { // without --extra-create-metadata every volume is its own workload
			if sp.workload, err = s.workloadOfClaim(ctx, pvc); err != nil {
				return nil, nil, err
			}
			u, err := s.spreadLocks.lock(ctx, sp.workload.uid)
			if err != nil {
				return nil, nil, err
			}
			unlock = u
		}
	}
	enc, err := encryptionOf(placement.Spec.Encryption, req.GetName())
	if err != nil {
		return nil, nil, err
	}
	if h := headerBytes(enc); h > 0 { // the LUKS2 header comes on top of the capacity asked
		req = proto.CloneOf(req)
		req.CapacityRange = backendRange(req.GetCapacityRange(), h)
	}
	store, size, src, err := s.placeVolume(ctx, req, poolName, protocol.Spec.NVMeoFTCP != nil, strategy, sp, enc)
	if err != nil {
		return nil, nil, err
	}
	vs = &storev1.VolumeState{
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
				Encryption:   enc,
			},
		},
	}
	vs.Spec.Attributes = attrs
	if ov != nil {
		vs.Spec.Policy.Overrides = ov.Annotations
	}
	if src != nil {
		vs.Spec.ContentSource = &src.spec
		vs.Spec.KeyOrigin = src.keyOrigin
	}
	if sp != nil && sp.workload.uid != "" {
		vs.Labels[policyv1.LabelWorkload] = sp.workload.uid
	}
	return vs, unlock, nil
}

// readClassPolicy reads, live, the Placement, StoragePool and Protocol the StorageClass
// parameters params name into placement, pool and protocol. A missing object, or a Placement
// that names another pool or protocol than the StorageClass, is ErrInvalid (a class and its
// policy out of step); an API server that cannot be read is ErrUnavailable.
func (s *Service) readClassPolicy(ctx context.Context, params map[string]string, placement *policyv1.Placement, pool *policyv1.StoragePool, protocol *policyv1.Protocol) error {
	placementName, poolName, protocolName := params[policyv1.ParamPlacement], params[policyv1.ParamPool], params[policyv1.ParamProtocol]
	for _, g := range []struct {
		name string
		obj  client.Object
	}{{placementName, placement}, {poolName, pool}, {protocolName, protocol}} {
		if err := s.getPolicy(ctx, g.name, g.obj); err != nil {
			if apierrors.IsNotFound(err) {
				return volume.Errorf(volume.ErrInvalid, "%T %q named by the StorageClass does not exist", g.obj, g.name)
			}
			return volume.Errorf(volume.ErrUnavailable, "read %T %q: %v", g.obj, g.name, err)
		}
	}
	if placement.Spec.PoolRef.Name != poolName || placement.Spec.ProtocolRef.Name != protocolName {
		return volume.Errorf(volume.ErrInvalid, "Placement %q refers to pool %q and protocol %q, the StorageClass to %q and %q",
			placementName, placement.Spec.PoolRef.Name, placement.Spec.ProtocolRef.Name, poolName, protocolName)
	}
	return nil
}

// getPolicy reads the cluster-scoped policy object name (a Placement, StoragePool or
// Protocol) into obj from the informer cache, and from the API server when the cache does
// not hold it. Flux applies a Placement, its StorageClass and the apps' claims in one
// reconciliation, so a CreateVolume or GetCapacity can name a Placement before the watch has
// delivered it; answering "does not exist" (or counting the class without its LUKS2 header)
// for an object that exists is wrong. An object that truly does not exist costs one GET.
// Errors are the client's; NotFound only when the API server has no such object either.
func (s *Service) getPolicy(ctx context.Context, name string, obj client.Object) error {
	err := s.kube.Get(ctx, client.ObjectKey{Name: name}, obj)
	if apierrors.IsNotFound(err) {
		err = s.live.Get(ctx, client.ObjectKey{Name: name}, obj)
	}
	return err
}

// filesystemOf is the filesystem a new volume gets: the Placement's, its type replaced by the
// StorageClass's fsType parameter, then by the fsType of the request's mount capability;
// ext4 when none names one.
func filesystemOf(fs policyv1.Filesystem, classFSType, capFS string) policyv1.Filesystem {
	if classFSType != "" {
		fs.FSType = classFSType
	}
	if capFS != "" {
		fs.FSType = capFS
	}
	if fs.FSType == "" {
		fs.FSType = "ext4"
	}
	return fs
}

// placeVolume chooses the store of a new volume of pool and its size: by chooseStore among the
// pool's Stores (for a spread volume, sp, those of the domains that hold the fewest of its
// workload's volumes), or, for a volume with a content source, the source's store
// (sourceStore), once its encryption and the new volume's, enc, agree (sameKey).
func (s *Service) placeVolume(ctx context.Context, req *csipb.CreateVolumeRequest, pool string, nvme bool, strategy policyv1.Strategy, sp *spread, enc *policyv1.Encryption) (*storev1.Store, int64, *source, error) {
	var stores storev1.StoreList
	if err := s.kube.List(ctx, &stores, client.MatchingLabels{policyv1.LabelPool: storev1.NameLabelValue(pool)}); err != nil {
		return nil, 0, nil, volume.Errorf(volume.ErrUnavailable, "list Stores: %v", err)
	}
	rng := req.GetCapacityRange()
	cs := req.GetVolumeContentSource()
	if cs == nil && sp != nil {
		store, size, err := s.spreadStore(ctx, sp, stores.Items, strategy, req.GetAccessibilityRequirements(), rng.GetRequiredBytes(), rng.GetLimitBytes())
		return store, size, nil, err
	}
	if cs == nil {
		store, size, err := chooseStore(stores.Items, nvme, strategy, req.GetAccessibilityRequirements(), rng.GetRequiredBytes(), rng.GetLimitBytes())
		return store, size, nil, err
	}
	src, err := s.contentSource(ctx, cs)
	if err != nil {
		return nil, 0, nil, err
	}
	if src.keyOrigin, err = sameKey(src, enc); err != nil {
		return nil, 0, nil, err
	}
	store, size, err := sourceStore(src, stores.Items, pool, nvme, strategy, req.GetAccessibilityRequirements(), rng.GetRequiredBytes(), rng.GetLimitBytes())
	return store, size, src, err
}

// existingVolume answers a CreateVolume whose name already has a VolumeState, h.State (read
// live after h was opened): compatible → the same volume (after waiting for it from that state
// on), incompatible → ALREADY_EXISTS.
func (s *Service) existingVolume(ctx context.Context, req *csipb.CreateVolumeRequest, h *volume.Handle[*storev1.VolumeState], mode string) (*csipb.CreateVolumeResponse, error) {
	vs := h.State
	if vs.DeletionTimestamp != nil {
		return nil, volume.Errorf(volume.ErrConflict, "volume %s is being deleted", vs.Name)
	}
	if vs.Spec.CSIName != req.GetName() {
		return nil, volume.Errorf(volume.ErrExists, "volume id %s belongs to another name", vs.Name)
	}
	size := usableBytes(vs, max(vs.Spec.CapacityBytes, vs.Status.ActualBytes))
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
func (s *Service) answerCreated(ctx context.Context, h *volume.Handle[*storev1.VolumeState]) (*csipb.CreateVolumeResponse, error) {
	id := h.ID
	// the key before the answer: a volume is never handed out without it (also on a retry
	// after a crash between the VolumeState and the Secret)
	if err := s.ensureVolumeKey(ctx, h.State); err != nil {
		return nil, err
	}
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
			s.log.Error(derr, "delete VolumeState the agent had no room for", "volume", id)
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
