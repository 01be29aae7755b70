package csi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/crypt"
	"github.com/plinth-storage/plinth/csi/mount"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// TestInGuestEncryptedNVMeoF runs in the qemu guest of TestGuestCSISanityLVMNVMeoF (subtest
// EncryptedNVMeoF): volumes of an encrypted class (LUKS2) over NVMe-oF/TCP on loopback, through
// the driver's gRPC socket and the real dm-crypt, the agent exporting the LV. The guest is the
// storage node and the consumer: the LV is what the storage node holds, the mapping what the
// consumer sees. The test reads the key Secret the controller made and hands it to NodeStage,
// standing in for kubelet (which reads the PV's nodeStageSecretRef under the Node authorizer).
func TestInGuestEncryptedNVMeoF(t *testing.T) {
	sock := inGuestSocket(t)
	params := readParams(t, "PLINTH_CSI_GUEST_LUKS_PARAMS")
	kube := guestKube(t)
	nodeName := os.Getenv("PLINTH_CSI_GUEST_NODE")
	conn := dialUnix(t, sock)
	ctrl, node := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn)
	ctx := t.Context()
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	capability := fsCap("ext4", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	marker := randomMarker(t)

	v := newEncryptedVolume(t, ctrl, kube, nodeName, "pvc-luks-in-guest", params, capability)
	id, pc, vc := v.id, v.pc, v.vc
	stageReq := &csipb.NodeStageVolumeRequest{VolumeId: id, PublishContext: pc, StagingTargetPath: staging, VolumeCapability: capability,
		VolumeContext: vc}

	t.Run("NoKeyRefusedNamingTheSecret", func(t *testing.T) {
		_, err := node.NodeStageVolume(ctx, stageReq)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), v.secret) {
			t.Fatalf("NodeStage without the Secret: %v, want FAILED_PRECONDITION naming %s", err, v.secret)
		}
	})

	stageReq.Secrets = v.key
	t.Run("StageWriteNoPlaintextOnTheStorageNode", func(t *testing.T) {
		if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
			t.Fatalf("second NodeStage: %v", err)
		}
		mapped := crypt.MapperPath(crypt.MapperName(id))
		if src, err := mount.New().SourceOf(staging); err != nil || mount.Resolve(src) != mount.Resolve(mapped) {
			t.Fatalf("staging mounted from %q (%v), want the mapping %s", src, err, mapped)
		}
		// the LUKS2 header is on top of the capacity asked: the mapping has all of it
		if size, err := mount.DeviceSize(mapped); err != nil || size < 64<<20 {
			t.Errorf("the mapping has %d bytes (%v), below the 64 MiB asked", size, err)
		}
		if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, PublishContext: pc, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: capability}); err != nil {
			t.Fatal(err)
		}
		writeSynced(t, filepath.Join(target, "data"), bytes.Repeat(marker, 2048))
		if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		unstage(t, node, id, staging)
		assertCiphertextOnly(t, lvOf(t, id), id, marker)
	})

	t.Run("WrongKeyRefusedNothingFormatted", func(t *testing.T) {
		lv := lvOf(t, id)
		before := strings.TrimSpace(run(t, "blkid", "-p", "-o", "value", "-s", "UUID", lv))
		wrong := proto.CloneOf(stageReq)
		wrong.Secrets = map[string]string{policyv1.VolumeKeyData: hex.EncodeToString(randomBytes(t, 64))}
		_, err := node.NodeStageVolume(ctx, wrong)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), v.secret) {
			t.Fatalf("NodeStage with a wrong key: %v, want FAILED_PRECONDITION naming %s", err, v.secret)
		}
		if strings.Contains(err.Error(), wrong.Secrets[policyv1.VolumeKeyData]) || strings.Contains(err.Error(), v.key[policyv1.VolumeKeyData]) {
			t.Fatal("the error holds a key")
		}
		if after := strings.TrimSpace(run(t, "blkid", "-p", "-o", "value", "-s", "UUID", lv)); after != before {
			t.Fatalf("LUKS UUID %q after a wrong key, %q before: formatted", after, before)
		}
		if m, _ := mount.New().IsMounted(staging); m {
			t.Fatal("mounted with a wrong key")
		}
		unstage(t, node, id, staging)
	})

	t.Run("RestageReadsBackExpandOnline", func(t *testing.T) {
		if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(staging, "data"))
		if err != nil || !bytes.HasPrefix(got, marker) {
			t.Fatalf("data after restage: %.40q %v", got, err)
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(staging, &st); err != nil {
			t.Fatal(err)
		}
		before := int64(st.Blocks) * st.Bsize
		if _, err := ctrl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20},
			VolumeCapability: capability}); err != nil {
			t.Fatal(err)
		}
		ne, err := node.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: id, VolumePath: staging, StagingTargetPath: staging,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20}, VolumeCapability: capability})
		if err != nil {
			t.Fatalf("NodeExpand of the mounted encrypted volume: %v", err)
		}
		if err := syscall.Statfs(staging, &st); err != nil {
			t.Fatal(err)
		}
		// 64 MiB more device, less the new block groups' inode tables and bitmaps
		if size := int64(st.Blocks) * st.Bsize; size < before+56<<20 || ne.GetCapacityBytes() != 128<<20 {
			t.Errorf("filesystem %d bytes before, %d after expansion from 64 to 128 MiB; NodeExpand says %d", before, size, ne.GetCapacityBytes())
		}
		if got, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || !bytes.HasPrefix(got, marker) {
			t.Fatalf("data after expansion: %.40q %v", got, err)
		}
		unstage(t, node, id, staging)
	})

	// a key rotation by a Git change while the volume is staged, published and written: the
	// Placement's keyGeneration raised, the driver's controller round writes the new key (the
	// old one as key-previous), the republish (standing in for kubelet's, CSIDriver
	// requiresRepublish, with the Secret read afresh) re-wraps the header under the mounted,
	// written filesystem and reports it, the round drops key-previous; then a restage opens
	// with the new key only, every byte written reads back and the LV holds ciphertext only
	t.Run("RotateWhileStagedAndWritten", func(t *testing.T) {
		secretNow := func() map[string]string {
			t.Helper()
			var sec corev1.Secret
			if err := kube.Get(ctx, client.ObjectKey{Namespace: policyv1.VolumeKeyNamespace, Name: v.secret[len(policyv1.VolumeKeyNamespace)+1:]}, &sec); err != nil {
				t.Fatal(err)
			}
			out := map[string]string{}
			for k, b := range sec.Data {
				out[k] = string(b)
			}
			return out
		}
		old := secretNow()
		if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, PublishContext: pc, StagingTargetPath: staging,
			VolumeCapability: capability, VolumeContext: vc, Secrets: old}); err != nil {
			t.Fatal(err)
		}
		pub := &csipb.NodePublishVolumeRequest{VolumeId: id, PublishContext: pc, StagingTargetPath: staging, TargetPath: target,
			VolumeCapability: capability, VolumeContext: vc, Secrets: old}
		if _, err := node.NodePublishVolume(ctx, pub); err != nil {
			t.Fatal(err)
		}
		rec := []byte(strings.Repeat(string(marker), 8))
		stop, done := make(chan struct{}), make(chan error, 1)
		var records atomic.Int64
		go func() { // one synced record every 10 ms until stopped
			f, err := os.OpenFile(filepath.Join(target, "log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				done <- err
				return
			}
			defer f.Close()
			pace := time.NewTicker(10 * time.Millisecond)
			defer pace.Stop()
			for {
				select {
				case <-stop:
					done <- nil
					return
				case <-pace.C:
				}
				if _, err := f.Write(rec); err != nil {
					done <- err
					return
				}
				if err := f.Sync(); err != nil {
					done <- err
					return
				}
				records.Add(1)
			}
		}()
		stopWriter := func() error {
			select {
			case <-stop:
				return nil
			default:
			}
			close(stop)
			return <-done
		}
		defer stopWriter() //nolint:errcheck

		var pl policyv1.Placement
		if err := kube.Get(ctx, client.ObjectKey{Name: params[policyv1.ParamPlacement]}, &pl); err != nil {
			t.Fatal(err)
		}
		gen := pl.Spec.Encryption.KeyGeneration + 1
		pl.Spec.Encryption.KeyGeneration = gen
		if err := kube.Update(ctx, &pl); err != nil {
			t.Fatal(err)
		}
		var rotated map[string]string
		if err := wait.Poll(ctx, 90*time.Second, 500*time.Millisecond, func() error {
			rotated = secretNow()
			if rotated[policyv1.VolumeKeyGenerationData] != strconv.FormatInt(gen, 10) || rotated[policyv1.VolumeKeyPreviousData] != old[policyv1.VolumeKeyData] {
				return fmt.Errorf("key Secret at generation %q, previous key set %v", rotated[policyv1.VolumeKeyGenerationData], rotated[policyv1.VolumeKeyPreviousData] != "")
			}
			return nil
		}); err != nil {
			t.Fatalf("the controller's rotation round: %v", err)
		}
		before := records.Load()
		pub.Secrets = rotated
		if _, err := node.NodePublishVolume(ctx, pub); err != nil {
			t.Fatalf("republish with the rotated Secret: %v", err)
		}
		var vs storev1.VolumeState
		if err := kube.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
			t.Fatal(err)
		}
		if st := vs.Status.Encryption; st == nil || st.KeyGeneration != gen || st.NodeName != nodeName {
			t.Fatalf("status.encryption %+v after the re-wrap, want generation %d from %s", st, gen, nodeName)
		}
		if err := wait.Poll(ctx, 90*time.Second, 500*time.Millisecond, func() error {
			if s := secretNow(); s[policyv1.VolumeKeyPreviousData] != "" {
				return errors.New("key-previous still in the Secret")
			}
			return nil
		}); err != nil {
			t.Fatalf("the round after the re-wrap: %v", err)
		}
		if err := wait.Poll(ctx, 10*time.Second, 20*time.Millisecond, func() error {
			if n := records.Load(); n <= before+10 {
				return fmt.Errorf("%d records since the re-wrap", n-before)
			}
			return nil
		}); err != nil {
			t.Fatalf("the writer stalled across the re-wrap: %v", err)
		}
		if err := stopWriter(); err != nil {
			t.Fatalf("the writer failed during the rotation: %v", err)
		}
		n := records.Load()
		t.Logf("%d records written and synced across the rotation, %d after the re-wrap", n, n-before)
		if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		unstage(t, node, id, staging)

		lv := lvOf(t, id)
		uuid := strings.TrimSpace(run(t, "blkid", "-p", "-o", "value", "-s", "UUID", lv))
		_, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, PublishContext: pc, StagingTargetPath: staging,
			VolumeCapability: capability, VolumeContext: vc, Secrets: old})
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("NodeStage with the key before the rotation: %v, want FAILED_PRECONDITION", err)
		}
		unstage(t, node, id, staging)
		if after := strings.TrimSpace(run(t, "blkid", "-p", "-o", "value", "-s", "UUID", lv)); after != uuid {
			t.Fatalf("LUKS UUID %q after the old key was refused, %q before", after, uuid)
		}
		stageReq.Secrets = secretNow()
		if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
			t.Fatalf("restage with the rotated key: %v", err)
		}
		got, err := os.ReadFile(filepath.Join(staging, "log"))
		if err != nil || !bytes.Equal(got, bytes.Repeat(rec, int(n))) {
			t.Fatalf("after restage: %d bytes read back (%v), %d written, or not the records written", len(got), err, int(n)*len(rec))
		}
		unstage(t, node, id, staging)
		assertCiphertextOnly(t, lv, id, marker)
	})

	// a snapshot of the (unstaged) volume, restored: a volume of its own, encrypted, whose key
	// Secret is a copy of the source's (the controller copied it through the snapshot's own),
	// opened on first stage and relabelled with its id; the source's data reads back
	t.Run("SnapshotRestoreOpensWithTheSourceKey", func(t *testing.T) {
		snap, err := ctrl.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "snapshot-luks-in-guest", SourceVolumeId: id})
		if err != nil {
			t.Fatal(err)
		}
		snapID := snap.GetSnapshot().GetSnapshotId()
		t.Cleanup(func() {
			if _, err := ctrl.DeleteSnapshot(context.Background(), &csipb.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
				t.Errorf("DeleteSnapshot: %v", err)
			}
		})
		if got := snap.GetSnapshot().GetSizeBytes(); got != 128<<20 {
			t.Errorf("snapshot of the 128 MiB volume: %d bytes, want what a restore gives (the header not counted)", got)
		}
		r := newEncryptedVolumeFrom(t, ctrl, kube, nodeName, "pvc-luks-restore-in-guest", params, capability,
			&csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}},
			snap.GetSnapshot().GetSizeBytes())
		// the source's key as its Secret holds it now (RotateWhileStagedAndWritten rotated it)
		var src corev1.Secret
		if err := kube.Get(ctx, client.ObjectKey{Namespace: policyv1.VolumeKeyNamespace, Name: v.secret[len(policyv1.VolumeKeyNamespace)+1:]}, &src); err != nil {
			t.Fatal(err)
		}
		if r.key[policyv1.VolumeKeyData] != string(src.Data[policyv1.VolumeKeyData]) {
			t.Fatal("the restore's key Secret does not hold the source's key")
		}
		if r.vc["plinth.dev/luks-labels"] != id {
			t.Errorf("the restore's volume context names header labels %q, want the source %s", r.vc["plinth.dev/luks-labels"], id)
		}
		rstaging := filepath.Join(dir, "rstaging")
		req := &csipb.NodeStageVolumeRequest{VolumeId: r.id, PublishContext: r.pc, StagingTargetPath: rstaging, VolumeCapability: capability,
			VolumeContext: r.vc, Secrets: r.key}
		if _, err := node.NodeStageVolume(ctx, req); err != nil {
			t.Fatalf("NodeStage of the restore: %v", err)
		}
		got, err := os.ReadFile(filepath.Join(rstaging, "data"))
		if err != nil || !bytes.HasPrefix(got, marker) {
			t.Fatalf("the restore reads %.40q (%v), want the source's data", got, err)
		}
		if size, err := mount.DeviceSize(crypt.MapperPath(crypt.MapperName(r.id))); err != nil || size < 128<<20 {
			t.Errorf("the restore's mapping has %d bytes (%v), below the 128 MiB asked", size, err)
		}
		unstage(t, node, r.id, rstaging)
		assertCiphertextOnly(t, lvOf(t, r.id), r.id, marker) // relabelled with its own id
		if _, err := node.NodeStageVolume(ctx, req); err != nil {
			t.Fatalf("second NodeStage of the restore (its own label now): %v", err)
		}
		unstage(t, node, r.id, rstaging)
	})

	t.Run("Block", func(t *testing.T) {
		blockCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
		b := newEncryptedVolume(t, ctrl, kube, nodeName, "pvc-luks-block-in-guest", params, blockCap)
		bstaging, btarget := filepath.Join(dir, "bstaging"), filepath.Join(dir, "btarget")
		if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: b.id, PublishContext: b.pc, StagingTargetPath: bstaging,
			VolumeCapability: blockCap, VolumeContext: b.vc, Secrets: b.key}); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: b.id, PublishContext: b.pc, StagingTargetPath: bstaging,
			TargetPath: btarget, VolumeCapability: blockCap}); err != nil {
			t.Fatal(err)
		}
		if size, err := mount.DeviceSize(btarget); err != nil || size < 64<<20 {
			t.Errorf("the pod's block device has %d bytes (%v), below the 64 MiB asked", size, err)
		}
		writeSynced(t, btarget, bytes.Repeat(marker, 2048))
		got := make([]byte, len(marker))
		f, err := os.Open(btarget)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.ReadAt(got, 0)
		f.Close()
		if err != nil || !bytes.Equal(got, marker) {
			t.Fatalf("the pod's block device reads %q (%v)", got, err)
		}
		if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: b.id, TargetPath: btarget}); err != nil {
			t.Fatal(err)
		}
		unstage(t, node, b.id, bstaging)
		assertCiphertextOnly(t, lvOf(t, b.id), b.id, marker)
	})

	t.Run("ThroughputAndCPU", func(t *testing.T) { measureEncryption(t, ctrl, node, kube, nodeName, params, dir) })
}

