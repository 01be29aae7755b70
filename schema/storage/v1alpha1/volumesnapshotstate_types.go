package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policyv1alpha1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// SnapshotPhase is the lifecycle phase of a snapshot.
// +kubebuilder:validation:Enum=Pending;Creating;Ready;Deleting;Failed
type SnapshotPhase string

const (
	SnapshotPending  SnapshotPhase = "Pending"
	SnapshotCreating SnapshotPhase = "Creating"
	SnapshotReady    SnapshotPhase = "Ready"
	SnapshotDeleting SnapshotPhase = "Deleting"
	SnapshotFailed   SnapshotPhase = "Failed"
)

// ReasonSnapshotFailed surfaces on a VolumeSnapshotState's Ready condition when the backend
// refused or failed to take or remove the snapshot (the message carries the cause); reason
// ReasonSnapshotUnsupported when the store's backend cannot take snapshots at all (thick LVM).
const (
	ReasonSnapshotFailed      = "SnapshotFailed"
	ReasonSnapshotUnsupported = "SnapshotUnsupported"
)

// ContentSource is what a new volume's data starts from (CSI VolumeContentSource): exactly
// one of a snapshot or a volume, both on the Store of the new volume.
// +kubebuilder:validation:XValidation:rule="has(self.snapshot) != has(self.volume)",message="exactly one of snapshot and volume"
type ContentSource struct {
	// Snapshot is the VolumeSnapshotState name (CSI snapshot id) to restore.
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
	// Volume is the VolumeState name (CSI volume id) to clone.
	// +optional
	Volume string `json:"volume,omitempty"`
}

// VolumeSnapshotStateSpec is the desired snapshot. The object name is the CSI snapshot id. The
// spec never changes after creation: a snapshot is taken once.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a snapshot's spec is immutable"
type VolumeSnapshotStateSpec struct {
	// CSIName is the CreateSnapshot name as the CO gave it (up to 128 bytes, any characters).
	CSIName string `json:"csiName"`
	// SourceVolume is the VolumeState name (CSI volume id) the snapshot is taken of.
	SourceVolume string `json:"sourceVolume"`
	// Encryption is the source volume's (nil: clear), frozen at CreateSnapshot: the snapshot's
	// blocks carry its LUKS2 header, so a restore opens with the source's key only.
	// +optional
	Encryption *policyv1alpha1.Encryption `json:"encryption,omitempty"`
	// StoreName is the Store that holds the source volume, and so the snapshot.
	StoreName string `json:"storeName"`
	// Pool is the StoragePool of that Store: a restore must be asked for in the same pool.
	Pool string `json:"pool"`
	// AccessibleNode is the only node a volume restored from the snapshot can be used on: the
	// Store's node when the source is a local volume; empty when it is exported over NVMe-oF
	// (a restore is made on the storage node and exported to any initiator).
	// +optional
	AccessibleNode string `json:"accessibleNode,omitempty"`
	// Group is the CSI group snapshot id (GroupSnapshotID) this snapshot is a member of;
	// empty for a snapshot taken on its own. The object then carries the label LabelGroup.
	// +optional
	Group string `json:"group,omitempty"`
	// GroupMembers are the ids of every member snapshot of Group, this one included, sorted.
	// All are on this snapshot's Store: the agent takes them in one crash-consistent
	// operation once every member object exists, and never some without the others.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	GroupMembers []string `json:"groupMembers,omitempty"`
}

// VolumeSnapshotStateStatus is written by the node agent from what the kernel reports.
type VolumeSnapshotStateStatus struct {
	// ObservedGeneration is the metadata.generation the agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase of the snapshot.
	// +optional
	Phase SnapshotPhase `json:"phase,omitempty"`
	// ReadyToUse is true once the backend holds the snapshot and a volume can be restored from
	// it (CSI Snapshot.ready_to_use).
	// +optional
	ReadyToUse bool `json:"readyToUse,omitempty"`
	// SizeBytes is the size in bytes of the volume the snapshot was taken of, as the backend
	// reports it: the smallest volume a restore makes (CSI Snapshot.size_bytes).
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// CreationTime is when the backend took the snapshot (CSI Snapshot.creation_time).
	// +optional
	CreationTime *metav1.Time `json:"creationTime,omitempty"`
	// Conditions hold Ready (reasons Succeeded, SnapshotFailed, SnapshotUnsupported,
	// StoreNotReady, Deleting).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// VolumeSnapshotState is one snapshot of a volume: the CSI controller writes spec, the agent of
// the source's node takes the snapshot and writes status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=vss,categories=plinth
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.sourceVolume`
// +kubebuilder:printcolumn:name="Store",type=string,JSONPath=`.spec.storeName`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.sizeBytes`
// +kubebuilder:printcolumn:name="ReadyToUse",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VolumeSnapshotState struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VolumeSnapshotStateSpec   `json:"spec"`
	Status VolumeSnapshotStateStatus `json:"status,omitempty"`
}

// VolumeSnapshotStateList is a list of VolumeSnapshotStates.
//
// +kubebuilder:object:root=true
type VolumeSnapshotStateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VolumeSnapshotState `json:"items"`
}

// GetConditions returns the status conditions.
func (in *VolumeSnapshotState) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *VolumeSnapshotState) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

// LabelGroup on a VolumeSnapshotState holds its Spec.Group: the members of one group snapshot
// are listed by it.
const LabelGroup = "storage.plinth.dev/group"

// GroupSnapshotIDPrefix starts every CSI group snapshot id.
const GroupSnapshotIDPrefix = "group-"

// GroupSnapshotID returns the CSI group snapshot id of a CreateVolumeGroupSnapshot name:
// "group-" and the first 40 hex digits of sha256(name), like SnapshotID.
func GroupSnapshotID(csiName string) string {
	return GroupSnapshotIDPrefix + VolumeID(csiName)[len(VolumeIDPrefix):]
}

// IsGroupSnapshotID reports whether id has the shape GroupSnapshotID returns.
func IsGroupSnapshotID(id string) bool {
	if len(id) != len(GroupSnapshotIDPrefix)+40 || id[:len(GroupSnapshotIDPrefix)] != GroupSnapshotIDPrefix {
		return false
	}
	return IsVolumeID(VolumeIDPrefix + id[len(GroupSnapshotIDPrefix):])
}

// GroupMemberSnapshotID returns the snapshot id of the member of group snapshot groupID taken
// of volume volID: SnapshotID of "<groupID>/<volID>", so a retried CreateVolumeGroupSnapshot
// finds the members it made.
func GroupMemberSnapshotID(groupID, volID string) string { return SnapshotID(groupID + "/" + volID) }

// SnapshotIDPrefix starts every CSI snapshot id.
const SnapshotIDPrefix = "snap-"

// SnapshotID returns the CSI snapshot id (= VolumeSnapshotState name) of a CreateSnapshot name:
// "snap-" and the first 40 hex digits of sha256(name), for the reasons VolumeID gives.
func SnapshotID(csiName string) string {
	return SnapshotIDPrefix + VolumeID(csiName)[len(VolumeIDPrefix):]
}

// IsSnapshotID reports whether id has the shape SnapshotID returns.
func IsSnapshotID(id string) bool {
	if len(id) != len(SnapshotIDPrefix)+40 || id[:len(SnapshotIDPrefix)] != SnapshotIDPrefix {
		return false
	}
	return IsVolumeID(VolumeIDPrefix + id[len(SnapshotIDPrefix):])
}
