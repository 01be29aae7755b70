package controller

import (
	"context"
	"fmt"
	"sort"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func (s *Service) ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, volume.Errorf(volume.ErrInvalid, "volume capabilities are required")
	}
	vs, err := s.volumes.Get(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if vs == nil {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s does not exist", req.GetVolumeId())
	}
	mode, _, err := volume.CheckCapabilities(req.GetVolumeCapabilities())
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

func (s *Service) ListVolumes(ctx context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, volume.Errorf(volume.ErrInvalid, "max_entries must not be negative")
	}
	var list storev1.VolumeStateList
	if err := s.kube.List(ctx, &list); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list VolumeStates: %v", err)
	}
	page, next, err := volumePage(list.Items, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csipb.ListVolumesResponse{NextToken: next}
	for i := range page {
		vs := &page[i]
		resp.Entries = append(resp.Entries, &csipb.ListVolumesResponse_Entry{Volume: &csipb.Volume{
			VolumeId:      vs.Name,
			CapacityBytes: usableBytes(vs, max(vs.Status.ActualBytes, vs.Spec.CapacityBytes)),
		}})
	}
	return resp, nil
}

// volumePage sorts items by volume id and returns the page after token (the last volume id of
// the previous page, "" for the first) of at most maxEntries (0: all), and the next page's
// token ("" after the last). Ids sort by name, so deleting or adding volumes between pages
// neither skips nor repeats the rest. A token that is not a volume id is ErrConflict (CSI's
// ABORTED for a token the plugin did not give).
func volumePage(items []storev1.VolumeState, token string, maxEntries int32) (page []storev1.VolumeState, next string, err error) {
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	start := 0
	if token != "" {
		if !storev1.IsVolumeID(token) {
			return nil, "", volume.Errorf(volume.ErrConflict, "starting token %q is not valid", token)
		}
		start = sort.Search(len(items), func(i int) bool { return items[i].Name > token })
	}
	end := len(items)
	if m := int(maxEntries); m > 0 && start+m < end {
		end = start + m
	}
	if end < len(items) && end > start {
		next = items[end-1].Name
	}
	return items[start:end], next, nil
}

// GetCapacity reports Store status.capacity.available — the number every part uses — for the
// StorageClass's pool: on one node for a local topology segment, otherwise summed over the
// pool's stores; maximum_volume_size is the largest single store's available bytes. For a
// class whose Placement encrypts, each store's bytes are less the LUKS2 header
// (crypt.HeaderBytes, 16 MiB; never below 0): the most one volume there can be given.
func (s *Service) GetCapacity(ctx context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	if len(req.GetVolumeCapabilities()) > 0 {
		if _, _, err := volume.CheckCapabilities(req.GetVolumeCapabilities()); err != nil {
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
		if err := s.getPolicy(ctx, p, &proto); err == nil {
			nvme = proto.Spec.NVMeoFTCP != nil
		}
	}
	// an encrypted class's volume gets what its store has less the LUKS2 header (CreateVolume
	// makes the backend that much larger): each store offers that much less
	var header int64
	if pl := req.GetParameters()[policyv1.ParamPlacement]; pl != "" {
		var placement policyv1.Placement
		if err := s.getPolicy(ctx, pl, &placement); err == nil {
			header = headerBytes(placement.Spec.Encryption)
		} else if !apierrors.IsNotFound(err) {
			return nil, volume.Errorf(volume.ErrUnavailable, "get Placement %s: %v", pl, err)
		}
	}
	var stores storev1.StoreList
	if err := s.kube.List(ctx, &stores, opts...); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list Stores: %v", err)
	}
	node, byNode := req.GetAccessibleTopology().GetSegments()[policyv1.TopologyKeyNode]
	var sum, largest int64
	for _, st := range stores.Items {
		if st.Status.Capacity == nil || st.IsDraining() || (byNode && !nvme && st.Spec.NodeName != node) {
			continue // a draining Store takes no new volumes: it offers no capacity
		}
		avail := max(st.Status.Capacity.Available-header, 0)
		sum += avail
		largest = max(largest, avail)
	}
	return &csipb.GetCapacityResponse{AvailableCapacity: sum, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
}