// measureEncryption measures, in one run, sequential O_DIRECT throughput (1 MiB blocks, 128 MiB
// written then read) and the guest's CPU busy share during it, of a clear and an encrypted
// block volume, each locally (the LV; for the encrypted one a LUKS2 mapping opened on the LV
// itself, as NodeStage of a local class would) and over NVMe-oF/TCP on loopback (the
// namespace, and the mapping NodeStage opened on it; the guest is initiator and target, so the
// CPU share holds both ends). Measured, not asserted: the guest runs under TCG, where AES is
// emulated, so the encrypted/clear ratio overstates what AES-NI hardware pays. BENCH lines;
// docs/performance.md keeps the figures.
func measureEncryption(t *testing.T, ctrl csipb.ControllerClient, node csipb.NodeClient, kube client.Client, nodeName string, luksParams map[string]string, dir string) {
	ctx := t.Context()
	var clearParams map[string]string
	data, err := os.ReadFile(filepath.Join(filepath.Dir(os.Getenv("PLINTH_CSI_GUEST_LUKS_PARAMS")), "params.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &clearParams); err != nil {
		t.Fatal(err)
	}
	const size = 128 << 20
	blockCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	enc := newEncryptedVolumeFrom(t, ctrl, kube, nodeName, "pvc-luks-bench-in-guest", luksParams, blockCap, nil, size)
	cv, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-clear-bench-in-guest", CapacityRange: &csipb.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csipb.VolumeCapability{blockCap}, Parameters: clearParams})
	if err != nil {
		t.Fatal(err)
	}
	clearID := cv.GetVolume().GetVolumeId()
	t.Cleanup(func() {
		if _, err := ctrl.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: clearID}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})
	pub, err := ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: clearID, NodeId: nodeName, VolumeCapability: blockCap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ctrl.ControllerUnpublishVolume(context.Background(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: clearID, NodeId: nodeName}); err != nil {
			t.Errorf("ControllerUnpublishVolume: %v", err)
		}
	})
	type row struct{ name, dev string }
	measure := func(r row) {
		for _, rw := range []string{"write", "read"} {
			mibps, cpu, perMiB := ddThroughput(t, r.dev, rw, size)
			t.Logf("BENCH encryption %s sequential %s 1MiB O_DIRECT %d MiB: %.1f MiB/s, guest CPU busy %.0f%%, %.1f CPU-ms/MiB", r.name, rw, size>>20, mibps, cpu, perMiB)
		}
	}
	// local: the LVs themselves (nothing staged yet)
	measure(row{"local clear (LV)", lvOf(t, clearID)})
	l := &crypt.LUKS{}
	mapped, err := l.Stage(ctx, lvOf(t, enc.id), enc.id, []byte(enc.key[policyv1.VolumeKeyData]), crypt.Params{Cipher: policyv1.DefaultCipher, KeySize: policyv1.DefaultKeySize})
	if err != nil {
		t.Fatal(err)
	}
	measure(row{"local LUKS2 (mapping on the LV)", mapped})
	if err := l.Close(ctx, crypt.MapperName(enc.id)); err != nil {
		t.Fatal(err)
	}
	// NVMe-oF: staged and published as a pod would get them
	for _, v := range []struct {
		name, id string
		pc, vc   map[string]string
		secrets  map[string]string
	}{
		{"NVMe-oF clear (namespace)", clearID, pub.GetPublishContext(), cv.GetVolume().GetVolumeContext(), nil},
		{"NVMe-oF LUKS2 (mapping on the namespace)", enc.id, enc.pc, enc.vc, enc.key},
	} {
		staging, target := filepath.Join(dir, "bench-staging-"+v.id), filepath.Join(dir, "bench-target-"+v.id)
		if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: v.id, PublishContext: v.pc, StagingTargetPath: staging,
			VolumeCapability: blockCap, VolumeContext: v.vc, Secrets: v.secrets}); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: v.id, PublishContext: v.pc, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: blockCap}); err != nil {
			t.Fatal(err)
		}
		measure(row{v.name, target})
		if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		unstage(t, node, v.id, staging)
	}
}

