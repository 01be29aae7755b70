package csi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// CreateVolume of an encrypted class makes the volume's key Secret before it answers (random,
// hex, mutable for a key rotation, owned by the VolumeState), names it in the volume context and the frozen
// policy (never the key), keeps a Secret that exists already, refuses a name that makes no
// Secret name, and refuses clones its key could not open. The capacity asked is the mapping's:
// the backend is the LUKS2 header larger, and GetCapacity of the class counts the header.
func TestCreateVolumeEncryptedKeySecret(t *testing.T) {
	e := controllerEnv(t, "enc", map[string]int64{"enc-node": 100 * gib})
	ctx := t.Context()
	create(t, e.c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: "enc-luks"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: "enc"}, ProtocolRef: policyv1.LocalObjectReference{Name: "enc-local"},
		StorageClass: policyv1.StorageClassTemplate{Name: "enc-luks"}, Encryption: &policyv1.Encryption{}}})
	if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: policyv1.VolumeKeyNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	luks := map[string]string{policyv1.ParamPlacement: "enc-luks", policyv1.ParamPool: "enc", policyv1.ParamProtocol: "enc-local"}
	req := func(name string, params map[string]string) *csipb.CreateVolumeRequest {
		return &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: gib}, VolumeCapabilities: mountCap(rwo), Parameters: params}
	}
	keyOf := func(name string) *corev1.Secret {
		t.Helper()
		var s corev1.Secret
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: policyv1.VolumeKeyNamespace, Name: policyv1.VolumeKeyPrefix + name}, &s); err != nil {
			t.Fatalf("key Secret of %s: %v", name, err)
		}
		return &s
	}

	// capacity of the class: each store's bytes less the header, the most a volume there gets
	// (e.local: the same pool and store, a clear class)
	for _, tc := range []struct {
		params map[string]string
		want   int64
	}{{luks, 100*gib - 16<<20}, {e.local, 100 * gib}} {
		c, err := e.ctrl.GetCapacity(ctx, &csipb.GetCapacityRequest{Parameters: tc.params})
		if err != nil {
			t.Fatal(err)
		}
		if c.GetAvailableCapacity() != tc.want || c.GetMaximumVolumeSize().GetValue() != tc.want {
			t.Errorf("GetCapacity of %s: available %d, maximum %d; want %d", tc.params[policyv1.ParamPlacement], c.GetAvailableCapacity(), c.GetMaximumVolumeSize().GetValue(), tc.want)
		}
	}

	resp, err := e.ctrl.CreateVolume(ctx, req("pvc-enc-a", luks))
	if err != nil {
		t.Fatal(err)
	}
	vc := resp.GetVolume().GetVolumeContext()
	secretName := policyv1.VolumeKeyNamespace + "/" + policyv1.VolumeKeyPrefix + "pvc-enc-a"
	if vc[csi.ContextEncryption] != "LUKS2" || vc[csi.ContextKeySecret] != secretName || vc["plinth.dev/cipher"] != "aes-xts-plain64" || vc["plinth.dev/key-size"] != "512" {
		t.Errorf("volume context %v", vc)
	}
	if got := resp.GetVolume().GetCapacityBytes(); got != gib {
		t.Errorf("capacity %d reported, want the %d asked (the mapping's)", got, gib)
	}
	sec := keyOf("pvc-enc-a")
	key := string(sec.Data[policyv1.VolumeKeyData])
	vs := &storev1.VolumeState{}
	if err := e.c.Get(ctx, client.ObjectKey{Name: resp.GetVolume().GetVolumeId()}, vs); err != nil {
		t.Fatal(err)
	}
	if len(key) != 128 || strings.Trim(key, "0123456789abcdef") != "" || sec.Immutable != nil ||
		len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != vs.UID || sec.Labels["plinth.dev/volume-id"] != vs.Name {
		t.Errorf("key Secret: %d key characters, immutable %v (want unset: a rotation updates it), owners %v, labels %v", len(key), sec.Immutable, sec.OwnerReferences, sec.Labels)
	}
	if vs.Spec.CapacityBytes != gib+16<<20 {
		t.Errorf("backend of %d bytes, want %d asked plus the 16 MiB LUKS2 header", vs.Spec.CapacityBytes, gib)
	}
	if ks := vs.Spec.Policy.Encryption.KeySecret; ks == nil || ks.Namespace+"/"+ks.Name != secretName {
		t.Errorf("frozen encryption %+v", vs.Spec.Policy.Encryption)
	}
	for what, v := range map[string]any{"VolumeState": vs, "volume": resp.GetVolume()} {
		if b, _ := json.Marshal(v); strings.Contains(string(b), key) {
			t.Errorf("the key is in the %s", what)
		}
	}

	// a retry keeps the key of data that may be written already
	if _, err := e.ctrl.CreateVolume(ctx, req("pvc-enc-a", luks)); err != nil {
		t.Fatal(err)
	}
	if again := string(keyOf("pvc-enc-a").Data[policyv1.VolumeKeyData]); again != key {
		t.Error("a repeated CreateVolume replaced the key")
	}
	// a Secret left by an earlier attempt (the VolumeState is created first; a crash between
	// the two leaves none, this is the reverse order of another writer): kept as it is
	create(t, e.c, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: policyv1.VolumeKeyNamespace, Name: policyv1.VolumeKeyPrefix + "pvc-enc-b"},
		Data: map[string][]byte{policyv1.VolumeKeyData: []byte(strings.Repeat("ab", 64))}})
	if _, err := e.ctrl.CreateVolume(ctx, req("pvc-enc-b", luks)); err != nil {
		t.Fatal(err)
	}
	if got := string(keyOf("pvc-enc-b").Data[policyv1.VolumeKeyData]); got != strings.Repeat("ab", 64) {
		t.Error("an existing key Secret was replaced")
	}

	_, err = e.ctrl.CreateVolume(ctx, req("PVC/Not-A-Secret-Name", luks))
	wantCode(t, "a CSI name that makes no Secret name", err, codes.InvalidArgument)

	clone := func(name string, params map[string]string) error {
		r := req(name, params)
		r.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: vs.Name}}}
		_, err := e.ctrl.CreateVolume(ctx, r)
		return err
	}
	for what, err := range map[string]error{"clone of an encrypted volume into a clear class": clone("pvc-enc-clear-clone", e.local)} {
		wantCode(t, what, err, codes.InvalidArgument)
		if !strings.Contains(fmt.Sprint(err), "encrypted") {
			t.Errorf("%s: %v, want the encryption named", what, err)
		}
	}
	clear, err := e.ctrl.CreateVolume(ctx, req("pvc-enc-clear", e.local))
	if err != nil {
		t.Fatal(err)
	}
	r := req("pvc-enc-from-clear", luks)
	r.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: clear.GetVolume().GetVolumeId()}}}
	_, err = e.ctrl.CreateVolume(ctx, r)
	wantCode(t, "clone of a clear volume into an encrypted class", err, codes.InvalidArgument)
	if !strings.Contains(fmt.Sprint(err), "not encrypted") {
		t.Errorf("clone of a clear volume into an encrypted class: %v", err)
	}
}

