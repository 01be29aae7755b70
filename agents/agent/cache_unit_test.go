package agent_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/plinth-storage/plinth/agents/agent"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestCacheDropsManagedFieldsOnly: the agent's cache keeps every field of a VolumeState and a
// Store but their managedFields, which the agent never reads.
func TestCacheDropsManagedFieldsOnly(t *testing.T) {
	tr := agent.CacheOptions("n1").DefaultTransform
	if tr == nil {
		t.Fatal("no DefaultTransform: cached objects keep their managedFields")
	}
	managed := []metav1.ManagedFieldsEntry{{Manager: "plinth-agent", Operation: metav1.ManagedFieldsOperationUpdate,
		Subresource: "status", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{}}`)}}}
	now := metav1.Now()
	meta := metav1.ObjectMeta{Name: "x", UID: "u", ResourceVersion: "5", Generation: 2, DeletionTimestamp: &now,
		Finalizers: []string{storev1.FinalizerVolume}, Labels: map[string]string{policyv1.LabelNode: "n1"},
		Annotations: map[string]string{storev1.AnnotationDraining: "true"}, ManagedFields: managed}
	vs := &storev1.VolumeState{ObjectMeta: meta,
		Spec: storev1.VolumeStateSpec{CSIName: "pvc-1", StoreName: "s", CapacityBytes: 1 << 20, PublicationGeneration: 4,
			Publications: []storev1.Publication{{NodeName: "n2", HostNQN: "nqn.x"}}},
		Status: storev1.VolumeStateStatus{Phase: storev1.VolumeReady, ActualBytes: 1 << 20, ObservedGeneration: 2}}
	st := &storev1.Store{ObjectMeta: meta, Spec: storev1.StoreSpec{Pool: "p", NodeName: "n1", Reserve: "1Mi", Evacuate: true}}
	for _, obj := range []interface {
		metav1.Object
		DeepCopyObject() runtime.Object
	}{vs, st} {
		want := obj.DeepCopyObject().(metav1.Object)
		want.SetManagedFields(nil)
		got, err := tr(obj.DeepCopyObject())
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(got, want) {
			t.Errorf("%T in the cache\n%+v\nwant\n%+v", obj, got, want)
		}
	}
}
