package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func (s *Service) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if !storev1.IsVolumeID(id) {
		return &csipb.DeleteVolumeResponse{}, nil // never ours: nothing to delete, OK (CSI spec)
	}
	// The subscription comes with the lock, so that the agent's release cannot slip between
	// the read below and the wait.
	h, err := s.volumes.Open(id)
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

// agentAnswerGrace is how long DeleteVolume waits for the agent before it reads whether the
// agent can answer at all (its Store and Node, two live reads): the agent writes its own
// progress after a second of work (agents/agent Options.ProgressAfter), so a volume still there
// after it is one the agent is slow with, or one no agent is working on.
const agentAnswerGrace = time.Second

// awaitDeletion waits until the volume of h, marked for deletion, is gone: the agent removed
// export and volume and released its finalizer — and the informer cache knows it too (an agent
// quicker than DeleteVolume's read would otherwise leave the volume in ListVolumes, which reads
// the cache, after DeleteVolume returns). An agent answers most deletions within moments; only
// one that has not within agentAnswerGrace is asked about: an agent that cannot answer (its
// node deleted, or silent) would keep the call waiting for the whole wait timeout, so say so
// then (UNAVAILABLE; the provisioner retries with backoff), or release the volume of a node
// that left the cluster.
func (s *Service) awaitDeletion(ctx context.Context, h *volume.Handle[*storev1.VolumeState]) error {
	id, cur := h.ID, h.State
	gone := func(vs *storev1.VolumeState) (bool, error) {
		if vs != nil {
			return false, nil
		}
		return !h.Cached(ctx), nil
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

// releaseOfGoneNode removes the agent's finalizer from the volume of h, marked for deletion,
// whose node left the cluster: no agent will ever remove it, and the volume left with the node.
// It rereads h.State. A conflict (the object moved meanwhile) is UNAVAILABLE: the provisioner
// retries.
func (s *Service) releaseOfGoneNode(ctx context.Context, h *volume.Handle[*storev1.VolumeState], why string) error {
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
	s.log.Info("released the finalizer of a volume whose node left the cluster", "volume", h.ID, "reason", why)
	return nil
}