// NodeStage of an encrypted volume without its key, or with a key too short, is
// FAILED_PRECONDITION naming the Secret; the blank device stays blank (nothing formatted,
// nothing mounted, no stage record). On the host's loop devices: the host has no dm-crypt, so
// everything past the key check runs in the guest (TestInGuestEncryptedNVMeoF, csi/crypt).
func TestNodeStageEncryptedWithoutKey(t *testing.T) {
	dev, _ := loopDevice(t, 64<<20)
	state := filepath.Join(t.TempDir(), "state")
	node := nodePlugin(t, state)
	staging := filepath.Join(t.TempDir(), "s")
	vc := map[string]string{csi.ContextKind: "local", csi.ContextFSType: "ext4", csi.ContextEncryption: "LUKS2",
		csi.ContextKeySecret: "plinth-keys/plinth-luks-pvc-x"}
	for what, secrets := range map[string]map[string]string{"no key": nil, "a short key": {policyv1.VolumeKeyData: "short"}} {
		_, err := node.NodeStageVolume(t.Context(), &csipb.NodeStageVolumeRequest{VolumeId: "vol-x", StagingTargetPath: staging,
			VolumeCapability: fsCap("ext4", rwo), PublishContext: localPublish(dev), VolumeContext: vc, Secrets: secrets})
		wantCode(t, what, err, codes.FailedPrecondition)
		if !strings.Contains(fmt.Sprint(err), "plinth-keys/plinth-luks-pvc-x") {
			t.Errorf("%s: %v, want the Secret named", what, err)
		}
	}
	if out, err := exec.Command("blkid", "-p", dev).CombinedOutput(); err == nil {
		t.Errorf("the device holds %s after refused stages", out)
	}
	if isMounted(t, staging) {
		t.Error("mounted")
	}
	if _, err := os.Stat(filepath.Join(state, "vol-x.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stage record after a refused stage: %v", err)
	}
}

