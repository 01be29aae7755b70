package controller

import (
	"context"
	"errors"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func (s *Service) ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, volume.Errorf(volume.ErrInvalid, "capacity range is required")
	}
	h, err := s.volumes.OpenLive(ctx, id)
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
	if err := s.kube.Get(ctx, client.ObjectKey{Name: vs.Spec.StoreName}, &st); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "Store %q: %v", vs.Spec.StoreName, err)
	}
	rng := backendRange(req.GetCapacityRange(), headerBytes(vs.Spec.Policy.Encryption))
	size, err := RoundSize(rng.GetRequiredBytes(), rng.GetLimitBytes(), st.Status.ExtentBytes)
	if err != nil {
		return nil, volume.Errorf(volume.ErrOutOfRange, "%w", err)
	}
	// Done at ≥ requested, never waiting for equality (sizes round up to the unit).
	if cur := max(vs.Spec.CapacityBytes, vs.Status.ActualBytes); size <= cur {
		if vs.Status.ActualBytes < vs.Spec.CapacityBytes { // an earlier expansion still running
			size = vs.Spec.CapacityBytes
		} else {
			return &csipb.ControllerExpandVolumeResponse{CapacityBytes: usableBytes(vs, cur), NodeExpansionRequired: !block}, nil
		}
	} else if err := s.growSpec(ctx, h, size); err != nil {
		return nil, err
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
	return &csipb.ControllerExpandVolumeResponse{CapacityBytes: usableBytes(done, done.Status.ActualBytes), NodeExpansionRequired: !block}, nil
}

// undoExpansion sets spec.capacityBytes of the volume of h back to its real size
// (status.actualBytes) after the agent refused size for good (ExpansionRefused): the spec then
// no longer asks for a size the volume cannot have, so the agent stops retrying it and
// CreateVolume's idempotency and ListVolumes report the real size. Only when the spec still
// asks for size (optimistic lock): a newer request is left alone. Failures are logged; the
// next expansion retries.
func (s *Service) undoExpansion(ctx context.Context, h *volume.Handle[*storev1.VolumeState], size int64) {
	if err := h.ReadLive(ctx); err != nil || !h.Exists() {
		return
	}
	vs := h.State
	if vs.Spec.CapacityBytes != size || vs.Status.ActualBytes <= 0 || vs.Status.ActualBytes >= size {
		return
	}
	vs.Spec.CapacityBytes = vs.Status.ActualBytes
	if err := h.Update(ctx); err != nil {
		s.log.Error(err, "set the refused expansion's size back", "volume", h.ID)
	}
}

// growSpec sets spec.capacityBytes of the volume of h to size with the resourceVersion of what
// it read. The handle holds the volume's lock, so no other RPC changes the spec meanwhile, but
// the agent and the node plugins write the status: a conflict is re-read and retried (while
// the spec still asks for less), never answered ABORTED for a status write.
func (s *Service) growSpec(ctx context.Context, h *volume.Handle[*storev1.VolumeState], size int64) error {
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			if err := h.ReadLive(ctx); err != nil {
				return err
			}
			if !h.Exists() {
				return volume.Errorf(volume.ErrNotFound, "volume %s was deleted during expansion", h.ID)
			}
			if h.State.Spec.CapacityBytes >= size {
				return nil
			}
		}
		first = false
		h.State.Spec.CapacityBytes = size
		return h.Update(ctx) // resourceVersion CAS
	})
	switch {
	case err == nil:
		return nil
	case apierrors.IsConflict(err):
		return volume.Errorf(volume.ErrConflict, "VolumeState %s changed meanwhile; retry", h.ID)
	case volume.KindOf(err) != nil:
		return err
	}
	return volume.Errorf(volume.ErrInternal, "update VolumeState %s: %v", h.ID, err)
}
