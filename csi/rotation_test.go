package csi_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/controller"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// logBuffer collects every log line of the components under test (and passes them on to the
// test's log), so that a test can scan them.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	t   testing.TB
}

func (l *logBuffer) write(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.buf, "%s %s\n", prefix, args)
	l.t.Log(prefix, args)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Raising a Placement's encryption.keyGeneration rotates the key Secret of each of its volumes
// with a per-volume key, on the real API server: a new key, the old one kept as key-previous
// until the node plugin reports the header re-wrapped, then dropped; progress in the
// Placement's status.keyRotation and condition KeysRotated. A crash right after a Secret is
// updated loses nothing: the next round keeps that Secret's key and key-previous as they are
// (the header still opens with key-previous). A second raise never overwrites a key-previous
// a header may still hold. The node plugin's re-wrap itself runs on real dm-crypt in the guest
// (csi/crypt TestGuestLUKSRewrap, TestInGuestEncryptedNVMeoF/RotateWhileStagedAndWritten);
// here the test stands in for its report (status.encryption), as it would write it.
//
// Then every place a key could leak to is scanned for every key the test saw (hex, base64 of
// the hex, the raw bytes and their base64): the status of the VolumeStates and the Placement,
// the cluster's events, every log line of the driver and the rotation rounds, and the driver's
// metrics. None holds one; the same scan finds the keys in their Secrets.
func TestKeyRotationByGitChange(t *testing.T) {
	ctx := t.Context()
	cp := sharedControlPlane(t)
	c := kubeClient(t, cp.Admin.Config)
	e := setup(t, c, "rot", map[string]int64{"rot-node": 100 * gib})
	e.agent = startFakeAgent(t, c)
	logs := &logBuffer{t: t}
	log := funcr.New(logs.write, funcr.Options{Verbosity: 4})
	reg := prometheus.NewRegistry()
	conn := startDriver(t, csi.Options{Mode: csi.ModeController, Config: cp.Admin.Config, Log: log, Registerer: reg, KeyRotationInterval: -1})
	e.ctrl = csipb.NewControllerClient(conn)
	// the rounds run here, one at a time, so that a crash can stop one (the driver's own
	// round is off: KeyRotationInterval -1)
	rounds := controller.New(controller.Config{Kube: c, Live: c, Log: log.WithName("rounds")})

	create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: "rot-luks"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: "rot"}, ProtocolRef: policyv1.LocalObjectReference{Name: "rot-local"},
		StorageClass: policyv1.StorageClassTemplate{Name: "rot-luks"}, Encryption: &policyv1.Encryption{}}})
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: policyv1.VolumeKeyNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	params := map[string]string{policyv1.ParamPlacement: "rot-luks", policyv1.ParamPool: "rot", policyv1.ParamProtocol: "rot-local"}
	ids := map[string]string{}
	for _, name := range []string{"pvc-rot-a", "pvc-rot-b"} {
		resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
			VolumeCapabilities: mountCap(rwo), Parameters: params})
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = resp.GetVolume().GetVolumeId()
	}
	seen := map[string]bool{} // every key the test saw
	secret := func(name string) *corev1.Secret {
		t.Helper()
		var s corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: policyv1.VolumeKeyNamespace, Name: policyv1.VolumeKeyPrefix + name}, &s); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{policyv1.VolumeKeyData, policyv1.VolumeKeyPreviousData} {
			if v := s.Data[k]; len(v) > 0 {
				seen[string(v)] = true
			}
		}
		return &s
	}
	data := func(s *corev1.Secret) (key, prev, gen string) {
		return string(s.Data[policyv1.VolumeKeyData]), string(s.Data[policyv1.VolumeKeyPreviousData]), string(s.Data[policyv1.VolumeKeyGenerationData])
	}
	a0, _, g := data(secret("pvc-rot-a"))
	b0, _, _ := data(secret("pvc-rot-b"))
	if s := secret("pvc-rot-a"); g != "" || s.Immutable != nil && *s.Immutable {
		t.Fatalf("a new key Secret: generation %q, immutable %v; want none, mutable (a rotation updates it)", g, s.Immutable)
	}
	placement := func() *policyv1.Placement {
		t.Helper()
		var pl policyv1.Placement
		if err := c.Get(ctx, client.ObjectKey{Name: "rot-luks"}, &pl); err != nil {
			t.Fatal(err)
		}
		return &pl
	}
	raise := func(g int64) {
		t.Helper()
		pl := placement()
		pl.Spec.Encryption.KeyGeneration = g
		if err := c.Update(ctx, pl); err != nil {
			t.Fatal(err)
		}
	}
	progress := func(wantGen int64, rewrapped, pending int32, cond metav1.ConditionStatus) {
		t.Helper()
		pl := placement()
		r, k := pl.Status.KeyRotation, meta.FindStatusCondition(pl.Status.Conditions, controller.ConditionKeysRotated)
		if r == nil || k == nil || r.KeyGeneration != wantGen || r.Rewrapped != rewrapped || r.Pending != pending || int(r.Pending) != len(r.PendingVolumes) || k.Status != cond {
			t.Fatalf("Placement status.keyRotation %+v, KeysRotated %+v; want generation %d, %d re-wrapped, %d pending, %s", r, k, wantGen, rewrapped, pending, cond)
		}
	}
	report := func(name string, gen int64) { // what the node plugin writes after a re-wrap
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error { // the fake agent writes status too
			var vs storev1.VolumeState
			if err := c.Get(ctx, client.ObjectKey{Name: ids[name]}, &vs); err != nil {
				return err
			}
			vs.Status.Encryption = &storev1.EncryptionStatus{KeyGeneration: gen, NodeName: "rot-node"}
			return c.Status().Update(ctx, &vs)
		}); err != nil {
			t.Fatal(err)
		}
	}

	// generation 0: nothing to rotate, nothing written
	rounds.RotateVolumeKeys(ctx)
	if k, p, _ := data(secret("pvc-rot-a")); k != a0 || p != "" || placement().Status.KeyRotation != nil {
		t.Fatal("a round without keyGeneration changed a key or the Placement's status")
	}

	// generation 1, and a crash right after the first Secret is updated
	raise(1)
	type crashed struct{}
	disable := failpoint.Enable(failpoint.CSIKeyRotated, func() { panic(crashed{}) })
	stopped := func() (stopped bool) {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(crashed); !ok {
					panic(r)
				}
				stopped = true
			}
		}()
		rounds.RotateVolumeKeys(ctx)
		return false
	}()
	disable()
	if !stopped {
		t.Fatal("the round did not reach csi.key.rotated")
	}
	// the round goes in VolumeState order: x is the volume whose Secret the crash followed
	x, y, x0, y0 := "pvc-rot-a", "pvc-rot-b", a0, b0
	if _, p, _ := data(secret(y)); p != "" {
		x, y, x0, y0 = y, x, y0, x0
	}
	x1, xp, xg := data(secret(x))
	y1, yp, _ := data(secret(y))
	if xp != x0 || x1 == x0 || len(x1) != 128 || strings.Trim(x1, "0123456789abcdef") != "" || xg != "1" || y1 != y0 || yp != "" {
		t.Fatalf("after the crash: %s rotated %v (previous kept %v, generation %q), %s untouched %v; want one rotated, the other untouched",
			x, x1 != x0, xp == x0, xg, y, y1 == y0 && yp == "")
	}
	// the next round: x's key and key-previous stay (its header opens with the previous one
	// until a node re-wraps it), y rotates
	rounds.RotateVolumeKeys(ctx)
	if k, p, _ := data(secret(x)); k != x1 || p != x0 {
		t.Fatal("the round after the crash changed the crashed Secret again: the header's key would be lost")
	}
	y1, yp, yg := data(secret(y))
	if yp != y0 || y1 == y0 || yg != "1" {
		t.Fatalf("%s not rotated after the crash: previous kept %v, generation %q", y, yp == y0, yg)
	}
	progress(1, 0, 2, metav1.ConditionFalse)

	// x's node re-wrapped its header: key-previous is dropped, x counts re-wrapped
	report(x, 1)
	rounds.RotateVolumeKeys(ctx)
	if k, p, _ := data(secret(x)); k != x1 || p != "" {
		t.Fatalf("after the re-wrap of %s: key kept %v, key-previous %d bytes; want kept, dropped", x, k == x1, len(p))
	}
	progress(1, 1, 1, metav1.ConditionFalse)

	// generation 2 while y is still pending: x rotates again, y keeps its key-previous (the
	// key its header holds) until its node re-wraps, and only then gets generation 2
	raise(2)
	rounds.RotateVolumeKeys(ctx)
	x2, xp, xg := data(secret(x))
	if xp != x1 || x2 == x1 || xg != "2" {
		t.Fatalf("%s at generation 2: previous is generation 1's %v, generation %q", x, xp == x1, xg)
	}
	if k, p, g := data(secret(y)); k != y1 || p != y0 || g != "1" {
		t.Fatalf("%s pending at generation 1 got a new key (generation %q): its header's key would be lost", y, g)
	}
	report(y, 1)
	rounds.RotateVolumeKeys(ctx) // drops y's key-previous
	rounds.RotateVolumeKeys(ctx) // generation 2 for y
	if k, p, g := data(secret(y)); p != y1 || k == y1 || g != "2" {
		t.Fatalf("%s after its re-wrap to 1: previous is generation 1's %v, generation %q; want a generation 2 key", y, p == y1, g)
	}
	report(x, 2)
	report(y, 2)
	rounds.RotateVolumeKeys(ctx)
	progress(2, 2, 0, metav1.ConditionTrue)
	for _, name := range []string{x, y} {
		if _, p, _ := data(secret(name)); p != "" {
			t.Errorf("%s keeps a previous key after its header was re-wrapped", name)
		}
	}

	// a volume made in the rotated class: created (its frozen encryption names its Secret, no
	// generation: the CRD refuses both), then given a generation 2 key by the next round
	resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-rot-c", CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: mountCap(rwo), Parameters: params})
	if err != nil {
		t.Fatalf("CreateVolume in a class at key generation 2: %v", err)
	}
	ids["pvc-rot-c"] = resp.GetVolume().GetVolumeId()
	c0, _, _ := data(secret("pvc-rot-c"))
	rounds.RotateVolumeKeys(ctx)
	if k, p, g := data(secret("pvc-rot-c")); p != c0 || k == c0 || g != "2" {
		t.Fatalf("the volume made at generation 2: previous is its first key %v, generation %q", p == c0, g)
	}
	progress(2, 2, 1, metav1.ConditionFalse)

	t.Run("KeysNowhereButTheirSecrets", func(t *testing.T) {
		if len(seen) != 8 {
			t.Fatalf("%d distinct keys seen, want 8 (3 generations of 2 volumes, 2 of the third)", len(seen))
		}
		var places []string
		for _, name := range []string{"pvc-rot-a", "pvc-rot-b", "pvc-rot-c"} {
			var vs storev1.VolumeState
			if err := c.Get(ctx, client.ObjectKey{Name: ids[name]}, &vs); err != nil {
				t.Fatal(err)
			}
			places = append(places, "VolumeState "+vs.Name+" "+jsonOf(t, vs))
		}
		places = append(places, "Placement "+jsonOf(t, placement()))
		var evs corev1.EventList // events.k8s.io/v1 Events too (one store, two APIs)
		if err := c.List(ctx, &evs); err != nil {
			t.Fatal(err)
		}
		places = append(places, "events "+jsonOf(t, evs), "logs "+logs.String())
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var metrics bytes.Buffer
		for _, mf := range mfs {
			if _, err := expfmt.MetricFamilyToText(&metrics, mf); err != nil {
				t.Fatal(err)
			}
		}
		if metrics.Len() == 0 || !strings.Contains(logs.String(), "key rotation") {
			t.Fatalf("nothing to scan: %d bytes of metrics, rotation logged %v", metrics.Len(), strings.Contains(logs.String(), "key rotation"))
		}
		places = append(places, "metrics "+metrics.String())
		for _, p := range places {
			if k := findKey(p, seen); k != "" {
				t.Errorf("%s holds a key (%s)", strings.SplitN(p, " ", 2)[0], k)
			}
		}
		// the scan finds what is there: the keys in their Secrets (JSON: base64)
		if k := findKey(jsonOf(t, secret("pvc-rot-a")), seen); k == "" {
			t.Fatal("the scan finds no key in the key Secret itself")
		}
	})
}

func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// findKey returns how one of keys (hex strings) appears in text: as hex (either case), as
// base64 of the hex (a Secret's JSON), as the raw bytes or their base64 (standard or URL
// alphabet); "" when none does.
func findKey(text string, keys map[string]bool) string {
	lower := strings.ToLower(text)
	for k := range keys {
		raw, _ := hex.DecodeString(k)
		for what, s := range map[string]string{
			"hex":               strings.ToLower(k),
			"base64 of the hex": base64.StdEncoding.EncodeToString([]byte(k)),
			"raw":               string(raw),
			"base64":            base64.StdEncoding.EncodeToString(raw),
			"base64url":         base64.RawURLEncoding.EncodeToString(raw),
		} {
			// a 64-character window is enough to show a leak and survives line wrapping
			// of the rest
			probe := s[:min(len(s), 64)]
			if what == "hex" && strings.Contains(lower, probe) || strings.Contains(text, probe) {
				return what
			}
		}
	}
	return ""
}
