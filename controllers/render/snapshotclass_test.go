package render

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// TestSnapshotClass renders the VolumeSnapshotClass of a Placement that asks for one, with
// Velero's label and the default annotation only when asked, traced to its Placement; a
// Placement without spec.snapshotClass renders none. A class with group renders a
// VolumeGroupSnapshotClass beside it (same name, deletion policy, group default annotation);
// one without renders none.
func TestSnapshotClass(t *testing.T) {
	pool := policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: policyv1.StoragePoolSpec{
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"s": "1"}},
		Backend:      policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth"}}}}
	proto := policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Spec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}
	pl := func(name string, sc *policyv1.SnapshotClassTemplate) policyv1.Placement {
		return policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: policyv1.PlacementSpec{
			PoolRef: policyv1.LocalObjectReference{Name: "p"}, ProtocolRef: policyv1.LocalObjectReference{Name: "local"},
			StorageClass: policyv1.StorageClassTemplate{Name: "plinth-" + name}, SnapshotClass: sc}}
	}
	out, err := Render(Input{
		Pools: []policyv1.StoragePool{pool}, Protocols: []policyv1.Protocol{proto},
		Placements: []policyv1.Placement{
			pl("b", &policyv1.SnapshotClassTemplate{Name: "plinth-b-snap", DeletionPolicy: "Retain", IsDefault: true, Velero: true, Group: true}),
			pl("a", &policyv1.SnapshotClassTemplate{Name: "plinth-a-snap"}),
			pl("none", nil),
		},
		Nodes: []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"s": "1"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.VolumeSnapshotClasses) != 2 {
		t.Fatalf("%d VolumeSnapshotClasses, want 2", len(out.VolumeSnapshotClasses))
	}
	got, err := yaml.Marshal(out.VolumeSnapshotClasses[0].Object)
	if err != nil {
		t.Fatal(err)
	}
	want := `apiVersion: snapshot.storage.k8s.io/v1
deletionPolicy: Delete
driver: csi.plinth.dev
kind: VolumeSnapshotClass
metadata:
  labels:
    app.kubernetes.io/managed-by: plinth
    plinth.dev/placement: a
  name: plinth-a-snap
`
	if string(got) != want {
		t.Errorf("class a:\n%s\nwant:\n%s", got, want)
	}
	b := out.VolumeSnapshotClasses[1]
	if b.GetName() != "plinth-b-snap" || b.Object["deletionPolicy"] != "Retain" ||
		b.GetLabels()[policyv1.LabelVeleroSnapshotClass] != "true" || b.GetAnnotations()[policyv1.AnnotationDefaultSnapshotClass] != "true" {
		t.Errorf("class b = %v", b.Object)
	}
	if src := out.Sources["VolumeSnapshotClass/plinth-b-snap"]; len(src) != 1 || src[0] != "Placement/b" {
		t.Errorf("sources of class b = %v", src)
	}
	y, err := out.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(y), "kind: VolumeSnapshotClass"); n != 2 {
		t.Errorf("YAML holds %d VolumeSnapshotClasses, want 2", n)
	}
	if len(out.VolumeGroupSnapshotClasses) != 1 {
		t.Fatalf("%d VolumeGroupSnapshotClasses, want 1 (of b only)", len(out.VolumeGroupSnapshotClasses))
	}
	got, err = yaml.Marshal(out.VolumeGroupSnapshotClasses[0].Object)
	if err != nil {
		t.Fatal(err)
	}
	want = `apiVersion: groupsnapshot.storage.k8s.io/v1
deletionPolicy: Retain
driver: csi.plinth.dev
kind: VolumeGroupSnapshotClass
metadata:
  annotations:
    groupsnapshot.storage.kubernetes.io/is-default-class: "true"
  labels:
    app.kubernetes.io/managed-by: plinth
    plinth.dev/placement: b
    velero.io/csi-volumesnapshot-class: "true"
  name: plinth-b-snap
`
	if string(got) != want {
		t.Errorf("group class of b:\n%s\nwant:\n%s", got, want)
	}
	if src := out.Sources["VolumeGroupSnapshotClass/plinth-b-snap"]; len(src) != 1 || src[0] != "Placement/b" {
		t.Errorf("sources of the group class of b = %v", src)
	}
	if n := strings.Count(string(y), "kind: VolumeGroupSnapshotClass"); n != 1 {
		t.Errorf("YAML holds %d VolumeGroupSnapshotClasses, want 1", n)
	}
}
