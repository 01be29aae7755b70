package agent

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/identity"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// claimRetryRefreshes is how many Store refreshes a volume whose PV was not found waits before
// its PV is read again (a PV appears only after CreateVolume answered; csi-sanity's volumes
// never get one): 2 minutes at the default 30 s.
const claimRetryRefreshes = 4

// desiredStamp is the identity stamp volume vs of Store s should carry: its own fields from
// the VolumeState, the claim from prior when prior names the same PV, else from pv (nil: no
// PV yet, the stamp names no claim).
func desiredStamp(s *storev1.Store, vs *storev1.VolumeState, prior *identity.Stamp, pv *corev1.PersistentVolume) (identity.Stamp, error) {
	digest, err := identity.PolicyDigest(vs.Spec.Policy)
	if err != nil {
		return identity.Stamp{}, err
	}
	st := identity.Stamp{VolumeID: vs.Name, Placement: vs.Spec.Policy.Placement, SizeBytes: vs.Spec.CapacityBytes,
		VolumeMode: vs.Spec.VolumeMode, PolicyDigest: digest, StoreUID: string(s.UID)}
	if st.VolumeMode == "Filesystem" {
		st.Filesystem = vs.Spec.Policy.Filesystem.FSType
	}
	switch {
	case prior != nil && prior.Bound() && prior.PVName == vs.Spec.CSIName:
		st.PVCNamespace, st.PVCName, st.PVCUID, st.PVName, st.StorageClass = prior.PVCNamespace, prior.PVCName, prior.PVCUID, prior.PVName, prior.StorageClass
	case pv != nil && pv.Spec.ClaimRef != nil && pv.Spec.CSI != nil && pv.Spec.CSI.VolumeHandle == vs.Name:
		c := pv.Spec.ClaimRef
		st.PVCNamespace, st.PVCName, st.PVCUID, st.PVName, st.StorageClass = c.Namespace, c.Name, string(c.UID), pv.Name, pv.Spec.StorageClassName
	}
	return st, st.Validate()
}

// stampVolume brings the identity stamp of vs's volume vol up to date on Store s (one write
// when it differs, none otherwise): the claim is read from the PV named by spec.csiName
// (csi-provisioner names a PV as the CreateVolume name) until the stamp holds it.
// Volumes not Ready, being deleted, or on a backend without stamps are left alone.
func (r *storeReconciler) stampVolume(ctx context.Context, s *storev1.Store, be backend.Backend, vs *storev1.VolumeState, vol *backend.Volume) {
	st, ok := be.(backend.Stamper)
	if !ok || vol == nil || vs.Status.Phase != storev1.VolumeReady || !vs.DeletionTimestamp.IsZero() || s.UID == "" {
		return
	}
	var pv *corev1.PersistentVolume
	if vol.Stamp == nil || !vol.Stamp.Bound() || vol.Stamp.PVName != vs.Spec.CSIName {
		r.mu.Lock()
		tried, seen := r.claimTried[vs.Name]
		r.mu.Unlock()
		if !seen || time.Since(tried) >= claimRetryRefreshes*r.opts.RefreshInterval {
			got := &corev1.PersistentVolume{}
			err := r.reader.Get(ctx, client.ObjectKey{Name: vs.Spec.CSIName}, got)
			switch {
			case err == nil:
				pv = got
			case apierrors.IsNotFound(err), apierrors.IsForbidden(err), apierrors.IsBadRequest(err):
			default:
				return // the API server is away: try at the next refresh
			}
			r.mu.Lock()
			if pv == nil {
				r.claimTried[vs.Name] = time.Now()
			} else {
				delete(r.claimTried, vs.Name)
			}
			r.mu.Unlock()
		}
	}
	want, err := desiredStamp(s, vs, vol.Stamp, pv)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "identity stamp of a volume", "volume", vs.Name)
		return
	}
	if vol.Stamp != nil && *vol.Stamp == want && vol.StampErr == nil {
		return
	}
	if err := st.Stamp(ctx, want); err != nil && !errors.Is(err, backend.ErrNotFound) {
		ctrl.LoggerFrom(ctx).Error(err, "write identity stamp", "volume", vs.Name)
		return
	}
	StampWrites.Inc()
}

// unclaimed is the Store status list of the volumes in vols no VolumeState names (known),
// sorted by id, at most storev1.MaxUnclaimed, and how many were left out. It only reads.
func unclaimed(vols []backend.Volume, known map[string]bool) ([]storev1.UnclaimedVolume, int32) {
	var out []storev1.UnclaimedVolume
	omitted := int32(0)
	for _, v := range vols {
		if known[v.ID] {
			continue
		}
		if len(out) == storev1.MaxUnclaimed {
			omitted++
			continue
		}
		u := storev1.UnclaimedVolume{VolumeID: v.ID, SizeBytes: v.SizeBytes}
		if v.Stamp != nil {
			u.Stamp, _ = v.Stamp.Line()
		}
		if v.StampErr != nil {
			u.StampError = v.StampErr.Error()
		}
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VolumeID < out[j].VolumeID })
	return out, omitted
}

// foreignStamp says why driftPolicy Correct must keep an orphan ("" when it may delete it):
// a stamp written under another Store object (the control plane that made the volume is
// gone, and its data waits for `plinth adopt`), or a stamp it cannot read.
func foreignStamp(s *storev1.Store, v backend.Volume) string {
	switch {
	case v.StampErr != nil:
		return fmt.Sprintf("its identity stamp is unreadable (%v)", v.StampErr)
	case v.Stamp != nil && v.Stamp.StoreUID != string(s.UID):
		return fmt.Sprintf("its identity stamp was written under another Store object (UID %s, a lost control plane): kept for plinth adopt", v.Stamp.StoreUID)
	}
	return ""
}

// adopts reports whether vs, made by `plinth adopt`, may take over its volume from the
// lifecycle of a lost control plane: it names (AnnotationAdoptedFrom) the Store UID that the
// volume's identity stamp holds, and that is not store's own UID (a stamp the current Store
// wrote means the volume's VolumeState of this control plane existed: no adoption).
func (r *node) adopts(ctx context.Context, vs *storev1.VolumeState, store *storev1.Store) bool {
	from := vs.Annotations[storev1.AnnotationAdoptedFrom]
	if from == "" || from == string(store.UID) {
		return false
	}
	be, err := r.backend(ctx, store, r.runtime(store))
	if err != nil {
		return false
	}
	st, ok := be.(backend.Stamper)
	if !ok {
		return false
	}
	got, err := st.ReadStamp(ctx, vs.Name)
	if err != nil || got == nil {
		return false
	}
	adopt := got.StoreUID == from && got.VolumeID == vs.Name
	if adopt {
		ctrl.LoggerFrom(ctx).Info("adopting a volume of a lost control plane: its old lifecycle is retired", "volume", vs.Name, "fromStoreUID", from)
	}
	return adopt
}
