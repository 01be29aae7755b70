package render

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// snapshotClass is the VolumeSnapshotClass of a Placement with spec.snapshotClass: driver
// csi.plinth.dev, the deletion policy (Delete unless Retain), the default-class annotation when
// asked, and Velero's label when asked. It carries no parameters: CreateSnapshot needs none (a
// snapshot lives on its source's Store and follows the source's frozen policy), and a class
// without parameters has nothing that changing the policy could make immutable drift.
func snapshotClass(pl *policyv1.Placement) unstructured.Unstructured {
	t := pl.Spec.SnapshotClass
	u := unstructured.Unstructured{Object: map[string]any{
		"apiVersion":     policyv1.SnapshotClassAPIVersion,
		"kind":           policyv1.SnapshotClassKind,
		"driver":         policyv1.DriverName,
		"deletionPolicy": orDefault(t.DeletionPolicy, "Delete"),
	}}
	u.SetName(t.Name)
	labels := map[string]string{
		policyv1.LabelManagedBy: ManagedBy,
		policyv1.LabelPlacement: pl.Name,
	}
	if t.Velero {
		labels[policyv1.LabelVeleroSnapshotClass] = "true"
	}
	u.SetLabels(labels)
	if t.IsDefault {
		u.SetAnnotations(map[string]string{policyv1.AnnotationDefaultSnapshotClass: "true"})
	}
	return u
}

// groupSnapshotClass is the VolumeGroupSnapshotClass of a Placement with
// spec.snapshotClass.group, beside its VolumeSnapshotClass: same name, driver, deletion policy
// and labels, the group default-class annotation when the snapshot class is the default. No
// parameters: CreateVolumeGroupSnapshot's consumer freeze takes its default timeout
// (plinth.dev/freeze-timeout-seconds unset), and a parameter-less class cannot drift into an
// immutable change.
func groupSnapshotClass(pl *policyv1.Placement) unstructured.Unstructured {
	u := snapshotClass(pl)
	u.SetAPIVersion(policyv1.GroupSnapshotClassAPIVersion)
	u.SetKind(policyv1.GroupSnapshotClassKind)
	if pl.Spec.SnapshotClass.IsDefault {
		u.SetAnnotations(map[string]string{policyv1.AnnotationDefaultGroupSnapshotClass: "true"})
	}
	return u
}
