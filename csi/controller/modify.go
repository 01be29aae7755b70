package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// ControllerModifyVolume moves a volume to the tier whose VolumeAttributesClass parameters
// csi-resizer hands over (mutable_parameters): it checks that the volume's Placement allows
// the class (tierOf), records it in spec.attributes with a new generation, and waits until
// every node that stages the volume reports in status.appliedAttributes that it wrote the
// limits into its consumers' cgroups. A node that could not (block device or cgroup missing)
// fails the call with FAILED_PRECONDITION and its message, and spec.attributes is set back
// to the tier in force before: csi-resizer keeps the claim's old class and reports the error
// on it (the PVC's ModifyVolumeError condition and a VolumeModifyFailed event). A class the
// Placement does not allow is INVALID_ARGUMENT, which csi-resizer marks Infeasible.
func (s *Service) ControllerModifyVolume(ctx context.Context, req *csipb.ControllerModifyVolumeRequest) (*csipb.ControllerModifyVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if len(req.GetMutableParameters()) == 0 {
		return nil, volume.Errorf(volume.ErrInvalid, "mutable parameters are required")
	}
	h, err := s.volumes.OpenLive(ctx, id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if !h.Exists() {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s does not exist", id)
	}
	want, err := s.tierOf(ctx, req.GetMutableParameters(), h.State.Spec.Policy.Placement)
	if err != nil {
		return nil, err
	}
	want, old, err := s.recordAttributes(ctx, h, want)
	if err != nil {
		return nil, err
	}
	gen := want.Generation
	var refused error
	err = h.Wait(ctx, func(vs *storev1.VolumeState) (bool, error) {
		if vs == nil {
			return false, errors.New("volume deleted during the modification")
		}
		if a := vs.Spec.Attributes; a == nil || a.Generation != gen {
			return false, fmt.Errorf("%w: spec.attributes changed meanwhile", volume.ErrConflict)
		}
		for _, ap := range vs.Status.AppliedAttributes {
			if ap.Generation == gen && ap.Message != "" {
				refused = fmt.Errorf("node %s cannot apply the limits of VolumeAttributesClass %q: %s", ap.NodeName, want.Class, ap.Message)
				return true, nil
			}
			if ap.Generation < gen {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		if errors.Is(err, volume.ErrConflict) {
			return nil, volume.Errorf(volume.ErrConflict, "modify volume %s: %v", id, err)
		}
		return nil, volume.Errorf(volume.ErrTimeout, "modify volume %s: the node plugins have not applied VolumeAttributesClass %q: %v", id, want.Class, err)
	}
	if refused != nil {
		s.restoreAttributes(ctx, h, gen, old)
		return nil, volume.Errorf(volume.ErrPrecondition, "%w", refused)
	}
	return &csipb.ControllerModifyVolumeResponse{}, nil
}

// recordAttributes writes tier want into spec.attributes of the volume of h with the next
// generation, unless it is already the tier in force; it returns the tier recorded (with its
// generation) and the one in force before (nil: no tier). The update is a resourceVersion
// compare-and-swap: a concurrent write (the agent's status after the previous change, a
// node plugin's status.appliedAttributes) makes it conflict, and it is retried on the
// object as it is now, so that a status write never fails a modification.
func (s *Service) recordAttributes(ctx context.Context, h *volume.Handle[*storev1.VolumeState], want *storev1.VolumeAttributes) (recorded, before *storev1.VolumeAttributes, err error) {
	for attempt := 0; ; attempt++ {
		vs := h.State
		old := vs.Spec.Attributes.DeepCopy()
		if old != nil && old.Class == want.Class && old.Limits.Equal(&want.Limits) {
			return old, old, nil
		}
		next := want.DeepCopy()
		next.Generation = 1
		if old != nil {
			next.Generation = old.Generation + 1
		}
		vs.Spec.Attributes = next
		failpoint.Hit(failpoint.CSIModifyBeforeUpdate)
		err := h.Update(ctx) // resourceVersion CAS
		if err == nil {
			return next, old, nil
		}
		if !apierrors.IsConflict(err) {
			return nil, nil, volume.Errorf(volume.ErrInternal, "update VolumeState %s: %v", vs.Name, err)
		}
		if attempt >= 10 {
			return nil, nil, volume.Errorf(volume.ErrConflict, "VolumeState %s changed meanwhile %d times; retry", vs.Name, attempt+1)
		}
		if err := h.ReadLive(ctx); err != nil || !h.Exists() {
			return nil, nil, volume.Errorf(volume.ErrConflict, "reread VolumeState %s: %v", vs.Name, cmp.Or(err, errors.New("deleted meanwhile")))
		}
	}
}

// restoreAttributes sets spec.attributes of the volume of h back to before (nil: no tier)
// with a new generation, when it is still at gen, so that the nodes put the limits in force
// before back; a later change wins. Failures are logged: the next modification corrects the
// spec again.
func (s *Service) restoreAttributes(ctx context.Context, h *volume.Handle[*storev1.VolumeState], gen int64, before *storev1.VolumeAttributes) {
	if err := h.ReadLive(ctx); err != nil {
		s.log.Error(err, "restore attributes", "volume", h.ID)
		return
	}
	if !h.Exists() || h.State.Spec.Attributes == nil || h.State.Spec.Attributes.Generation != gen {
		return
	}
	restored := &storev1.VolumeAttributes{Generation: gen + 1} // no tier: generation keeps rising for the nodes
	if before != nil {
		restored = before.DeepCopy()
		restored.Generation = gen + 1
	}
	h.State.Spec.Attributes = restored
	if err := h.Update(ctx); err != nil {
		s.log.Error(err, "restore attributes", "volume", h.ID)
	}
}

// tierOf reads the tier named by the parameters of a VolumeAttributesClass (rendered from
// a Placement's attributesClasses: policyv1.AttributesClassParameters) for a volume of
// Placement placement. The class must be a tier of that Placement, and the live Placement
// must still declare it with the same limits (read from the API server, not the cache).
// Refusals are ErrInvalid naming the class and the Placement; a failed read is ErrUnavailable.
func (s *Service) tierOf(ctx context.Context, params map[string]string, placement string) (*storev1.VolumeAttributes, error) {
	ref, err := policyv1.ParseAttributesClassParameters(params)
	if err != nil {
		return nil, volume.Errorf(volume.ErrInvalid, "VolumeAttributesClass %q: %v", params[policyv1.AttributesClassName], err)
	}
	if ref.Placement != placement {
		return nil, volume.Errorf(volume.ErrInvalid, "VolumeAttributesClass %q is not allowed by Placement %q (the volume's): it is a tier of Placement %q",
			ref.Class, placement, ref.Placement)
	}
	// Read live, not from the informer cache: a cache that has not seen the Placement drop
	// or edit a tier would let a modification record limits the policy no longer allows
	// (and a refusal is final for csi-resizer: Infeasible). One GET per modification.
	var pl policyv1.Placement
	if err := s.live.Get(ctx, client.ObjectKey{Name: placement}, &pl); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, volume.Errorf(volume.ErrInvalid, "VolumeAttributesClass %q: Placement %q no longer exists", ref.Class, placement)
		}
		return nil, volume.Errorf(volume.ErrUnavailable, "read Placement %q: %v", placement, err)
	}
	t := pl.Spec.AttributesClass(ref.Class)
	switch {
	case t == nil:
		return nil, volume.Errorf(volume.ErrInvalid, "VolumeAttributesClass %q is not allowed by Placement %q: its attributesClasses do not list it", ref.Class, placement)
	case !t.Limits.Equal(&ref.Limits):
		return nil, volume.Errorf(volume.ErrInvalid, "VolumeAttributesClass %q differs from Placement %q's tier of that name (the class was edited, or the policy changed and the class was not re-rendered yet)", ref.Class, placement)
	}
	return &storev1.VolumeAttributes{Class: ref.Class, Limits: *t.Limits.DeepCopy(), Generation: 1}, nil
}

// createAttributes is the tier of a new volume of Placement placement: none without
// mutable_parameters (a claim without a VolumeAttributesClass), otherwise tierOf's.
func (s *Service) createAttributes(ctx context.Context, params map[string]string, placement string) (*storev1.VolumeAttributes, error) {
	if len(params) == 0 {
		return nil, nil
	}
	return s.tierOf(ctx, params, placement)
}
