package moveexec

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The controller switches only a verified copy of this very move while the source still
// serves, ends only a move the agent finished or failed, and never acts on another move's
// status or on a volume being deleted.
func TestNext(t *testing.T) {
	mv := &storev1.VolumeMove{ID: "m2", SourceStore: "a", TargetStore: "b"}
	vs := func(store string, m *storev1.VolumeMove, id string, phase storev1.MovePhase) *storev1.VolumeState {
		v := &storev1.VolumeState{}
		v.Spec.StoreName, v.Spec.Move = store, m
		if id != "" {
			v.Status.Move = &storev1.MoveStatus{ID: id, Phase: phase}
		}
		return v
	}
	published := vs("a", mv, "m2", storev1.MoveCopied)
	published.Spec.Publications = []storev1.Publication{{NodeName: "n1"}}
	published.Spec.PublicationGeneration = 1
	letInSince := vs("a", mv, "m2", storev1.MoveCopied)
	letInSince.Spec.PublicationGeneration = 2 // published and unpublished after the copy
	deleting := vs("a", mv, "m2", storev1.MoveCopied)
	deleting.DeletionTimestamp = &metav1.Time{}
	for _, tc := range []struct {
		name string
		vs   *storev1.VolumeState
		want Step
	}{
		{"no move", vs("a", nil, "m2", storev1.MoveCopied), StepNone},
		{"no status yet", vs("a", mv, "", ""), StepNone},
		{"an earlier move's status", vs("a", mv, "m1", storev1.MoveCopied), StepNone},
		{"copying", vs("a", mv, "m2", storev1.MoveCopying), StepNone},
		{"waiting for the consumer", vs("a", mv, "m2", storev1.MoveWaiting), StepNone},
		{"copied", vs("a", mv, "m2", storev1.MoveCopied), StepSwitch},
		{"copied, already switched", vs("b", mv, "m2", storev1.MoveCopied), StepNone},
		{"done", vs("b", mv, "m2", storev1.MoveDone), StepEnd},
		{"failed", vs("a", mv, "m2", storev1.MoveFailed), StepEnd},
		{"deleting", deleting, StepNone},
		{"a consumer uses it", published, StepNone},
		{"a consumer came and went after the copy", letInSince, StepNone},
	} {
		if got := Next(tc.vs); got != tc.want {
			t.Errorf("%s: step %d, want %d", tc.name, got, tc.want)
		}
	}
}