// ddThroughput writes (zeros) or reads bytes of dev with dd, 1 MiB blocks, O_DIRECT, and
// returns MiB/s, the share of all CPUs busy meanwhile (from /proc/stat: everything but idle
// and iowait) in percent, and the busy CPU time per MiB moved in milliseconds (USER_HZ 100).
func ddThroughput(t *testing.T, dev, rw string, bytes int64) (float64, float64, float64) {
	t.Helper()
	args := []string{"if=/dev/zero", "of=" + dev, "oflag=direct", "conv=fsync"}
	if rw == "read" {
		args = []string{"if=" + dev, "of=/dev/null", "iflag=direct"}
	}
	args = append(args, "bs=1M", "count="+strconv.FormatInt(bytes>>20, 10))
	busy0, total0 := cpuTimes(t)
	start := time.Now()
	run(t, "dd", args...)
	elapsed := time.Since(start)
	busy1, total1 := cpuTimes(t)
	mib := float64(bytes >> 20)
	return mib / elapsed.Seconds(), 100 * float64(busy1-busy0) / float64(max(total1-total0, 1)), float64(busy1-busy0) * 10 / mib
}

// cpuTimes returns the busy and total jiffies of all CPUs (/proc/stat's first line).
func cpuTimes(t *testing.T) (busy, total uint64) {
	t.Helper()
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	for i, f := range strings.Fields(line)[1:] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %q", line)
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// encryptedVolume is a volume of the encrypted class published to this node: its id, publish
// and volume contexts, its key Secret's name ("namespace/name") and the node-stage secrets
// kubelet would hand over.
type encryptedVolume struct {
	id, secret string
	pc, vc     map[string]string
	key        map[string]string
}

func newEncryptedVolume(t *testing.T, ctrl csipb.ControllerClient, kube client.Client, nodeName, name string, params map[string]string, capability *csipb.VolumeCapability) *encryptedVolume {
	t.Helper()
	return newEncryptedVolumeFrom(t, ctrl, kube, nodeName, name, params, capability, nil, 64<<20)
}

// newEncryptedVolumeFrom is newEncryptedVolume of a volume of required bytes made from source
// cs (nil: blank). The capacity reported is at least required (the LUKS2 header comes on top).
func newEncryptedVolumeFrom(t *testing.T, ctrl csipb.ControllerClient, kube client.Client, nodeName, name string, params map[string]string,
	capability *csipb.VolumeCapability, cs *csipb.VolumeContentSource, required int64) *encryptedVolume {
	t.Helper()
	ctx := t.Context()
	cv, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: required},
		VolumeCapabilities: []*csipb.VolumeCapability{capability}, Parameters: params, VolumeContentSource: cs})
	if err != nil {
		t.Fatal(err)
	}
	if got := cv.GetVolume().GetCapacityBytes(); got < required {
		t.Errorf("CreateVolume %s reports %d bytes, below the %d asked", name, got, required)
	}
	id, vc := cv.GetVolume().GetVolumeId(), cv.GetVolume().GetVolumeContext()
	t.Cleanup(func() {
		if _, err := ctrl.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})
	want := policyv1.VolumeKeyNamespace + "/" + policyv1.VolumeKeyPrefix + name
	if vc[csi.ContextEncryption] != "LUKS2" || vc[csi.ContextKeySecret] != want {
		t.Fatalf("volume context %v: want LUKS2 and the key Secret %s", vc, want)
	}
	var sec corev1.Secret
	if err := kube.Get(ctx, client.ObjectKey{Namespace: policyv1.VolumeKeyNamespace, Name: policyv1.VolumeKeyPrefix + name}, &sec); err != nil {
		t.Fatalf("the key Secret: %v", err)
	}
	k := sec.Data[policyv1.VolumeKeyData]
	if len(k) != 128 || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].Name != id {
		t.Fatalf("key Secret: %d key bytes (want 128 hex digits), owners %v (want the VolumeState %s)", len(k), sec.OwnerReferences, id)
	}
	pub, err := ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeName, VolumeCapability: capability})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ctrl.ControllerUnpublishVolume(context.Background(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeName}); err != nil {
			t.Errorf("ControllerUnpublishVolume: %v", err)
		}
	})
	return &encryptedVolume{id: id, secret: want, pc: pub.GetPublishContext(), vc: vc, key: map[string]string{policyv1.VolumeKeyData: string(k)}}
}

