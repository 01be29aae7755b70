package node

import (
	"context"
	"errors"
	"strconv"

	"github.com/plinth-storage/plinth/csi/crypt"
	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/stage"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
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
func (s *Service) stageCrypt(ctx context.Context, rec stage.Record, key []byte, vc map[string]string) error {
	bits, _ := strconv.Atoi(vc[volume.ContextKeySize])
	if bits == 0 {
		bits = policyv1.DefaultKeySize
	}
	cipher := vc[volume.ContextCipher]
	if cipher == "" {
		cipher = policyv1.DefaultCipher
	}
	_, err := s.crypt.Stage(ctx, rec.Backing, rec.VolumeID, key, crypt.Params{Cipher: cipher, KeySize: bits})
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
	return nil
}

// growCrypt grows the mapping of rec to its backing device once that has want bytes, and
// returns want less the LUKS2 header (the size asked of the mapping) and the header's size.
// UNAVAILABLE while the backing device is smaller (the agent or the initiator has not caught
// up).
func (s *Service) growCrypt(ctx context.Context, rec stage.Record, want int64) (int64, int64, error) {
	size, err := mount.DeviceSize(rec.Backing)
	if err != nil {
		return 0, 0, volume.Errorf(volume.ErrInternal, "device size of %s: %v", rec.Backing, err)
	}
	if size < want {
		return 0, 0, volume.Errorf(volume.ErrUnavailable, "device %s has %d bytes, %d asked: not grown yet", rec.Backing, size, want)
	}
	if err := s.crypt.Resize(ctx, rec.Crypt); err != nil {
		return 0, 0, volume.Errorf(volume.ErrInternal, "resize the mapping %s: %v", rec.Crypt, err)
	}
	mapped, err := mount.DeviceSize(rec.Device)
	if err != nil {
		return 0, 0, volume.Errorf(volume.ErrInternal, "device size of %s: %v", rec.Device, err)
	}
	header := size - mapped
	return want - header, header, nil
}
