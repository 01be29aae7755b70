package controller

import (
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// A volume's controller health follows its VolumeState and Store: healthy volumes report no
// entry, a failed, stalled, fenced or drifted volume or an unreachable Store reports one entry
// per (status, reason).
func TestVolumeHealthFromState(t *testing.T) {
	cond := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: reason + " message"}
	}
	vol := func(phase storev1.VolumePhase, conds ...metav1.Condition) *storev1.VolumeState {
		vs := &storev1.VolumeState{}
		vs.Name = "vol-1"
		vs.Spec.StoreName = "p.node-1"
		vs.Status.Phase = phase
		vs.Status.Conditions = conds
		return vs
	}
	storeWith := func(conds ...metav1.Condition) *storev1.Store {
		st := &storev1.Store{}
		st.Name = "p.node-1"
		st.Status.Conditions = conds
		return st
	}
	type entry struct {
		status csipb.VolumeHealthErrorType
		reason string
	}
	for _, tc := range []struct {
		name string
		vs   *storev1.VolumeState
		st   *storev1.Store
		want []entry
	}{
		{"ready", vol(storev1.VolumeReady, cond(storev1.ConditionReady, "True", storev1.ReasonSucceeded)), storeWith(cond(storev1.ConditionReady, "True", storev1.ReasonSucceeded)), nil},
		{"creating, store unknown", vol(storev1.VolumeCreating), nil, nil},
		{"no room is not a health problem", vol(storev1.VolumePending, cond(storev1.ConditionReady, "False", storev1.ReasonInsufficientCapacity)), nil, nil},
		{"failed", vol(storev1.VolumeFailed, cond(storev1.ConditionReady, "False", storev1.ReasonVolumeFailed)), nil,
			[]entry{{csipb.VolumeHealthErrorType_INACCESSIBLE, storev1.ReasonVolumeFailed}}},
		{"stalled and fenced", vol(storev1.VolumeReady, cond(storev1.ConditionStalled, "True", storev1.ReasonMissingKernelModules), cond(storev1.ConditionFenced, "True", storev1.ReasonStaleGeneration)), nil,
			[]entry{{csipb.VolumeHealthErrorType_INACCESSIBLE, storev1.ReasonMissingKernelModules}, {csipb.VolumeHealthErrorType_INACCESSIBLE, storev1.ReasonStaleGeneration}}},
		{"backend volume missing", vol(storev1.VolumeReady, cond(storev1.ConditionDrifted, "True", "LogicalVolumeMissing")), nil,
			[]entry{{csipb.VolumeHealthErrorType_INACCESSIBLE, "LogicalVolumeMissing"}}},
		{"resized behind its back", vol(storev1.VolumeReady, cond(storev1.ConditionDrifted, "True", "LogicalVolumeResized")), nil,
			[]entry{{csipb.VolumeHealthErrorType_DEGRADED, "LogicalVolumeResized"}}},
		{"no drift", vol(storev1.VolumeReady, cond(storev1.ConditionDrifted, "False", storev1.ReasonNoDrift)), nil, nil},
		{"node deleted", vol(storev1.VolumeReady), storeWith(cond(storev1.ConditionReady, "False", storev1.ReasonNodeDeleted)),
			[]entry{{csipb.VolumeHealthErrorType_INACCESSIBLE, storev1.ReasonNodeDeleted}}},
		{"store drifted is not this volume's", vol(storev1.VolumeReady), storeWith(cond(storev1.ConditionReady, "False", storev1.ReasonDrifted)), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := volumeHealth(tc.vs, tc.st)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i, w := range tc.want {
				if got[i].GetStatus() != w.status || got[i].GetReason() != w.reason || got[i].GetMessage() == "" {
					t.Errorf("entry %d: %v, want %v with a message", i, got[i], w)
				}
			}
		})
	}
}
