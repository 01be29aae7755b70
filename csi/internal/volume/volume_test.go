package volume

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// WaitFrom, from the state CreateVolume created: a late event of a deleted earlier VolumeState of
// the same name (another UID, Ready) must not end the wait; the created one's Ready does.
func TestWaitOnIgnoresEarlierIncarnation(t *testing.T) {
	hub := NewHub[*storev1.VolumeState]()
	k := &Kind[*storev1.VolumeState]{Name: "VolumeState", Locks: &Locks{}, Hub: hub, Timeout: time.Minute}
	h, err := k.Open("vol-a")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	state := func(uid string, ready bool) *storev1.VolumeState {
		vs := &storev1.VolumeState{}
		vs.Name, vs.UID, vs.Generation, vs.Spec.CapacityBytes = "vol-a", types.UID(uid), 1, 1<<20
		if ready {
			vs.Status = storev1.VolumeStateStatus{Phase: storev1.VolumeReady, ObservedGeneration: 1, ActualBytes: 1 << 20}
		}
		return vs
	}
	created := state("new", false)
	var got []string
	go func() {
		hub.Notify("vol-a", state("old", true)) // the earlier incarnation, late
		for len(h.ch) > 0 {                     // taken by the waiter before the next event
			time.Sleep(time.Millisecond)
		}
		hub.Notify("vol-a", state("new", true))
	}()
	err = h.WaitFrom(t.Context(), created, func(vs *storev1.VolumeState) (bool, error) {
		got = append(got, string(vs.UID))
		return ReadyOrFailed(vs)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range got {
		if uid == "old" {
			t.Errorf("the wait looked at the earlier incarnation: %v", got)
		}
	}
	if got[len(got)-1] != "new" {
		t.Errorf("finished on %v, want the created volume", got)
	}
}

// A refused expansion (reason ExpansionRefused at the current generation) ends the wait with
// ErrOutOfRange; the same reason of an older generation does not (a new request is pending),
// and no room stays ErrInsufficientCapacity.
func TestExpansionRefusedIsOutOfRange(t *testing.T) {
	vs := &storev1.VolumeState{}
	vs.Generation, vs.Spec.CapacityBytes = 2, 128<<20
	vs.Status = storev1.VolumeStateStatus{Phase: storev1.VolumeExpanding, ObservedGeneration: 1, ActualBytes: 64 << 20}
	set := func(reason string, gen int64) {
		vs.Status.Conditions = []metav1.Condition{{Type: storev1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, ObservedGeneration: gen,
			Message: "can grow only into the free space right after it"}}
	}
	set(storev1.ReasonExpansionRefused, 1)
	if ok, err := ReadyOrFailed(vs); ok || err != nil {
		t.Fatalf("refusal of an older generation: %v, %v; want to keep waiting", ok, err)
	}
	set(storev1.ReasonExpansionRefused, 2)
	_, err := ReadyOrFailed(vs)
	if werr := WaitError("expand volume x", err); KindOf(werr) != ErrOutOfRange || !errors.Is(werr, ErrAgentRefused) || !strings.Contains(werr.Error(), "right after it") {
		t.Fatalf("refused expansion: %v, want ErrOutOfRange with the agent's message", werr)
	}
	set(storev1.ReasonInsufficientCapacity, 2)
	_, err = ReadyOrFailed(vs)
	if werr := WaitError("expand volume x", err); KindOf(werr) != ErrInsufficientCapacity {
		t.Fatalf("no room: %v, want ErrInsufficientCapacity", werr)
	}
}

// An Error says its message alone; errors.Is finds its kind and its cause; KindOf names the
// outermost kind when one Error wraps another.
func TestErrorKinds(t *testing.T) {
	cause := errors.New("etcd is down")
	err := Errorf(ErrUnavailable, "read VolumeState vol-a: %w", cause)
	if err.Error() != "read VolumeState vol-a: etcd is down" {
		t.Errorf("message %q", err.Error())
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, cause) || errors.Is(err, ErrInternal) {
		t.Errorf("errors.Is does not find exactly the kind and the cause in %v", err)
	}
	outer := Errorf(ErrConflict, "update: %w", err)
	if KindOf(outer) != ErrConflict || KindOf(err) != ErrUnavailable || KindOf(cause) != nil {
		t.Errorf("KindOf: %v %v %v", KindOf(outer), KindOf(err), KindOf(cause))
	}
	var e *Error
	if !errors.As(outer, &e) || e.Kind != ErrConflict {
		t.Errorf("errors.As found %v", e)
	}
	if WaitError("x", nil) != nil {
		t.Error("WaitError(nil) is not nil")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	if werr := WaitError("create volume vol-a", ctx.Err()); KindOf(werr) != ErrTimeout || !errors.Is(werr, context.DeadlineExceeded) {
		t.Errorf("deadline: %v", werr)
	}
	if werr := WaitError("create volume vol-a", errors.New("agent reports the volume failed")); KindOf(werr) != ErrInternal {
		t.Errorf("failed volume: %v", werr)
	}
}

// A second Open of the same id while the first is held is ErrBusy; after Close it opens again.
func TestOpenBusy(t *testing.T) {
	k := &Kind[*storev1.VolumeState]{Name: "VolumeState", Locks: &Locks{}, Hub: NewHub[*storev1.VolumeState](), Timeout: time.Minute}
	h, err := k.Open("vol-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Open("vol-a"); !errors.Is(err, ErrBusy) {
		t.Fatalf("second Open: %v, want ErrBusy", err)
	}
	other, err := k.Open("vol-b")
	if err != nil {
		t.Fatalf("another id: %v", err)
	}
	other.Close()
	h.Close()
	h, err = k.Open("vol-a")
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	h.Close()
}

// TestFreezeSettled: a member's freezes are settled when every asked node answered
// NotMounted or Thawed as Taken; still Frozen or unanswered is not yet; a thaw for any other
// reason is ErrFreezeLost naming the node.
func TestFreezeSettled(t *testing.T) {
	member := func(fs ...storev1.FreezeStatus) *storev1.VolumeSnapshotState {
		ss := &storev1.VolumeSnapshotState{Spec: storev1.VolumeSnapshotStateSpec{SourceVolume: "vol-a",
			Freeze: &storev1.GroupFreeze{Nodes: []string{"n1", "n2"}, TimeoutSeconds: 10}}}
		ss.Status.Freezes = fs
		return ss
	}
	taken := storev1.FreezeStatus{Node: "n1", Phase: storev1.FreezeThawed, Reason: storev1.ReasonFreezeTaken}
	none := storev1.FreezeStatus{Node: "n2", Phase: storev1.FreezeNotMounted}
	for _, tc := range []struct {
		what string
		ss   *storev1.VolumeSnapshotState
		ok   bool
		lost bool
	}{
		{"no freeze asked", &storev1.VolumeSnapshotState{}, true, false},
		{"all settled", member(taken, none), true, false},
		{"one unanswered", member(taken), false, false},
		{"one still frozen", member(storev1.FreezeStatus{Node: "n1", Phase: storev1.FreezeFrozen}, none), false, false},
		{"thawed at the timeout", member(storev1.FreezeStatus{Node: "n1", Phase: storev1.FreezeThawed, Reason: storev1.ReasonFreezeTimeout}, none), false, true},
		{"freeze failed", member(taken, storev1.FreezeStatus{Node: "n2", Phase: storev1.FreezeThawed, Reason: storev1.ReasonFreezeFailed}), false, true},
	} {
		ok, err := FreezeSettled(tc.ss)
		if ok != tc.ok || errors.Is(err, ErrFreezeLost) != tc.lost || (err != nil) != tc.lost {
			t.Errorf("%s: %v, %v; want %v, lost %v", tc.what, ok, err, tc.ok, tc.lost)
		}
	}
}
