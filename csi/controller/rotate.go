package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Key rotation by a Git change (docs/design.md#volume-key-rotation): raising a Placement's
// spec.encryption.keyGeneration makes the CSI controller write a new passphrase into the key
// Secret of each of its volumes (keeping the old one as key-previous); the node plugin that
// opens the volume re-wraps its LUKS2 header (csi/node/crypt.go) and reports the generation
// in the VolumeState's status.encryption; the controller then drops key-previous. The
// controller updates key Secrets only here, and only in plinth-keys; it reports progress in
// the Placement's status.keyRotation and condition KeysRotated.
//
// +kubebuilder:rbac:groups="",namespace=plinth-keys,resources=secrets,verbs=update
// +kubebuilder:rbac:groups=policy.plinth.dev,resources=placements/status,verbs=get;patch

// KeyRotationInterval is the period of the controller's key rotation rounds.
const KeyRotationInterval = 30 * time.Second

// ConditionKeysRotated is the Placement condition of its key rotation: True when every volume
// with a per-volume key is re-wrapped to spec.encryption.keyGeneration (reason Rewrapped),
// False while some are pending (reason RewrapPending, naming them).
const ConditionKeysRotated = "KeysRotated"

// Reasons of ConditionKeysRotated.
const (
	ReasonRewrapped     = "Rewrapped"
	ReasonRewrapPending = "RewrapPending"
)

// maxPendingNamed bounds status.keyRotation.pendingVolumes.
const maxPendingNamed = 10

// rotation is where one volume's key rotation stands after a round.
type rotation int

const (
	rotationDone    rotation = iota // Secret at the generation, header re-wrapped, no key-previous
	rotationPending                 // a new key waits for the header (or a key-previous to drop)
)

// RotateVolumeKeys runs one key rotation round over every VolumeState with a per-volume key
// whose Placement sets encryption.keyGeneration above 0; see rotateVolumeKey for one volume.
// A failure on one volume is logged and counted pending; the next round retries. Keys are
// never logged: volume ids, Secret names and generations are.
func (s *Service) RotateVolumeKeys(ctx context.Context) {
	var pls policyv1.PlacementList
	if err := s.kube.List(ctx, &pls); err != nil {
		s.log.Error(err, "key rotation: list Placements")
		return
	}
	gens := map[string]int64{}
	for _, pl := range pls.Items {
		if e := pl.Spec.Encryption; e != nil && e.KeySecret == nil && e.KeyGeneration > 0 {
			gens[pl.Name] = e.KeyGeneration
		}
	}
	if len(gens) == 0 {
		return
	}
	var vss storev1.VolumeStateList
	if err := s.kube.List(ctx, &vss); err != nil {
		s.log.Error(err, "key rotation: list VolumeStates")
		return
	}
	tallies := map[string]*policyv1.KeyRotationStatus{}
	for name, g := range gens {
		tallies[name] = &policyv1.KeyRotationStatus{KeyGeneration: g}
	}
	for i := range vss.Items {
		vs := &vss.Items[i]
		g, ok := gens[vs.Spec.Policy.Placement]
		if !ok || !ownKey(vs) || vs.DeletionTimestamp != nil {
			continue
		}
		t := tallies[vs.Spec.Policy.Placement]
		if s.keys.settled(vs.UID, g) { // no Secret read for a volume done at this generation
			t.Rewrapped++
			continue
		}
		r, err := s.rotateVolumeKey(ctx, vs, g)
		if err != nil {
			s.log.Error(err, "key rotation", "volume", vs.Name, "secret", vs.Spec.Policy.Encryption.KeySecret.Name)
		}
		if r == rotationDone && err == nil {
			s.keys.settle(vs.UID, g)
			t.Rewrapped++
			continue
		}
		t.Pending++
		t.PendingVolumes = append(t.PendingVolumes, vs.Name)
	}
	for name, t := range tallies {
		sort.Strings(t.PendingVolumes)
		t.PendingVolumes = t.PendingVolumes[:min(len(t.PendingVolumes), maxPendingNamed)]
		if err := s.reportRotation(ctx, name, t); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			s.log.Error(err, "key rotation: status of Placement", "placement", name)
		}
	}
}

// settledKeys remembers, per VolumeState UID, the generation at which a round found the
// volume done (Secret at the generation, no key-previous), so that later rounds read no
// Secret for it until the generation is raised: a round then costs one Secret read per
// volume in flight, not per volume. Lost on restart (one read per volume then).
type settledKeys struct {
	mu  sync.Mutex
	gen map[types.UID]int64
}

func (k *settledKeys) settled(uid types.UID, g int64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	have, ok := k.gen[uid]
	return ok && have >= g
}

func (k *settledKeys) settle(uid types.UID, g int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.gen == nil {
		k.gen = map[types.UID]int64{}
	}
	k.gen[uid] = g
}

// ownKey reports whether vs has a per-volume key Secret of its own (the Secret name its PV
// makes), the only kind rotated.
func ownKey(vs *storev1.VolumeState) bool {
	e := vs.Spec.Policy.Encryption
	return e != nil && e.KeySecret != nil && e.KeySecret.Namespace == policyv1.VolumeKeyNamespace &&
		e.KeySecret.Name == policyv1.VolumeKeyPrefix+vs.Spec.CSIName
}

