package render

import (
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// AttributesClassKind is the kind of the VolumeAttributesClasses a Placement's
// attributesClasses render (storage.k8s.io/v1, GA since Kubernetes 1.34).
const AttributesClassKind = "VolumeAttributesClass"

// attributesClasses are the VolumeAttributesClasses of pl's tiers, in the order declared:
// driverName csi.plinth.dev and the parameters of policyv1.AttributesClassParameters (the
// Placement, the class's own name and each limit set). The API server keeps driverName and
// parameters immutable, so a tier whose limits change in Git is a change the dry-run refuses
// and the plan reports; claims move between tiers by naming another class.
func attributesClasses(pl *policyv1.Placement) []storagev1.VolumeAttributesClass {
	out := make([]storagev1.VolumeAttributesClass, 0, len(pl.Spec.AttributesClasses))
	for i := range pl.Spec.AttributesClasses {
		t := &pl.Spec.AttributesClasses[i]
		out = append(out, storagev1.VolumeAttributesClass{
			TypeMeta: metav1.TypeMeta{APIVersion: "storage.k8s.io/v1", Kind: AttributesClassKind},
			ObjectMeta: metav1.ObjectMeta{
				Name: t.Name,
				Labels: map[string]string{
					policyv1.LabelManagedBy: ManagedBy,
					policyv1.LabelPlacement: pl.Name,
				},
			},
			DriverName: policyv1.DriverName,
			Parameters: policyv1.AttributesClassParameters(pl.Name, t),
		})
	}
	return out
}
