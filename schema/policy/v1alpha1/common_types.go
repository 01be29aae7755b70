package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LocalObjectReference names another cluster-scoped policy object of a known kind.
type LocalObjectReference struct {
	// Name of the referenced object (DNS-1123 subdomain, at most 63 bytes).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
}

// ObjectReference identifies an object Plinth produced from a policy object.
type ObjectReference struct {
	// APIVersion of the produced object, such as "storage.k8s.io/v1".
	APIVersion string `json:"apiVersion"`
	// Kind of the produced object, such as "StorageClass".
	Kind string `json:"kind"`
	// Name of the produced object (all produced objects are cluster-scoped).
	Name string `json:"name"`
}

// PolicyStatus is the status every policy kind shares.
type PolicyStatus struct {
	// ObservedGeneration is the metadata.generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions hold Ready, Reconciling and Stalled (kstatus), StoresReady and Drifted.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// LastAppliedRevision is the source revision (for example a Git commit) the sync tool
	// recorded on the object when Plinth last applied what it renders; empty when no sync tool
	// recorded one.
	// +optional
	LastAppliedRevision string `json:"lastAppliedRevision,omitempty"`

	// Produced lists the objects rendered from this policy object at the last apply.
	// +optional
	Produced []ObjectReference `json:"produced,omitempty"`
}

// GetConditions returns the status conditions (fluxcd/pkg/runtime/conditions Getter).
func (in *PolicyStatus) GetConditions() []metav1.Condition { return in.Conditions }

// SetConditions replaces the status conditions (fluxcd/pkg/runtime/conditions Setter).
func (in *PolicyStatus) SetConditions(c []metav1.Condition) { in.Conditions = c }
