package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/crypt"
	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/stage"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Encrypted volumes (docs/design.md#volume-encryption): the volume context says LUKS2, and
// kubelet hands the key Secret the StorageClass names (node-stage secret) to NodeStage. The
// node plugin itself reads no Secret.

// volumeKey returns the passphrase of encrypted volume id from the node-stage secrets:
// FAILED_PRECONDITION naming the Secret when it is missing or too short (the device is not
// touched).
func volumeKey(id string, vc, secrets map[string]string) ([]byte, error) {
	k := secrets[policyv1.VolumeKeyData]
	switch {
	case k == "":
		return nil, volume.Errorf(volume.ErrPrecondition, "volume %s is encrypted and NodeStage got no key: data %q of the node-stage Secret %s (does it exist, and does the StorageClass name it?)",
			id, policyv1.VolumeKeyData, keySecretName(vc))
	case len(k) < policyv1.VolumeKeyMinBytes:
		return nil, volume.Errorf(volume.ErrPrecondition, "volume %s: the key in Secret %s is shorter than %d bytes", id, keySecretName(vc), policyv1.VolumeKeyMinBytes)
	}
	return []byte(k), nil
}

func keySecretName(vc map[string]string) string {
	if n := vc[volume.ContextKeySecret]; n != "" {
		return n
	}
	return "(not named in the volume context)"
}

// cryptRecord points rec at the mapping of encrypted volume id: the device the volume was
// found at becomes the backing device, the mapping the device that is formatted, mounted or
// handed up. Saved before the mapping is made, so that unstage closes it after any crash.
func cryptRecord(rec *stage.Record, id string) {
	rec.Crypt = crypt.MapperName(id)
	rec.Backing = rec.Device
	rec.Device = crypt.MapperPath(rec.Crypt)
}

// stageCrypt formats (a blank device only) and opens the mapping of rec with key. A wrong
// key, another volume's header or a clear volume's data is FAILED_PRECONDITION naming what
// was found; the device is never formatted then.
func (s *Service) stageCrypt(ctx context.Context, rec stage.Record, key []byte, vc, secrets map[string]string) error {
	bits, _ := strconv.Atoi(vc[volume.ContextKeySize])
	if bits == 0 {
		bits = policyv1.DefaultKeySize
	}
	cipher := vc[volume.ContextCipher]
	if cipher == "" {
		cipher = policyv1.DefaultCipher
	}
	p := crypt.Params{Cipher: cipher, KeySize: bits}
	if l := vc[volume.ContextHeaderLabels]; l != "" { // a restore or clone: the source's header
		p.Inherited = strings.Split(l, ",")
	}
	p.Previous = previousKey(secrets)
	_, err := s.crypt.Stage(ctx, rec.Backing, rec.VolumeID, key, p)
	switch {
	case errors.Is(err, crypt.ErrWrongKey):
		return volume.Errorf(volume.ErrPrecondition, "volume %s: the key of Secret %s opens no keyslot of its LUKS2 header on %s: %v", rec.VolumeID, keySecretName(vc), rec.Backing, err)
	case errors.Is(err, crypt.ErrForeignHeader), errors.Is(err, crypt.ErrBusy):
		return volume.Errorf(volume.ErrPrecondition, "volume %s: %v", rec.VolumeID, err)
	case errors.Is(err, crypt.ErrNotEncrypted):
		return volume.Errorf(volume.ErrPrecondition, "volume %s is encrypted by its policy, but %v (an existing clear volume is never formatted)", rec.VolumeID, err)
	case err != nil:
		return volume.Errorf(volume.ErrInternal, "volume %s: LUKS2 on %s: %v", rec.VolumeID, rec.Backing, err)
	}
	s.reportKeyGeneration(ctx, rec.VolumeID, secrets)
	return nil
}

// previousKey is the passphrase a key rotation replaced (the key Secret's key-previous), or
// nil when there is none or it is too short to be one.
func previousKey(secrets map[string]string) []byte {
	if k := secrets[policyv1.VolumeKeyPreviousData]; len(k) >= policyv1.VolumeKeyMinBytes {
		return []byte(k)
	}
	return nil
}

