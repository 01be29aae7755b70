package controller

import (
	"context"
	"slices"
	"strconv"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/crypt"
	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The controller service creates the key Secret of each encrypted volume in the key
// namespace (policyv1.VolumeKeyNamespace, which holds volume and snapshot keys only), and
// reads there the key of a source (by name, no list or watch) to copy it into the Secret of a
// snapshot, restore or clone: their blocks carry the source's LUKS2 header. It updates a key
// Secret only in a key rotation (rotate.go) and never deletes one (the garbage collector
// deletes it with its owner).
//
// +kubebuilder:rbac:groups="",namespace=plinth-keys,resources=secrets,verbs=create;get

// VolumeKeyBytes is the number of random bytes of a generated volume key; the Secret holds
// them hex-encoded (2*VolumeKeyBytes characters), the passphrase of the volume's LUKS2 keyslot.
const VolumeKeyBytes = 64

// LabelVolumeID on a volume key Secret names the volume (CSI volume id) the key belongs to.
const LabelVolumeID = "plinth.dev/volume-id"

// encryptionOf resolves placement encryption e for the volume named csiName (the PV's name):
// the copy frozen into the volume, with its key Secret named. A per-volume key needs a CSI
// name that makes a Secret name (the PV names external-provisioner gives do); others are
// ErrInvalid.
func encryptionOf(e *policyv1.Encryption, csiName string) (*policyv1.Encryption, error) {
	if e == nil {
		return nil, nil
	}
	out := e.DeepCopy()
	// the generation is the Placement's, read live by the rotation round (rotate.go); the
	// frozen copy names the Secret instead (the CRD refuses both together)
	out.KeyGeneration = 0
	ref := policyv1.VolumeKeySecretRef(e, csiName)
	if e.KeySecret == nil {
		if errs := validation.IsDNS1123Subdomain(ref.Name); len(errs) > 0 {
			return nil, volume.Errorf(volume.ErrInvalid, "volume %q of an encrypted class: its key Secret name %q is not valid: %s", csiName, ref.Name, errs[0])
		}
	}
	out.KeySecret = &ref
	return out, nil
}

// ensureVolumeKey creates the key Secret of vs when its encryption asks for a per-volume key
// (its KeySecret in VolumeKeyNamespace with VolumeKeyPrefix): 64 bytes of crypto/rand, or the
// key of vs.Spec.KeyOrigin.Secret (a restore or clone: its header is the source's), owned by
// the VolumeState (the garbage collector deletes the key after the volume). An existing
// Secret is kept untouched: it may hold the key of data already written. The key is never
// logged, nor put into an error, an event or the VolumeState.
func (s *Service) ensureVolumeKey(ctx context.Context, vs *storev1.VolumeState) error {
	e := vs.Spec.Policy.Encryption
	if e == nil || e.KeySecret == nil || e.KeySecret.Name != policyv1.VolumeKeyPrefix+vs.Spec.CSIName || e.KeySecret.Namespace != policyv1.VolumeKeyNamespace {
		return nil // clear, or the operator's Secret
	}
	var from *policyv1.SecretReference
	if o := vs.Spec.KeyOrigin; o != nil {
		from = o.Secret
	}
	owner := metav1.OwnerReference{APIVersion: storev1.GroupVersion.String(), Kind: "VolumeState", Name: vs.Name, UID: vs.UID}
	return s.createKey(ctx, *e.KeySecret, from, vs.Name, owner)
}

// ensureSnapshotKey creates the key Secret of snapshot ss when it has one of its own (a
// snapshot of a volume with a per-volume key): a copy of the source's, owned by the
// VolumeSnapshotState, so that restores open after the source volume and its Secret are gone.
func (s *Service) ensureSnapshotKey(ctx context.Context, ss *storev1.VolumeSnapshotState) error {
	e, o := ss.Spec.Encryption, ss.Spec.KeyOrigin
	if e == nil || e.KeySecret == nil || o == nil || o.Secret == nil {
		return nil
	}
	owner := metav1.OwnerReference{APIVersion: storev1.GroupVersion.String(), Kind: "VolumeSnapshotState", Name: ss.Name, UID: ss.UID}
	return s.createKey(ctx, *e.KeySecret, o.Secret, ss.Name, owner)
}

// createKey creates the key Secret ref owned by owner, labelled with the id of its volume or
// snapshot: a copy of Secret from's key, previous key and generation (read by name,
// uncached), or 64 random bytes (no generation: 0) when from is nil. An existing ref is kept
// as it is (only a key rotation, rotate.go, updates it). Errors: ErrPrecondition when from
// is gone or holds no key (the source's key is lost: nothing could open the blocks),
// ErrUnavailable when the API server fails.
func (s *Service) createKey(ctx context.Context, ref policyv1.SecretReference, from *policyv1.SecretReference, id string, owner metav1.OwnerReference) error {
	data := map[string][]byte{}
	if from == nil {
		key, err := newVolumeKey()
		if err != nil {
			return volume.Errorf(volume.ErrInternal, "volume key of %s: %v", id, err)
		}
		data[policyv1.VolumeKeyData] = key
	} else {
		var src corev1.Secret
		err := s.live.Get(ctx, client.ObjectKey{Namespace: from.Namespace, Name: from.Name}, &src)
		switch {
		case apierrors.IsNotFound(err):
			// a retry after the copy: the source may be gone since, its copy is kept
			if s.keyExists(ctx, ref) {
				return nil
			}
			return volume.Errorf(volume.ErrPrecondition, "key of %s: the source's key Secret %s/%s does not exist", id, from.Namespace, from.Name)
		case err != nil:
			return volume.Errorf(volume.ErrUnavailable, "key of %s: read the source's key Secret %s/%s: %v", id, from.Namespace, from.Name, apierrors.ReasonForError(err))
		}
		if len(src.Data[policyv1.VolumeKeyData]) < policyv1.VolumeKeyMinBytes {
			return volume.Errorf(volume.ErrPrecondition, "key of %s: the source's key Secret %s/%s holds no key %q", id, from.Namespace, from.Name, policyv1.VolumeKeyData)
		}
		// mid-rotation, the source's header may still hold the previous key: both are copied,
		// and the first stage of the copy re-wraps its header to the key
		for _, k := range []string{policyv1.VolumeKeyData, policyv1.VolumeKeyPreviousData, policyv1.VolumeKeyGenerationData} {
			if v, ok := src.Data[k]; ok {
				data[k] = v
			}
		}
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: ref.Name, Namespace: ref.Namespace,
			Labels:          map[string]string{LabelVolumeID: id},
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	if err := s.kube.Create(ctx, sec); err != nil && !apierrors.IsAlreadyExists(err) {
		return volume.Errorf(volume.ErrUnavailable, "create key Secret %s/%s of %s: %v", sec.Namespace, sec.Name, id, apierrors.ReasonForError(err))
	}
	return nil
}

// keyExists reports whether the key Secret ref exists (a read by name; failures count as
// absent: the caller then reports the source's key missing).
func (s *Service) keyExists(ctx context.Context, ref policyv1.SecretReference) bool {
	var sec corev1.Secret
	return s.live.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &sec) == nil
}

// keyOrigin is the KeyOrigin of an object (volume or snapshot) made from blocks whose LUKS2
// header may carry labels, opened by the key of Secret srcKey, under the new object's key
// Secret key: the Secret to copy when key is one of Plinth's (per volume or snapshot), and the
// labels, at most MaxHeaderLabels.
func keyOrigin(labels []string, srcKey, key *policyv1.SecretReference) *storev1.KeyOrigin {
	o := &storev1.KeyOrigin{HeaderLabels: slices.Clone(labels[:min(len(labels), storev1.MaxHeaderLabels)])}
	if isVolumeKey(key) && srcKey != nil && *srcKey != *key {
		o.Secret = srcKey.DeepCopy()
	}
	return o
}

// isVolumeKey reports whether Secret ref is a per-volume (or per-snapshot) key Secret, one
// Plinth made, rather than the operator's.
func isVolumeKey(ref *policyv1.SecretReference) bool {
	return ref != nil && ref.Namespace == policyv1.VolumeKeyNamespace && strings.HasPrefix(ref.Name, policyv1.VolumeKeyPrefix)
}

// encryptionContext adds the volume context of frozen encryption e to vc: what NodeStage
// formats and opens with, and which Secret it expects (names only).
func encryptionContext(vc map[string]string, e *policyv1.Encryption) {
	provider, cipher, bits := e.Provider, e.Cipher, e.KeySize
	if provider == "" {
		provider = policyv1.EncryptionLUKS2
	}
	if cipher == "" {
		cipher = policyv1.DefaultCipher
	}
	if bits == 0 {
		bits = policyv1.DefaultKeySize
	}
	vc[volume.ContextEncryption] = string(provider)
	vc[volume.ContextCipher] = cipher
	vc[volume.ContextKeySize] = strconv.Itoa(int(bits))
	if e.KeySecret != nil {
		vc[volume.ContextKeySecret] = e.KeySecret.Namespace + "/" + e.KeySecret.Name
	}
}

func ptrTo[T any](v T) *T { return &v }

// Sizes of encrypted volumes: the LUKS2 header takes crypt.HeaderBytes at the start of the
// backend volume, so the backend is made that much larger than the capacity asked, and the
// capacity reported to the CO (CreateVolume, ListVolumes, ControllerExpandVolume, a
// snapshot's size) is the backend's less the header: what the filesystem or block device
// inside the mapping gets. VolumeState and VolumeSnapshotState sizes are the backend's.

// headerBytes is the room the LUKS2 header takes in the backend of a volume encrypted with
// e: crypt.HeaderBytes, or 0 for a clear volume (nil).
func headerBytes(e *policyv1.Encryption) int64 {
	if e == nil {
		return 0
	}
	return crypt.HeaderBytes
}

// usableBytes is the capacity reported for a backend of size bytes of volume vs.
func usableBytes(vs *storev1.VolumeState, size int64) int64 {
	return max(size-headerBytes(vs.Spec.Policy.Encryption), 0)
}

// backendRange is the capacity range of the backend volume that gives rng to a volume whose
// header takes header bytes: required and limit (when set) plus the header.
func backendRange(rng *csipb.CapacityRange, header int64) *csipb.CapacityRange {
	if header == 0 || rng == nil {
		return rng
	}
	out := &csipb.CapacityRange{RequiredBytes: rng.GetRequiredBytes(), LimitBytes: rng.GetLimitBytes()}
	if out.RequiredBytes > 0 {
		out.RequiredBytes += header
	}
	if out.LimitBytes > 0 {
		out.LimitBytes += header
	}
	return out
}