// rotateVolumeKey takes volume vs's key Secret one step toward generation want:
//   - the Secret holds key-previous (a rotation in flight): when vs's header is reported at
//     the Secret's generation (status.encryption.keyGeneration), one update drops
//     key-previous; otherwise nothing (pending). A second rotation never starts before the
//     first is confirmed: key-previous must stay the passphrase the header holds.
//   - the Secret's generation is below want: one update (resourceVersion compare-and-swap)
//     writes key = 64 new random bytes (hex), key-previous = the old key, generation = want.
//     A crash before it changes nothing; after it (failpoint.CSIKeyRotated) the next round
//     sees the generation reached and waits for the header.
//   - otherwise done.
//
// Errors: the API server's; an immutable Secret (made before rotation existed) cannot take a
// new key and is an error naming it.
func (s *Service) rotateVolumeKey(ctx context.Context, vs *storev1.VolumeState, want int64) (rotation, error) {
	ref := vs.Spec.Policy.Encryption.KeySecret
	var sec corev1.Secret
	if err := s.live.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &sec); err != nil {
		return rotationPending, fmt.Errorf("read key Secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	have := SecretGeneration(&sec)
	header := int64(-1)
	if st := vs.Status.Encryption; st != nil {
		header = st.KeyGeneration
	}
	if _, inFlight := sec.Data[policyv1.VolumeKeyPreviousData]; inFlight {
		if header < have {
			return rotationPending, nil
		}
		delete(sec.Data, policyv1.VolumeKeyPreviousData)
		if err := s.kube.Update(ctx, &sec); err != nil {
			return rotationPending, fmt.Errorf("drop the previous key of Secret %s/%s: %w", ref.Namespace, ref.Name, err)
		}
		if have < want {
			return rotationPending, nil // the next round writes the next key
		}
		return rotationDone, nil
	}
	if have >= want {
		return rotationDone, nil
	}
	if sec.Immutable != nil && *sec.Immutable {
		return rotationPending, fmt.Errorf("key Secret %s/%s is immutable (made before key rotation existed): it cannot take a new key", ref.Namespace, ref.Name)
	}
	key, err := newVolumeKey()
	if err != nil {
		return rotationPending, err
	}
	sec.Data[policyv1.VolumeKeyPreviousData] = sec.Data[policyv1.VolumeKeyData]
	sec.Data[policyv1.VolumeKeyData] = key
	sec.Data[policyv1.VolumeKeyGenerationData] = []byte(strconv.FormatInt(want, 10))
	if err := s.kube.Update(ctx, &sec); err != nil {
		return rotationPending, fmt.Errorf("write generation %d into key Secret %s/%s: %w", want, ref.Namespace, ref.Name, err)
	}
	failpoint.Hit(failpoint.CSIKeyRotated)
	s.log.Info("key rotation: new key written", "volume", vs.Name, "secret", ref.Name, "generation", want)
	return rotationPending, nil
}

// SecretGeneration is the key generation of key Secret sec: its data "generation" (decimal),
// 0 when absent or malformed.
func SecretGeneration(sec *corev1.Secret) int64 {
	g, err := strconv.ParseInt(string(sec.Data[policyv1.VolumeKeyGenerationData]), 10, 64)
	if err != nil || g < 0 {
		return 0
	}
	return g
}

// newVolumeKey is VolumeKeyBytes of crypto/rand, hex-encoded.
func newVolumeKey() ([]byte, error) {
	raw := make([]byte, VolumeKeyBytes)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("volume key: random bytes: %w", err)
	}
	key := make([]byte, hex.EncodedLen(len(raw)))
	hex.Encode(key, raw)
	return key, nil
}

// reportRotation writes t as Placement name's status.keyRotation and its condition
// KeysRotated, in one merge patch guarded by the resourceVersion read (a conflict waits for
// the next round); nothing is sent when both are as they were.
func (s *Service) reportRotation(ctx context.Context, name string, t *policyv1.KeyRotationStatus) error {
	var pl policyv1.Placement
	if err := s.live.Get(ctx, client.ObjectKey{Name: name}, &pl); err != nil {
		return err
	}
	before := pl.DeepCopy()
	pl.Status.KeyRotation = t
	c := metav1.Condition{Type: ConditionKeysRotated, Status: metav1.ConditionTrue, Reason: ReasonRewrapped, ObservedGeneration: pl.Generation,
		Message: fmt.Sprintf("%d volumes re-wrapped to key generation %d", t.Rewrapped, t.KeyGeneration)}
	if t.Pending > 0 {
		c.Status, c.Reason = metav1.ConditionFalse, ReasonRewrapPending
		c.Message = fmt.Sprintf("%d of %d volumes not re-wrapped to key generation %d yet (a node re-wraps a volume's header at its next stage or republish): %v",
			t.Pending, t.Pending+t.Rewrapped, t.KeyGeneration, t.PendingVolumes)
	}
	meta.SetStatusCondition(&pl.Status.Conditions, c)
	if equalRotation(before, &pl) {
		return nil
	}
	return s.kube.Status().Patch(ctx, &pl, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

func equalRotation(a, b *policyv1.Placement) bool {
	ca, cb := meta.FindStatusCondition(a.Status.Conditions, ConditionKeysRotated), meta.FindStatusCondition(b.Status.Conditions, ConditionKeysRotated)
	if ca == nil || cb == nil || ca.Status != cb.Status || ca.Reason != cb.Reason || ca.Message != cb.Message || ca.ObservedGeneration != cb.ObservedGeneration {
		return false
	}
	ra, rb := a.Status.KeyRotation, b.Status.KeyRotation
	if ra == nil || rb == nil {
		return ra == rb
	}
	return ra.KeyGeneration == rb.KeyGeneration && ra.Rewrapped == rb.Rewrapped && ra.Pending == rb.Pending && fmt.Sprint(ra.PendingVolumes) == fmt.Sprint(rb.PendingVolumes)
}
