package guestnode

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/nvmeauth"
	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/internal/dhchap"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// authNamespace is where the agent and the node plugins look for host Secrets by default.
const authNamespace = "plinth-system"

// An impersonator of worker A: another kernel (the storage guest's) presenting A's host NQN,
// with its own host id (the kernel refuses one NQN with two host ids).
const impersonatorHostID = "00000000-0000-4000-8000-0000000000c3"

// Expected: with a Protocol asking for DH-HMAC-CHAP (bidirectional, ffdhe2048), the
// controller's nvme-auth reconciler makes worker A's host Secret (a DHHC-1 host and controller
// secret of 32 bytes for sha256, annotated with A's host NQN); both guests' kernels report host
// and target authentication as Agent capabilities; publishing a volume of that class to A makes
// the agent write A's host entry (dhchap_key and dhchap_ctrl_key equal to the Secret's derived
// for the storage node, dhchap_hash hmac(sha256), dhchap_dhgroup ffdhe2048) and allow A; A stages the volume
// (authenticated both ways) and its data verifies. Another kernel presenting A's NQN is refused
// by the target without a secret and with a wrong one, and admitted with the right one (so the
// secret, not anything else, decides); the host entry never holds A's master secrets. A volume without authentication staged on A afterwards
// still connects (the shared host entry asks A for its key there too). Unpublishing both
// removes A's host entry, key included.
func (s *suite) testAuth(t *testing.T) {
	ctx := t.Context()
	if err := s.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: authNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	class := pool + "-auth"
	create(t, s.c, &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: class}, Spec: policyv1.ProtocolSpec{
		NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: nvmePort, BindCIDR: netCIDR, ACL: ptr.To(true), CtrlLossTmo: ptr.To[int32](ctrlLossTmo),
			ReconnectDelay: reconnectDelay, Auth: &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, Hash: "sha256", DHGroup: "ffdhe2048", Bidirectional: true}}}})
	create(t, s.c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: class}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: pool}, ProtocolRef: policyv1.LocalObjectReference{Name: class},
		StorageClass: policyv1.StorageClassTemplate{Name: class}, Filesystem: policyv1.Filesystem{FSType: "ext4"},
	}})

	// The controller's reconciler, as the controller manager runs it, for worker A's Node.
	r := &nvmeauth.Reconciler{Client: s.c, Namespace: authNamespace}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: workerA}}); err != nil {
		t.Fatalf("nvme-auth reconcile of %s: %v", workerA, err)
	}
	var sec corev1.Secret
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: authNamespace, Name: dhchap.SecretName(workerA)}, &sec); err != nil {
		t.Fatalf("host Secret of %s: %v", workerA, err)
	}
	// What A presents to the storage node and the storage node holds for A: A's secrets
	// derived for that target (docs/design.md#key-distribution), never the master's.
	hostKey, ctrlKey := forStorage(t, &sec)
	for name, k := range map[string]string{"host": hostKey, "controller": ctrlKey} {
		if b, _, err := dhchap.Decode(k); err != nil || len(b) != 32 {
			t.Fatalf("%s secret of %s: %d bytes, %v; want a DHHC-1 secret of 32 bytes", name, sec.Name, len(b), err)
		}
	}
	if sec.Annotations[dhchap.AnnotationHostNQN] != hostNQNA || sec.Labels[dhchap.LabelComponent] != dhchap.ComponentValue || sec.Type != nvmeauth.SecretType {
		t.Errorf("Secret %s: type %s labels %v annotations %v", sec.Name, sec.Type, sec.Labels, sec.Annotations)
	}
	if hostKey == ctrlKey {
		t.Error("host and controller secrets are equal")
	}

	// Both kernels (6.12) say they can: the storage guest's agent reports it.
	controlplane.Eventually(t, 2*time.Minute, time.Second, "agent capabilities", func() error {
		var a storev1.Agent
		if err := s.c.Get(ctx, client.ObjectKey{Name: storageNode}, &a); err != nil {
			return err
		}
		c := a.Status.Capabilities
		if !slices.Equal(c.NVMeAuth, []string{"host", "target"}) || !slices.Equal(c.NVMeTLS, []string{"host", "target"}) {
			return fmt.Errorf("capabilities nvmeAuth %v nvmeTLS %v, want host and target", c.NVMeAuth, c.NVMeTLS)
		}
		return nil
	})

	v := s.createVolume(t, "pvc-crossnode-auth", class, 64<<20)
	s.publish(t, v, workerA)
	if v.pc[csi.PublishAuth] != "DHHMACCHAP" || v.pc[csi.PublishAuthBidirectional] != "true" {
		t.Errorf("publish context %v: want auth DHHMACCHAP, bidirectional", v.pc)
	}
	for k, val := range v.pc {
		if strings.Contains(val, "DHHC-1") {
			t.Errorf("publish context %s carries a secret", k)
		}
	}
	// The target's host entry, read back from configfs: what the Secret says.
	entry := s.hostEntry(t, hostNQNA)
	want := map[string]string{"dhchap_key": hostKey, "dhchap_ctrl_key": ctrlKey, "dhchap_hash": "hmac(sha256)", "dhchap_dhgroup": "ffdhe2048"}
	for k, w := range want {
		if entry[k] != w {
			t.Errorf("configfs hosts/%s/%s differs from the Secret's (len %d, want len %d)", hostNQNA, k, len(entry[k]), len(w))
		}
	}
	if entry["dhchap_key"] == string(sec.Data[dhchap.KeyHostSecret]) || entry["dhchap_ctrl_key"] == string(sec.Data[dhchap.KeyCtrlSecret]) {
		t.Errorf("configfs hosts/%s holds A's master secrets, not the ones derived for %s", hostNQNA, storageNode)
	}
	if hosts, anyHost := s.allowedHosts(t, v.nqn); anyHost != "0" || len(hosts) != 1 || hosts[0] != hostNQNA {
		t.Errorf("ACL of %s: allow_any_host=%s hosts %v, want only %s", v.nqn, anyHost, hosts, hostNQNA)
	}

	t0 := time.Now()
	s.stage(t, s.nodeA, v)
	t.Logf("MEASURE NodeStage with DH-HMAC-CHAP (bidirectional, ffdhe2048; connect + mkfs + mount): %s", time.Since(t0).Round(10*time.Millisecond))
	if a := s.controllerAttrs(t, s.worker, v.nqn); len(a) != 1 || a[0]["state"] != "live" || a[0]["hostnqn"] != hostNQNA {
		t.Fatalf("worker A's controllers of %s: %v, want one live with %s", v.nqn, a, hostNQNA)
	}
	// The kernel keeps the secrets the controller was made with (sysfs shows them to root).
	if out := s.worker.sh(t, time.Minute, fmt.Sprintf(`for c in /sys/class/nvme-subsystem/*/nvme*; do
  [ "$(cat $c/subsysnqn 2>/dev/null)" = %q ] && { cat $c/dhchap_secret; cat $c/dhchap_ctrl_secret; }
done; true`, v.nqn)); strings.Fields(out) == nil || strings.Fields(out)[0] != hostKey || len(strings.Fields(out)) < 2 || strings.Fields(out)[1] != ctrlKey {
		t.Errorf("worker A's controller does not hold the Secret's host and controller secrets")
	}
	s.checkKeysFromKeyServer(t)
	sum := s.writeFile(t, v, "data", 8)
	if got := s.readSum(t, s.worker, v, "data"); got != sum {
		t.Errorf("read back %s, wrote %s", got, sum)
	}

	// Another kernel presenting A's host NQN: refused without a secret and with a wrong one,
	// admitted with A's. nvme-cli passes the secrets as the node plugin does (dhchap_secret).
	wrong, err := dhchap.Generate("sha256")
	if err != nil {
		t.Fatal(err)
	}
	connect := func(secret string) (string, int, time.Duration) {
		cmd := fmt.Sprintf("nvme connect -t tcp -a %s -s %d -n %s --hostnqn=%s --hostid=%s", storageAddr, nvmePort, v.nqn, hostNQNA, impersonatorHostID)
		if secret != "" {
			cmd += " --dhchap-secret=" + secret
		}
		start := time.Now()
		out, code := s.storage.try(2*time.Minute, cmd)
		return out, code, time.Since(start)
	}
	impostors := func() int {
		n := 0
		for _, a := range s.controllerAttrs(t, s.storage, v.nqn) {
			if a["hostnqn"] == hostNQNA {
				n++
			}
		}
		return n
	}
	for name, secret := range map[string]string{"no secret": "", "a wrong secret": wrong} {
		out, code, d := connect(secret)
		if code == 0 || impostors() != 0 {
			t.Errorf("A's host NQN with %s from another kernel: exit %d, %d controllers; want refused\n%s", name, code, impostors(), out)
		} else {
			t.Logf("refused with %s in %s: %s", name, d.Round(10*time.Millisecond), strings.TrimSpace(out))
		}
	}
	if out, code, d := connect(hostKey); code != 0 || impostors() != 1 {
		t.Errorf("A's host NQN with A's secret from another kernel: exit %d, %d controllers; want admitted\n%s", code, impostors(), out)
	} else {
		t.Logf("MEASURE nvme connect with DH-HMAC-CHAP (ffdhe2048, unidirectional): %s", d.Round(10*time.Millisecond))
	}
	s.storage.sh(t, time.Minute, "nvme disconnect -n "+v.nqn+" >/dev/null")
	if out, _ := s.storage.try(time.Minute, "dmesg | grep -i -E 'dhchap|authenticat' | tail -n 6"); out != "" {
		t.Logf("storage guest kernel:\n%s", out)
	}

	// A volume without authentication, staged on A while A's host entry has its key.
	plain := s.createVolume(t, "pvc-crossnode-plain", pool+"-nvme", 64<<20)
	s.publish(t, plain, workerA)
	if plain.pc[csi.PublishAuth] != "" {
		t.Errorf("publish context of a volume without auth: %v", plain.pc)
	}
	t0 = time.Now()
	s.stage(t, s.nodeA, plain)
	t.Logf("MEASURE NodeStage of a volume without authentication, host entry with a key (connect + mkfs + mount): %s", time.Since(t0).Round(10*time.Millisecond))
	psum := s.writeFile(t, plain, "data", 2)
	if got := s.readSum(t, s.worker, plain, "data"); got != psum {
		t.Errorf("plain volume: read back %s, wrote %s", got, psum)
	}

	t.Run("KeyRotation", func(t *testing.T) {
		s.testKeyRotation(t, r, v, plain, hostKey, ctrlKey, map[*volume]string{v: sum, plain: psum})
	})

	for _, x := range []*volume{plain, v} {
		s.unstage(t, s.nodeA, x)
		if _, err := s.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: x.id, NodeId: workerA}); err != nil {
			t.Errorf("ControllerUnpublish %s: %v", x.id, err)
		}
		if _, err := s.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: x.id}); err != nil {
			t.Errorf("DeleteVolume %s: %v", x.id, err)
		}
	}
	if out, code := s.storage.try(time.Minute, "ls -d /sys/kernel/config/nvmet/hosts/"+hostNQNA); code == 0 {
		t.Errorf("A's host entry (and its key) still there after the last volume allowing A went: %s", out)
	}
}

