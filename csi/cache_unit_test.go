package csi_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestCacheKeepsWhatTheControllerReads: the controller's informer cache drops managedFields
// of every object and keeps of a Node its metadata alone; what the controller reads survives —
// of a VolumeState everything else, of a Node its name, labels (topology, spreading, NVMe-oF
// initiators) and annotations (host NQN, attach limit).
func TestCacheKeepsWhatTheControllerReads(t *testing.T) {
	opts := csi.CacheOptions(csi.Scheme())
	managed := []metav1.ManagedFieldsEntry{{Manager: "plinth-csi", Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{}}`)}}}
	now := metav1.Now()

	vs := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: "vol-1", UID: "u1", ResourceVersion: "7", Generation: 3,
		Finalizers: []string{storev1.FinalizerVolume}, DeletionTimestamp: &now,
		Labels: map[string]string{policyv1.LabelNode: "n1"}, Annotations: map[string]string{"a": "b"}, ManagedFields: managed},
		Spec: storev1.VolumeStateSpec{CSIName: "pvc-1", StoreName: "s1", CapacityBytes: 1 << 30, VolumeMode: "Filesystem",
			Publications: []storev1.Publication{{NodeName: "n2", HostNQN: "nqn.x"}}, PublicationGeneration: 2},
		Status: storev1.VolumeStateStatus{Phase: storev1.VolumeReady, DevicePath: "/dev/x", ActualBytes: 1 << 30, ObservedGeneration: 3}}
	want := vs.DeepCopy()
	want.ManagedFields = nil
	if opts.DefaultTransform == nil {
		t.Fatal("no DefaultTransform: cached objects keep their managedFields")
	}
	got, err := opts.DefaultTransform(vs.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("VolumeState in the cache\n%+v\nwant\n%+v", got, want)
	}

	var nodeTransform func(any) (any, error)
	for obj, by := range opts.ByObject {
		if _, ok := obj.(*corev1.Node); ok {
			nodeTransform = by.Transform
		}
	}
	if nodeTransform == nil {
		t.Fatal("no Node transform")
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u2", ResourceVersion: "9",
		Labels:        map[string]string{policyv1.TopologyKeyNode: "n1", policyv1.LabelNVMeInitiator: "true", "zone": "a"},
		Annotations:   map[string]string{policyv1.AnnotationHostNQN: "nqn.h", policyv1.AnnotationMaxVolumes: "3"},
		ManagedFields: managed},
		Spec:   corev1.NodeSpec{PodCIDR: "10.0.0.0/24"},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}, Images: []corev1.ContainerImage{{Names: []string{"i"}, SizeBytes: 1}}}}
	out, err := nodeTransform(node.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	n, ok := out.(*corev1.Node)
	if !ok {
		t.Fatalf("Node transformed to %T", out)
	}
	wantMeta := node.ObjectMeta.DeepCopy()
	wantMeta.ManagedFields = nil
	if !equality.Semantic.DeepEqual(n.ObjectMeta, *wantMeta) {
		t.Errorf("Node metadata in the cache %+v, want %+v", n.ObjectMeta, *wantMeta)
	}
	if !equality.Semantic.DeepEqual(n.Spec, corev1.NodeSpec{}) || !equality.Semantic.DeepEqual(n.Status, corev1.NodeStatus{}) {
		t.Errorf("Node spec and status kept in the cache: %+v %+v", n.Spec, n.Status)
	}
	// a deletion's last known state passes through as it is
	tomb := "not a node"
	if out, err := nodeTransform(tomb); err != nil || out != tomb {
		t.Errorf("transform of a %T: %v, %v", tomb, out, err)
	}
}
