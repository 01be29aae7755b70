package controller

import (
	"context"
	"fmt"
	"sort"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
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
			CapacityBytes: usableBytes(vs, max(vs.Status.ActualBytes, vs.Spec.CapacityBytes)),
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
		if err := s.kube.Get(ctx, client.ObjectKey{Name: p}, &proto); err == nil {
			nvme = proto.Spec.NVMeoFTCP != nil
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
		sum += st.Status.Capacity.Available
		largest = max(largest, st.Status.Capacity.Available)
	}
	return &csipb.GetCapacityResponse{AvailableCapacity: sum, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
}