// forStorage returns the host and controller secrets of a host's master Secret derived for the
// storage node, as the agent and node plugin derive them.
func forStorage(t *testing.T, sec *corev1.Secret) (host, ctrl string) {
	t.Helper()
	host, err := dhchap.DeriveHostKey(string(sec.Data[dhchap.KeyHostSecret]), storageNode)
	if err != nil {
		t.Fatalf("derive from Secret %s: %v", sec.Name, err)
	}
	if ctrl, err = dhchap.DeriveCtrlKey(string(sec.Data[dhchap.KeyCtrlSecret]), storageNode); err != nil {
		t.Fatalf("derive from Secret %s: %v", sec.Name, err)
	}
	return host, ctrl
}

// hostEntry reads the storage guest's nvmet host entry of nqn: attribute → value.
func (s *suite) hostEntry(t *testing.T, nqn string) map[string]string {
	t.Helper()
	out := s.storage.sh(t, time.Minute, fmt.Sprintf(`d=/sys/kernel/config/nvmet/hosts/%s; for a in dhchap_key dhchap_ctrl_key dhchap_hash dhchap_dhgroup; do echo "$a=$(cat $d/$a)"; done`, nqn))
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// Expected: raising keyGeneration in the Protocol (a Git change) while v (bidirectional auth)
// and plain (no auth, but A presents its key: the shared host entry asks for it) are staged on
// worker A: the controller's reconciler replaces the host secret in A's Secret (new key id,
// keyGeneration 1; the controller secret stays); the storage node's agent, told by nothing but
// the key server (its Agent's spec does not change), writes the new secret into
// A's host entry (read back from configfs) and reports the new key id for A in
// status.hostKeys; only then A's node plugin hands the new secret to both live controllers
// (read back from sysfs) and the kernel re-authenticates them ("re-authenticating controller"
// in the worker's kernel log, no failed authentication). Both controllers are the same and live afterwards, the
// files written before read back equal and new writes verify. A controller reset (a full
// connect, authenticated with what the kernel now holds) comes back live. Another kernel
// presenting A's host NQN is refused with the old secret and admitted with the new one.
func (s *suite) testKeyRotation(t *testing.T, r *nvmeauth.Reconciler, v, plain *volume, oldKey, oldCtrlKey string, sums map[*volume]string) {
	ctx := t.Context()
	class := pool + "-auth"
	before := map[*volume]string{}
	for _, x := range []*volume{v, plain} {
		a := s.controllerAttrs(t, s.worker, x.nqn)
		if len(a) != 1 || a[0]["state"] != "live" {
			t.Fatalf("controllers of %s before the rotation: %v, want one live", x.nqn, a)
		}
		before[x] = a[0]["name"]
	}
	var sec0 corev1.Secret
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: authNamespace, Name: dhchap.SecretName(workerA)}, &sec0); err != nil {
		t.Fatal(err)
	}
	s.worker.sh(t, time.Minute, "echo plinth-key-rotation-start > /dev/kmsg")
	s.storage.sh(t, time.Minute, "echo plinth-key-rotation-start > /dev/kmsg")
	t0 := time.Now()

	// The Git change: keyGeneration 0 → 1 in the Protocol, then the controller's reconcile.
	var p policyv1.Protocol
	if err := s.c.Get(ctx, client.ObjectKey{Name: class}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.NVMeoFTCP.Auth.KeyGeneration = 1
	if err := s.c.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: workerA}}); err != nil {
		t.Fatalf("nvme-auth reconcile of %s: %v", workerA, err)
	}
	var sec corev1.Secret
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: authNamespace, Name: dhchap.SecretName(workerA)}, &sec); err != nil {
		t.Fatal(err)
	}
	newKey, newCtrlKey := forStorage(t, &sec)
	keyID := sec.Annotations[dhchap.AnnotationKeyID]
	if newKey == oldKey || newCtrlKey != oldCtrlKey || keyID == "" || keyID == sec0.Annotations[dhchap.AnnotationKeyID] ||
		sec.Annotations[dhchap.AnnotationKeyGeneration] != "1" || sec.UID != sec0.UID {
		t.Fatalf("Secret after keyGeneration 1: new host secret %v, controller secret kept %v, key id %q (was %q), annotations %v, same Secret %v",
			newKey != oldKey, newCtrlKey == oldCtrlKey, keyID, sec0.Annotations[dhchap.AnnotationKeyID], sec.Annotations, sec.UID == sec0.UID)
	}
	// Nothing else tells the storage node's agent: it learns the rotation from the key server
	// (a new key id for A at its next report), as A's node plugin does.
	var a storev1.Agent
	if err := s.c.Get(ctx, client.ObjectKey{Name: storageNode}, &a); err != nil {
		t.Fatal(err)
	}
	agentGen := a.Generation

	// The target first: A's host entry holds the new secrets, and the agent says so.
	controlplane.Eventually(t, 3*time.Minute, time.Second, "the storage node's host entry of A holds the new secrets", func() error {
		e := s.hostEntry(t, hostNQNA)
		if e["dhchap_key"] != newKey || e["dhchap_ctrl_key"] != newCtrlKey {
			return fmt.Errorf("host entry: new key %v, the Secret's controller key %v", e["dhchap_key"] == newKey, e["dhchap_ctrl_key"] == newCtrlKey)
		}
		if err := s.c.Get(ctx, client.ObjectKey{Name: storageNode}, &a); err != nil {
			return err
		}
		for _, k := range a.Status.HostKeys {
			if k.HostNQN == hostNQNA && k.KeyID == keyID {
				return nil
			}
		}
		return fmt.Errorf("Agent status.hostKeys %v, want %s with key id %s", a.Status.HostKeys, hostNQNA, keyID)
	})
	targetAt := time.Since(t0)
	if a.Generation != agentGen {
		t.Errorf("the storage node's Agent spec changed during the rotation (generation %d → %d): the rotation has one road, the key server", agentGen, a.Generation)
	}
	for _, k := range a.Status.HostKeys {
		if strings.Contains(k.KeyID, "DHHC-1") {
			t.Errorf("Agent status.hostKeys carries a secret")
		}
	}

	// Then the host: both live controllers hold the new secrets (sysfs, as the kernel has them).
	secretsOf := func(nqn string) []string {
		return strings.Fields(s.worker.sh(t, time.Minute, fmt.Sprintf(`for c in /sys/class/nvme-subsystem/*/nvme*; do
  [ "$(cat $c/subsysnqn 2>/dev/null)" = %q ] && { cat $c/dhchap_secret; cat $c/dhchap_ctrl_secret; }
done; true`, nqn)))
	}
	controlplane.Eventually(t, 3*time.Minute, time.Second, "worker A's controllers hold the new secrets", func() error {
		if got := secretsOf(v.nqn); len(got) != 2 || got[0] != newKey || got[1] != newCtrlKey {
			return fmt.Errorf("controller of %s: %d values, new host secret %v, the Secret's controller secret %v", v.nqn, len(got), len(got) > 0 && got[0] == newKey, len(got) > 1 && got[1] == newCtrlKey)
		}
		if got := secretsOf(plain.nqn); len(got) != 2 || got[0] != newKey || got[1] != "none" {
			return fmt.Errorf("controller of %s: %d values, new host secret %v, controller secret none %v", plain.nqn, len(got), len(got) > 0 && got[0] == newKey, len(got) > 1 && got[1] == "none")
		}
		return nil
	})
	t.Logf("MEASURE key rotation: target holds the new secrets %s after the Git change, hosts' controllers %s", targetAt.Round(100*time.Millisecond), time.Since(t0).Round(100*time.Millisecond))
	for _, x := range []*volume{v, plain} {
		after := s.waitController(t, s.worker, x.nqn, "controller live after the rotation", 2*time.Minute, stateIs("live"))
		if after[0]["name"] != before[x] {
			t.Errorf("controller of %s is %s after the rotation, was %s: removed and made anew", x.nqn, after[0]["name"], before[x])
		}
	}
	klog := s.worker.sh(t, time.Minute, "dmesg | sed -n '/plinth-key-rotation-start/,$p' | grep -E 'authenticat|nvme' | tail -n 80; true")
	t.Logf("worker kernel since the rotation:\n%s", klog)
	for x, what := range map[*volume]string{v: "bidirectional", plain: "unidirectional"} {
		if !strings.Contains(klog, before[x]+": re-authenticating controller") {
			t.Errorf("%s controller %s: no re-authentication in the worker's kernel log", what, before[x])
		}
	}
	if strings.Contains(klog, "authentication failed") || strings.Contains(klog, "setting up authentication") {
		t.Errorf("a re-authentication failed (worker kernel log above)")
	}
	if out, _ := s.storage.try(time.Minute, "dmesg | sed -n '/plinth-key-rotation-start/,$p' | grep -i -E 'dhchap|authenticat|mismatch|failure' | tail -n 10"); out != "" {
		t.Logf("storage kernel since the rotation:\n%s", out)
	}
	for x, want := range sums {
		if got := s.readSum(t, s.worker, x, "data"); got != want {
			t.Errorf("%s after the rotation reads %s, wrote %s", x.nqn, got, want)
		}
		sum := s.writeFile(t, x, "rotated", 2)
		if got := s.readSum(t, s.worker, x, "rotated"); got != sum {
			t.Errorf("%s: written after the rotation %s, read back %s", x.nqn, sum, got)
		}
	}

	// A full connect with what the kernel now holds: reset v's controller.
	s.worker.sh(t, time.Minute, "echo 1 > /sys/class/nvme/"+before[v]+"/reset_controller")
	s.waitController(t, s.worker, v.nqn, "controller live after a reset with the new secrets", 2*time.Minute, stateIs("live"))
	if got := s.readSum(t, s.worker, v, "data"); got != sums[v] {
		t.Errorf("after the reset reads %s, wrote %s", got, sums[v])
	}

	// Another kernel with A's host NQN: the old secret is refused, the new one admitted.
	connect := func(secret string) (string, int) {
		return s.storage.try(2*time.Minute, fmt.Sprintf("nvme connect -t tcp -a %s -s %d -n %s --hostnqn=%s --hostid=%s --dhchap-secret=%s",
			storageAddr, nvmePort, v.nqn, hostNQNA, impersonatorHostID, secret))
	}
	impostors := func() int {
		n := 0
		for _, c := range s.controllerAttrs(t, s.storage, v.nqn) {
			if c["hostnqn"] == hostNQNA {
				n++
			}
		}
		return n
	}
	if out, code := connect(oldKey); code == 0 || impostors() != 0 {
		t.Errorf("A's old secret after the rotation: exit %d, %d controllers; want refused\n%s", code, impostors(), out)
	} else {
		t.Logf("old secret refused: %s", strings.TrimSpace(out))
	}
	if out, code := connect(newKey); code != 0 || impostors() != 1 {
		t.Errorf("A's new secret: exit %d, %d controllers; want admitted\n%s", code, impostors(), out)
	}
	s.storage.sh(t, time.Minute, "nvme disconnect -n "+v.nqn+" >/dev/null")
}
