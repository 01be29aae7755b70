package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the policy API group and version: policy.plinth.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "policy.plinth.dev", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the policy kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the policy kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&StoragePool{}, &StoragePoolList{},
		&Protocol{}, &ProtocolList{},
		&Placement{}, &PlacementList{},
	)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