// rewrapStaged re-wraps the LUKS2 header of staged volume rec to the key of secrets when they
// hold a previous key (a rotation in flight): NodePublishVolume calls it at every publish,
// and kubelet republishes a mounted volume periodically with the Secret read afresh
// (CSIDriver requiresRepublish), so a rotation reaches volumes that stay staged for months.
// The mapping stays open and the filesystem mounted: only the header changes. A failure is
// logged and reported as a Warning event, never returned: the volume keeps working with its
// old keyslot and the next republish retries.
func (s *Service) rewrapStaged(ctx context.Context, rec stage.Record, secrets map[string]string) {
	prev := previousKey(secrets)
	key := secrets[policyv1.VolumeKeyData]
	if rec.Crypt == "" || prev == nil || len(key) < policyv1.VolumeKeyMinBytes {
		return
	}
	if _, err := s.crypt.Rewrap(ctx, rec.Backing, prev, []byte(key)); err != nil {
		s.log.Error(err, "key rotation: re-wrap the LUKS2 header", "volume", rec.VolumeID, "device", rec.Backing)
		s.warnVolume(ctx, rec.VolumeID, "KeyRewrapFailed", fmt.Sprintf("re-wrap of the LUKS2 header of volume %s on node %s failed (the volume keeps its current keyslot; the next publish retries): %v", rec.VolumeID, s.nodeName, err))
		return
	}
	s.reportKeyGeneration(ctx, rec.VolumeID, secrets)
}

// reportKeyGeneration sets status.encryption of volume id to the generation of the key in
// secrets (their "generation", 0 when absent) and this node, after a stage or re-wrap made
// the header open with that key only; nothing is written when it says so already. A failure
// (conflict, API down) is left to the next stage or republish.
func (s *Service) reportKeyGeneration(ctx context.Context, id string, secrets map[string]string) {
	if s.kube == nil || secrets[policyv1.VolumeKeyData] == "" {
		return
	}
	gen, err := strconv.ParseInt(secrets[policyv1.VolumeKeyGenerationData], 10, 64)
	if err != nil || gen < 0 {
		gen = 0
	}
	var vs storev1.VolumeState
	if err := s.kube.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
		return
	}
	want := storev1.EncryptionStatus{KeyGeneration: gen, NodeName: s.nodeName}
	if st := vs.Status.Encryption; st != nil && *st == want {
		return
	}
	vs.Status.Encryption = &want
	if err := s.kube.Status().Update(ctx, &vs); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		s.log.Error(err, "key rotation: report the header's key generation", "volume", id, "generation", gen)
	}
}

// warnVolume records a Warning event on VolumeState id (dropped without a recorder or when the
// VolumeState cannot be read).
func (s *Service) warnVolume(ctx context.Context, id, reason, msg string) {
	if s.events == nil || s.kube == nil {
		return
	}
	var vs storev1.VolumeState
	if err := s.kube.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
		return
	}
	s.events.Eventf(&vs, nil, "Warning", reason, "KeyRotation", "%s", msg)
}

// growCrypt grows the mapping of rec to its backing device, once that is large enough for the
// mapping to have want bytes (the capacity the CO asked: the controller made the backing
// device the LUKS2 header larger). UNAVAILABLE while the mapping would be smaller (the agent
// or the initiator has not caught up).
func (s *Service) growCrypt(ctx context.Context, rec stage.Record, want int64) error {
	size, err := mount.DeviceSize(rec.Backing)
	if err != nil {
		return volume.Errorf(volume.ErrInternal, "device size of %s: %v", rec.Backing, err)
	}
	if size < want+crypt.HeaderBytes {
		return volume.Errorf(volume.ErrUnavailable, "device %s has %d bytes, %d asked and %d of LUKS2 header: not grown yet", rec.Backing, size, want, crypt.HeaderBytes)
	}
	if err := s.crypt.Resize(ctx, rec.Crypt); err != nil {
		return volume.Errorf(volume.ErrInternal, "resize the mapping %s: %v", rec.Crypt, err)
	}
	return nil
}
