package controller

import (
	"context"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// ControllerGetVolumeHealth reports the health of one volume as the API sees it (volumeHealth):
// INVALID_ARGUMENT without a volume id, NOT_FOUND when no VolumeState has it; no entries mean
// no adverse condition is known.
func (s *Service) ControllerGetVolumeHealth(ctx context.Context, req *csipb.ControllerGetVolumeHealthRequest) (*csipb.ControllerGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	vs, err := s.volumes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if vs == nil {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s does not exist", id)
	}
	var st *storev1.Store
	var got storev1.Store
	if err := s.kube.Get(ctx, client.ObjectKey{Name: vs.Spec.StoreName}, &got); err == nil {
		st = &got
	}
	return &csipb.ControllerGetVolumeHealthResponse{VolumeHealth: &csipb.VolumeHealth{
		VolumeId: id, HealthStatuses: volumeHealth(vs, st)}}, nil
}

// ControllerListVolumeHealth pages through every volume's health (volumeHealth), in volume id
// order, with the paging of ListVolumes: the token is the last volume id of the previous page;
// a token that is not a volume id is ABORTED, a negative max_entries INVALID_ARGUMENT.
func (s *Service) ControllerListVolumeHealth(ctx context.Context, req *csipb.ControllerListVolumeHealthRequest) (*csipb.ControllerListVolumeHealthResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, volume.Errorf(volume.ErrInvalid, "max_entries must not be negative")
	}
	var list storev1.VolumeStateList
	if err := s.kube.List(ctx, &list); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list VolumeStates: %v", err)
	}
	var stores storev1.StoreList
	if err := s.kube.List(ctx, &stores); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list Stores: %v", err)
	}
	byName := map[string]*storev1.Store{}
	for i := range stores.Items {
		byName[stores.Items[i].Name] = &stores.Items[i]
	}
	page, next, err := volumePage(list.Items, req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	resp := &csipb.ControllerListVolumeHealthResponse{NextToken: next}
	for i := range page {
		vs := &page[i]
		resp.Entries = append(resp.Entries, &csipb.VolumeHealth{VolumeId: vs.Name, HealthStatuses: volumeHealth(vs, byName[vs.Spec.StoreName])})
	}
	return resp, nil
}

// volumeHealth is the controller's view of a volume's health, from its VolumeState's status
// and its Store (st, nil when not in the cache), each condition once:
//   - phase Failed (the backend refused to make it): INACCESSIBLE, the Ready reason (VolumeFailed);
//   - Stalled=True or Fenced=True: INACCESSIBLE, that condition's reason;
//   - Drifted=True: INACCESSIBLE when the backend volume or export is missing (a reason
//     ending in Missing, such as LogicalVolumeMissing), DEGRADED for any other drift;
//   - its Store Ready=False because its node is deleted or its agent silent: INACCESSIBLE.
//
// None of these: no entries (healthy, or not known otherwise).
func volumeHealth(vs *storev1.VolumeState, st *storev1.Store) []*csipb.VolumeHealth_VolumeHealthEntry {
	var out []*csipb.VolumeHealth_VolumeHealthEntry
	add := func(status csipb.VolumeHealthErrorType, reason, msg string) {
		for _, e := range out {
			if e.Status == status && e.Reason == reason {
				return
			}
		}
		out = append(out, &csipb.VolumeHealth_VolumeHealthEntry{Status: status, Reason: reason, Message: msg})
	}
	conds := vs.Status.Conditions
	if vs.Status.Phase == storev1.VolumeFailed {
		reason, msg := storev1.ReasonVolumeFailed, "the backend failed to make the volume"
		if c := meta.FindStatusCondition(conds, storev1.ConditionReady); c != nil && c.Status != "True" && c.Reason != "" {
			reason, msg = c.Reason, c.Message
		}
		add(csipb.VolumeHealthErrorType_INACCESSIBLE, reason, msg)
	}
	for _, t := range []string{storev1.ConditionStalled, storev1.ConditionFenced} {
		if c := meta.FindStatusCondition(conds, t); c != nil && c.Status == "True" {
			add(csipb.VolumeHealthErrorType_INACCESSIBLE, c.Reason, c.Message)
		}
	}
	if c := meta.FindStatusCondition(conds, storev1.ConditionDrifted); c != nil && c.Status == "True" {
		status := csipb.VolumeHealthErrorType_DEGRADED
		if strings.HasSuffix(c.Reason, "Missing") {
			status = csipb.VolumeHealthErrorType_INACCESSIBLE
		}
		add(status, c.Reason, c.Message)
	}
	if st != nil {
		if c := meta.FindStatusCondition(st.Status.Conditions, storev1.ConditionReady); c != nil && c.Status == "False" &&
			(c.Reason == storev1.ReasonNodeDeleted || c.Reason == storev1.ReasonAgentSilent) {
			add(csipb.VolumeHealthErrorType_INACCESSIBLE, c.Reason, "Store "+st.Name+": "+c.Message)
		}
	}
	return out
}
