package csi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// CreateVolume of an encrypted class makes the volume's key Secret before it answers (random,
// hex, immutable, owned by the VolumeState), names it in the volume context and the frozen
// policy (never the key), keeps a Secret that exists already, refuses a name that makes no
// Secret name, and refuses clones its key could not open.
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

	resp, err := e.ctrl.CreateVolume(ctx, req("pvc-enc-a", luks))
	if err != nil {
		t.Fatal(err)
	}
	vc := resp.GetVolume().GetVolumeContext()
	secretName := policyv1.VolumeKeyNamespace + "/" + policyv1.VolumeKeyPrefix + "pvc-enc-a"
	if vc[csi.ContextEncryption] != "LUKS2" || vc[csi.ContextKeySecret] != secretName || vc["plinth.dev/cipher"] != "aes-xts-plain64" || vc["plinth.dev/key-size"] != "512" {
		t.Errorf("volume context %v", vc)
	}
	sec := keyOf("pvc-enc-a")
	key := string(sec.Data[policyv1.VolumeKeyData])
	vs := &storev1.VolumeState{}
	if err := e.c.Get(ctx, client.ObjectKey{Name: resp.GetVolume().GetVolumeId()}, vs); err != nil {
		t.Fatal(err)
	}
	if len(key) != 128 || strings.Trim(key, "0123456789abcdef") != "" || sec.Immutable == nil || !*sec.Immutable ||
		len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != vs.UID || sec.Labels["plinth.dev/volume-id"] != vs.Name {
		t.Errorf("key Secret: %d key characters, immutable %v, owners %v, labels %v", len(key), sec.Immutable, sec.OwnerReferences, sec.Labels)
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
	for what, err := range map[string]error{"clone of a per-volume-key volume": clone("pvc-enc-clone", luks),
		"clone of an encrypted volume into a clear class": clone("pvc-enc-clear-clone", e.local)} {
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
		csi.ContextKeySecret: "plinth-system/plinth-luks-pvc-x"}
	for what, secrets := range map[string]map[string]string{"no key": nil, "a short key": {policyv1.VolumeKeyData: "short"}} {
		_, err := node.NodeStageVolume(t.Context(), &csipb.NodeStageVolumeRequest{VolumeId: "vol-x", StagingTargetPath: staging,
			VolumeCapability: fsCap("ext4", rwo), PublishContext: localPublish(dev), VolumeContext: vc, Secrets: secrets})
		wantCode(t, what, err, codes.FailedPrecondition)
		if !strings.Contains(fmt.Sprint(err), "plinth-system/plinth-luks-pvc-x") {
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
