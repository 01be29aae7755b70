package volume

import (
	"errors"
	"fmt"

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
		}
	}
	return false, nil
}