// A snapshot of a volume with a per-volume key gets a key Secret of its own, a copy of the
// source's (so that restores outlive the source); a restore from it and a clone of the volume
// get theirs, copies too, and are told the labels their header carries. The agent is stood in
// for by the test, which marks the snapshot taken (the host has no thin pool: the guest runs
// the real one, TestInGuestEncryptedNVMeoF).
func TestEncryptedSnapshotRestoreCloneCopyTheKey(t *testing.T) {
	e := controllerEnv(t, "encs", map[string]int64{"encs-node": 100 * gib})
	ctx := t.Context()
	create(t, e.c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: "encs-luks"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: "encs"}, ProtocolRef: policyv1.LocalObjectReference{Name: "encs-local"},
		StorageClass: policyv1.StorageClassTemplate{Name: "encs-luks"}, Encryption: &policyv1.Encryption{}}})
	if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: policyv1.VolumeKeyNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	luks := map[string]string{policyv1.ParamPlacement: "encs-luks", policyv1.ParamPool: "encs", policyv1.ParamProtocol: "encs-local"}
	// the API server's CEL refuses an operator's Secret in the key namespace (vet does too)
	err := e.c.Create(ctx, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: "encs-in-key-namespace"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: "encs"}, ProtocolRef: policyv1.LocalObjectReference{Name: "encs-local"},
		StorageClass: policyv1.StorageClassTemplate{Name: "encs-k"}, Encryption: &policyv1.Encryption{
			KeySecret: &policyv1.SecretReference{Name: "team", Namespace: policyv1.VolumeKeyNamespace}}}})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "plinth-keys holds Plinth's own volume keys") {
		t.Errorf("a Placement whose keySecret is in %s: %v, want Invalid", policyv1.VolumeKeyNamespace, err)
	}
	keyOf := func(name string) (string, []metav1.OwnerReference) {
		t.Helper()
		var s corev1.Secret
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: policyv1.VolumeKeyNamespace, Name: policyv1.VolumeKeyPrefix + name}, &s); err != nil {
			t.Fatalf("key Secret %s: %v", name, err)
		}
		return string(s.Data[policyv1.VolumeKeyData]), s.OwnerReferences
	}
	src, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-encs-src", CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: mountCap(rwo), Parameters: luks})
	if err != nil {
		t.Fatal(err)
	}
	srcID := src.GetVolume().GetVolumeId()
	srcKey, _ := keyOf("pvc-encs-src")

	// the snapshot: CreateSnapshot waits for the agent, which the test stands in for
	snapID := storev1.SnapshotID("snapshot-encs")
	done := make(chan error, 1)
	var snap *csipb.CreateSnapshotResponse
	go func() {
		var err error
		snap, err = e.ctrl.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "snapshot-encs", SourceVolumeId: srcID})
		done <- err
	}()
	ss := &storev1.VolumeSnapshotState{}
	if err := wait.Poll(ctx, 10*time.Second, 10*time.Millisecond, func() error {
		return e.c.Get(ctx, client.ObjectKey{Name: snapID}, ss)
	}); err != nil {
		t.Fatalf("the VolumeSnapshotState: %v", err)
	}
	ss.Status = storev1.VolumeSnapshotStateStatus{ObservedGeneration: ss.Generation, ReadyToUse: true, SizeBytes: gib + 16<<20}
	if err := e.c.Status().Update(ctx, ss); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	if got := snap.GetSnapshot().GetSizeBytes(); got != gib {
		t.Errorf("snapshot size %d, want %d (what a restore of it gives)", got, gib)
	}
	if err := e.c.Get(ctx, client.ObjectKey{Name: snapID}, ss); err != nil {
		t.Fatal(err)
	}
	if k := ss.Spec.Encryption.KeySecret; k == nil || k.Name != policyv1.VolumeKeyPrefix+snapID || ss.Spec.KeyOrigin == nil ||
		!slices.Equal(ss.Spec.KeyOrigin.HeaderLabels, []string{srcID}) {
		t.Fatalf("snapshot encryption %+v, origin %+v", ss.Spec.Encryption, ss.Spec.KeyOrigin)
	}
	if k, owners := keyOf(snapID); k != srcKey || len(owners) != 1 || owners[0].Kind != "VolumeSnapshotState" || owners[0].UID != ss.UID {
		t.Errorf("the snapshot's key Secret: same key %v, owners %v", k == srcKey, owners)
	}

	from := func(name string, cs *csipb.VolumeContentSource, required int64) (*csipb.Volume, error) {
		r, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: required},
			VolumeCapabilities: mountCap(rwo), Parameters: luks, VolumeContentSource: cs})
		return r.GetVolume(), err
	}
	restore, err := from("pvc-encs-restore", &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
		Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}}, snap.GetSnapshot().GetSizeBytes())
	if err != nil {
		t.Fatalf("restore of a per-volume-key snapshot: %v", err)
	}
	clone, err := from("pvc-encs-clone", &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{
		Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: srcID}}}, gib)
	if err != nil {
		t.Fatalf("clone of a per-volume-key volume: %v", err)
	}
	for name, v := range map[string]*csipb.Volume{"pvc-encs-restore": restore, "pvc-encs-clone": clone} {
		k, owners := keyOf(name)
		if k != srcKey || len(owners) != 1 || owners[0].Name != v.GetVolumeId() {
			t.Errorf("%s: the source's key %v, owners %v", name, k == srcKey, owners)
		}
		vc := v.GetVolumeContext()
		if vc["plinth.dev/luks-labels"] != srcID || vc[csi.ContextKeySecret] != policyv1.VolumeKeyNamespace+"/"+policyv1.VolumeKeyPrefix+name {
			t.Errorf("%s: volume context %v", name, vc)
		}
		if v.GetCapacityBytes() < gib {
			t.Errorf("%s: %d bytes, below the %d asked", name, v.GetCapacityBytes(), gib)
		}
		var vs storev1.VolumeState
		if err := e.c.Get(ctx, client.ObjectKey{Name: v.GetVolumeId()}, &vs); err != nil {
			t.Fatal(err)
		}
		if o := vs.Spec.KeyOrigin; o == nil || o.Secret == nil || !slices.Equal(o.HeaderLabels, []string{srcID}) {
			t.Errorf("%s: key origin %+v", name, o)
		}
		for what, x := range map[string]any{"VolumeState": &vs, "volume": v} {
			if b, _ := json.Marshal(x); strings.Contains(string(b), srcKey) {
				t.Errorf("%s: the key is in the %s", name, what)
			}
		}
	}
	// a clone of the clone, never staged: its header may still carry the first source's label
	cc, err := from("pvc-encs-clone2", &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{
		Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: clone.GetVolumeId()}}}, gib)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cc.GetVolumeContext()["plinth.dev/luks-labels"], clone.GetVolumeId()+","+srcID; got != want {
		t.Errorf("clone of a clone: labels %q, want %q", got, want)
	}
	if k, _ := keyOf("pvc-encs-clone2"); k != srcKey {
		t.Error("clone of a clone: not the first source's key")
	}
}
