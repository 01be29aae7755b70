package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The controller service creates the key Secret of each encrypted volume in Plinth's
// namespace (kustomize/rbac/csi_controller.yaml grants create there, and no read: a Secret
// that exists already is kept as it is, never read back or replaced).
//
// +kubebuilder:rbac:groups="",namespace=plinth-system,resources=secrets,verbs=create

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
// (its KeySecret in VolumeKeyNamespace with VolumeKeyPrefix): 64 bytes of crypto/rand, owned
// by the VolumeState (the garbage collector deletes the key after the volume). An existing
// Secret is kept untouched: it may hold the key of data already written. The key is never
// logged, nor put into an error, an event or the VolumeState.
func (s *Service) ensureVolumeKey(ctx context.Context, vs *storev1.VolumeState) error {
	e := vs.Spec.Policy.Encryption
	if e == nil || e.KeySecret == nil || e.KeySecret.Name != policyv1.VolumeKeyPrefix+vs.Spec.CSIName || e.KeySecret.Namespace != policyv1.VolumeKeyNamespace {
		return nil // clear, or the operator's Secret
	}
	raw := make([]byte, VolumeKeyBytes)
	if _, err := rand.Read(raw); err != nil {
		return volume.Errorf(volume.ErrInternal, "volume key of %s: random bytes: %v", vs.Name, err)
	}
	key := make([]byte, hex.EncodedLen(len(raw)))
	hex.Encode(key, raw)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: e.KeySecret.Name, Namespace: e.KeySecret.Namespace,
			Labels: map[string]string{LabelVolumeID: vs.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: storev1.GroupVersion.String(), Kind: "VolumeState",
				Name: vs.Name, UID: vs.UID}},
		},
		Type:      corev1.SecretTypeOpaque,
		Immutable: ptrTo(true),
		Data:      map[string][]byte{policyv1.VolumeKeyData: key},
	}
	if err := s.kube.Create(ctx, sec); err != nil && !apierrors.IsAlreadyExists(err) {
		return volume.Errorf(volume.ErrUnavailable, "create key Secret %s/%s of volume %s: %v", sec.Namespace, sec.Name, vs.Name, apierrors.ReasonForError(err))
	}
	return nil
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
