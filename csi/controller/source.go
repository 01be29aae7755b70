package controller

import (
	"context"
	"slices"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// source is a CreateVolume content source resolved to the API objects: where the new volume
// must live and how small it may be.
type source struct {
	spec      storev1.ContentSource
	storeName string
	pool      string
	minBytes  int64 // the source's size: a restore or clone is never smaller
	what      string
	// encryption is the source volume's (nil: clear), KeySecret resolved
	encryption *policyv1.Encryption
}

// contentSource resolves a CreateVolume content source: NOT_FOUND when the snapshot or volume
// does not exist (CSI spec, CreateVolume errors), UNAVAILABLE while a snapshot is not ready to
// use, INVALID_ARGUMENT when its backend has no snapshots or clones.
func (s *Service) contentSource(ctx context.Context, cs *csipb.VolumeContentSource) (*source, error) {
	if snap := cs.GetSnapshot(); snap != nil {
		id := snap.GetSnapshotId()
		ss, err := s.snapshots.Get(ctx, id)
		if ss == nil && (err == nil || !storev1.IsSnapshotID(id)) {
			return nil, volume.Errorf(volume.ErrNotFound, "source snapshot %s does not exist", id)
		}
		if err != nil {
			return nil, err
		}
		if ss.DeletionTimestamp != nil {
			return nil, volume.Errorf(volume.ErrNotFound, "source snapshot %s is being deleted", id)
		}
		if !ss.Status.ReadyToUse {
			return nil, volume.Errorf(volume.ErrUnavailable, "source snapshot %s is not ready to use yet", id)
		}
		return &source{spec: storev1.ContentSource{Snapshot: id}, storeName: ss.Spec.StoreName, pool: ss.Spec.Pool,
			minBytes: ss.Status.SizeBytes, what: "snapshot " + id, encryption: ss.Spec.Encryption}, nil
	}
	if vol := cs.GetVolume(); vol != nil {
		id := vol.GetVolumeId()
		vs, err := s.volumes.Get(ctx, id)
		if vs == nil && (err == nil || !storev1.IsVolumeID(id)) {
			return nil, volume.Errorf(volume.ErrNotFound, "source volume %s does not exist", id)
		}
		if err != nil {
			return nil, err
		}
		if why := snapshotsSupported(vs.Spec.Policy.Backend); why != "" {
			return nil, volume.Errorf(volume.ErrInvalid, "clone of volume %s: %s", id, why)
		}
		if vs.DeletionTimestamp != nil {
			return nil, volume.Errorf(volume.ErrNotFound, "source volume %s is being deleted", id)
		}
		if ok, _ := volume.ReadyOrFailed(vs); !ok {
			return nil, volume.Errorf(volume.ErrUnavailable, "source volume %s is not ready yet", id)
		}
		return &source{spec: storev1.ContentSource{Volume: id}, storeName: vs.Spec.StoreName, pool: vs.Spec.Policy.Pool,
			minBytes: max(vs.Spec.CapacityBytes, vs.Status.ActualBytes), what: "volume " + id, encryption: vs.Spec.Policy.Encryption}, nil
	}
	return nil, volume.Errorf(volume.ErrInvalid, "volume content source names neither a snapshot nor a volume")
}

// sourceStore returns the Store a volume made from src must live on, with the volume's size:
// the source's own Store (the data is there), in the StorageClass's pool; for a local class
// only when the requested topology allows that node (a local volume cannot reach another
// node); for NVMe-oF the volume is made on the storage node and exported to the consumer. The
// size is the request rounded to the store's unit, or the source's size when none is given;
// a request that rounds below the source's size is OUT_OF_RANGE.
func sourceStore(src *source, stores []storev1.Store, pool string, nvme bool, strategy policyv1.Strategy, req *csipb.TopologyRequirement, required, limit int64) (*storev1.Store, int64, error) {
	if src.pool != pool {
		return nil, 0, volume.Errorf(volume.ErrInvalid, "%s lives in pool %q; the StorageClass asks for pool %q: a restore or clone stays in its source's pool", src.what, src.pool, pool)
	}
	i := slices.IndexFunc(stores, func(st storev1.Store) bool { return st.Name == src.storeName })
	if i < 0 {
		return nil, 0, volume.Errorf(volume.ErrPrecondition, "store %s of %s is gone", src.storeName, src.what)
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
			return nil, 0, volume.Errorf(volume.ErrInvalid,
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
		return nil, 0, volume.Errorf(volume.ErrOutOfRange, "%w", err)
	}
	if size < src.minBytes {
		return nil, 0, volume.Errorf(volume.ErrOutOfRange, "%d bytes asked (%d after rounding to the store's unit of %d): smaller than the %d bytes of %s", required, size, unit, src.minBytes, src.what)
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

// sameKey refuses a restore or clone whose blocks the new volume could not open, or would hold
// in clear on an encrypted class: the source's encryption and the new volume's must both be
// off, or both name the same operator Secret (the blocks carry the source's LUKS2 header,
// whose keyslot that Secret opens). A per-volume key is the source's alone, which the
// controller cannot read (it may create Secrets, never read them): such a source is refused.
func sameKey(src *source, enc *policyv1.Encryption) error {
	se := src.encryption
	switch {
	case se == nil && enc == nil:
		return nil
	case se == nil:
		return volume.Errorf(volume.ErrInvalid, "%s is not encrypted: an encrypted class cannot restore or clone it (its data would stay in clear)", src.what)
	case enc == nil:
		return volume.Errorf(volume.ErrInvalid, "%s is encrypted: a class without encryption cannot open it", src.what)
	case se.KeySecret != nil && enc.KeySecret != nil && *se.KeySecret == *enc.KeySecret:
		return nil // one operator Secret (per-volume Secrets differ by the PV name in theirs)
	}
	return volume.Errorf(volume.ErrInvalid, "%s is encrypted with a key of its own: restoring or cloning a volume with a per-volume key is not supported (use a class Secret, encryption.keySecret)", src.what)
}
