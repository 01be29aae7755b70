package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the runtime API group and version: storage.plinth.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "storage.plinth.dev", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the runtime kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the runtime kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&Agent{}, &AgentList{},
		&Store{}, &StoreList{},
		&VolumeState{}, &VolumeStateList{},
		&VolumeSnapshotState{}, &VolumeSnapshotStateList{},
	)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
