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

	// StorageClass is the name of the StorageClass the Placement renders (Placement only).
	// +optional
	StorageClass string `json:"storageClass,omitempty"`

	// InUseBy is the number of PersistentVolumeClaims whose storageClassName is the
	// Placement's StorageClass (Placement only); while it is above zero the class is never
	// pruned or replaced under IfUnused, and the Placement keeps the plinth.dev/in-use finalizer.
	// +optional
	InUseBy *int32 `json:"inUseBy,omitempty"`

	// KeyRotation is where the rotation of the Placement's per-volume keys stands
	// (encryption.keyGeneration; Placement only; written by the CSI controller, which also sets
	// the condition KeysRotated).
	// +optional
	KeyRotation *KeyRotationStatus `json:"keyRotation,omitempty"`

	// MatchedNodes is the number of Nodes the StoragePool's nodeSelector selects (StoragePool only).
	// +optional
	MatchedNodes *int32 `json:"matchedNodes,omitempty"`

	// Capacity sums status.capacity of the StoragePool's Stores, in bytes (StoragePool only;
	// Stores whose agent has not reported yet count as zero).
	// +optional
	Capacity *PoolCapacity `json:"capacity,omitempty"`
}

// PoolCapacity is the capacity of a StoragePool summed over its Stores, in bytes.
type PoolCapacity struct {
	// Total is the summed physical size in bytes.
	Total int64 `json:"total"`
	// Allocatable is the summed total − reserve in bytes.
	Allocatable int64 `json:"allocatable"`
	// Provisioned is the summed size of the volumes in bytes.
	Provisioned int64 `json:"provisioned"`
	// Available is the summed room for new volumes in bytes.
	Available int64 `json:"available"`
	// ReportingStores is how many of the pool's Stores have reported a capacity.
	ReportingStores int32 `json:"reportingStores"`
}

// GetConditions returns the status conditions (fluxcd/pkg/runtime/conditions Getter).
func (in *PolicyStatus) GetConditions() []metav1.Condition { return in.Conditions }

// SetConditions replaces the status conditions (fluxcd/pkg/runtime/conditions Setter).
func (in *PolicyStatus) SetConditions(c []metav1.Condition) { in.Conditions = c }

// KeyRotationStatus counts the volumes of a Placement by where their key rotation stands
// (docs/design.md#volume-key-rotation).
type KeyRotationStatus struct {
	// KeyGeneration is the generation rotated to (spec.encryption.keyGeneration).
	KeyGeneration int64 `json:"keyGeneration"`
	// Rewrapped volumes have a key Secret of that generation and a LUKS2 header opened by
	// its key only (reported by the node plugin that re-wrapped or opened it).
	Rewrapped int32 `json:"rewrapped"`
	// Pending volumes have not got there yet: their Secret holds a new key and the previous
	// one until a node re-wraps the header (at its next stage or republish), or waits for a
	// new key.
	Pending int32 `json:"pending"`
	// PendingVolumes names up to 10 pending volumes (CSI volume ids).
	// +optional
	PendingVolumes []string `json:"pendingVolumes,omitempty"`
}