// unstage unstages id and checks that its mapping is closed and its subsystem disconnected.
func unstage(t *testing.T, node csipb.NodeClient, id, staging string) {
	t.Helper()
	if _, err := node.NodeUnstageVolume(t.Context(), &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(crypt.MapperPath(crypt.MapperName(id))); err == nil {
		t.Fatalf("the mapping of %s is open after unstage", id)
	}
	if nqns, _ := filepath.Glob("/sys/class/nvme-subsystem/*/subsysnqn"); len(nqns) > 0 {
		for _, n := range nqns {
			if strings.Contains(readSys(n), id) {
				t.Fatalf("%s still connected after unstage", id)
			}
		}
	}
}

// lvOf is the LV of volume id on the storage node (this guest): what the storage node holds.
func lvOf(t *testing.T, id string) string {
	t.Helper()
	for _, p := range strings.Fields(run(t, "lvs", "--noheadings", "-o", "lv_path")) {
		if strings.Contains(p, id) {
			return p
		}
	}
	t.Fatalf("no LV of %s", id)
	return ""
}

// assertCiphertextOnly reads the whole LV: a LUKS2 header labelled id, and marker nowhere.
func assertCiphertextOnly(t *testing.T, lv, id string, marker []byte) {
	t.Helper()
	if typ := strings.TrimSpace(run(t, "blkid", "-p", "-o", "value", "-s", "TYPE", lv)); typ != "crypto_LUKS" {
		t.Errorf("%s holds %q, want crypto_LUKS", lv, typ)
	}
	if label := strings.TrimSpace(run(t, "blkid", "-p", "-o", "value", "-s", "LABEL", lv)); label != id {
		t.Errorf("%s is labelled %q, want the volume id %s", lv, label, id)
	}
	data, err := os.ReadFile(lv)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, marker) {
		t.Fatalf("plaintext on the storage node's LV %s", lv)
	}
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func randomMarker(t testing.TB) []byte {
	return []byte("PLINTH-PLAINTEXT-" + hex.EncodeToString(randomBytes(t, 16)) + "\n")
}

func writeSynced(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
