package volume

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The conditions of the waits on the agent, read from the status it writes.

// ReadyOrFailed is the wait condition of CreateVolume: Ready at the current generation with
// the full size, or Failed.
func ReadyOrFailed(vs *storev1.VolumeState) (bool, error) {
	if vs == nil {
		return false, nil // not yet visible (informer lag) — or deleted meanwhile: the wait bounds it
	}
	st := vs.Status
	// A failed expansion keeps the phase of the existing volume; the Ready condition of the
	// current generation says there is no room.
	if c := meta.FindStatusCondition(st.Conditions, storev1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse &&
		c.Reason == storev1.ReasonInsufficientCapacity && c.ObservedGeneration >= vs.Generation {
		return false, fmt.Errorf("%w: %s", ErrAgentNoRoom, c.Message)
	}
	if c := meta.FindStatusCondition(st.Conditions, storev1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse &&
		c.Reason == storev1.ReasonExpansionRefused && c.ObservedGeneration >= vs.Generation {
		return false, fmt.Errorf("%w: %s", ErrAgentRefused, c.Message)
	}
	switch {
	case st.Phase == storev1.VolumeFailed:
		if c := meta.FindStatusCondition(st.Conditions, storev1.ConditionReady); c != nil && c.Reason == storev1.ReasonInsufficientCapacity {
			return false, fmt.Errorf("%w: %s", ErrAgentNoRoom, c.Message)
		}
		msg := "agent reports the volume failed"
		if c := meta.FindStatusCondition(st.Conditions, storev1.ConditionReady); c != nil {
			msg += ": " + c.Reason + ": " + c.Message
		}
		return false, errors.New(msg)
	case st.Phase == storev1.VolumeReady && st.ObservedGeneration >= vs.Generation && st.ActualBytes >= vs.Spec.CapacityBytes:
		return true, nil
	}
	return false, nil
}

// SnapshotReady is the wait condition of CreateSnapshot: ready to use, or failed.
func SnapshotReady(ss *storev1.VolumeSnapshotState) (bool, error) {
	if ss == nil {
		return false, nil
	}
	if ss.Status.ReadyToUse && ss.Status.ObservedGeneration >= ss.Generation {
		return true, nil
	}
	if c := meta.FindStatusCondition(ss.Status.Conditions, storev1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
		switch c.Reason {
		case storev1.ReasonInsufficientCapacity:
			return false, fmt.Errorf("%w: %s", ErrAgentNoRoom, c.Message)
		case storev1.ReasonSnapshotUnsupported:
			return false, fmt.Errorf("%w: %s", ErrSnapshotUnsupported, c.Message)
		case storev1.ReasonSnapshotFailed:
			return false, fmt.Errorf("agent reports the snapshot failed: %s", c.Message)
		case storev1.ReasonGroupFreezeLost:
			return false, fmt.Errorf("%w: %s", ErrFreezeLost, c.Message)
		}
	}
	return false, nil
}

// FreezeSettled reports whether every node of a group member's spec.freeze has answered for
// good: NotMounted, or Thawed after the group was taken (reason Taken). A thaw for any other
// reason (the timeout, a failed freeze) is ErrFreezeLost: the member may be of another
// instant than the rest. A member without spec.freeze is settled.
func FreezeSettled(ss *storev1.VolumeSnapshotState) (bool, error) {
	if ss == nil || ss.Spec.Freeze == nil {
		return true, nil
	}
	for _, n := range ss.Spec.Freeze.Nodes {
		i := slices.IndexFunc(ss.Status.Freezes, func(f storev1.FreezeStatus) bool { return f.Node == n })
		if i < 0 {
			return false, nil
		}
		switch f := ss.Status.Freezes[i]; {
		case f.Phase == storev1.FreezeNotMounted:
		case f.Phase == storev1.FreezeThawed && f.Reason == storev1.ReasonFreezeTaken:
		case f.Phase == storev1.FreezeThawed:
			return false, fmt.Errorf("%w: node %s thawed the filesystem of %s (reason %s): %s", ErrFreezeLost, n, ss.Spec.SourceVolume, f.Reason, f.Message)
		default:
			return false, nil
		}
	}
	return true, nil
}
