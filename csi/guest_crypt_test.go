package csi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/crypt"
	"github.com/plinth-storage/plinth/csi/mount"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// TestInGuestEncryptedNVMeoF runs in the qemu guest of TestGuestCSISanityLVMNVMeoF (subtest
// EncryptedNVMeoF): volumes of an encrypted class (LUKS2) over NVMe-oF/TCP on loopback, through
// the driver's gRPC socket and the real dm-crypt, the agent exporting the LV. The guest is the
// storage node and the consumer: the LV is what the storage node holds, the mapping what the
// consumer sees. The test reads the key Secret the controller made and hands it to NodeStage,
// standing in for kubelet (which reads the PV's nodeStageSecretRef under the Node authorizer).
func TestInGuestEncryptedNVMeoF(t *testing.T) {
	sock := os.Getenv("PLINTH_CSI_GUEST_SOCKET")
	if sock == "" {
		t.Skip("runs in the qemu guest of TestGuestCSISanityLVMNVMeoF (PLINTH_GUEST_CSI=1), which sets PLINTH_CSI_GUEST_SOCKET")
	}
	var params map[string]string
	data, err := os.ReadFile(os.Getenv("PLINTH_CSI_GUEST_LUKS_PARAMS"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &params); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("PLINTH_CSI_GUEST_KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	kube := kubeClient(t, cfg)
	nodeName := os.Getenv("PLINTH_CSI_GUEST_NODE")
	conn := dialGuest(t, sock)
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
	ctx := t.Context()
	cv, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csipb.VolumeCapability{capability}, Parameters: params})
	if err != nil {
		t.Fatal(err)
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

func dialGuest(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
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
