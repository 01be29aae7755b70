package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policyv1alpha1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// VolumePhase is the lifecycle phase of a volume.
// +kubebuilder:validation:Enum=Pending;Creating;Ready;Expanding;Deleting;Failed
type VolumePhase string

const (
	VolumePending   VolumePhase = "Pending"
	VolumeCreating  VolumePhase = "Creating"
	VolumeReady     VolumePhase = "Ready"
	VolumeExpanding VolumePhase = "Expanding"
	VolumeDeleting  VolumePhase = "Deleting"
	VolumeFailed    VolumePhase = "Failed"
)

// ReasonInsufficientCapacity on the Ready condition of a VolumeState means the store has no
// room; the CSI controller turns it into RESOURCE_EXHAUSTED (CSI spec, CreateVolume errors).
const ReasonInsufficientCapacity = "InsufficientCapacity"

// FrozenPolicy is the policy a volume was created with, read from the live policy objects by
// CreateVolume and never changed afterwards: later policy edits do not touch existing volumes.
type FrozenPolicy struct {
	// Placement is the Placement name.
	Placement string `json:"placement"`
	// Pool is the StoragePool name.
	Pool string `json:"pool"`
	// Protocol is the Protocol name.
	Protocol string `json:"protocol"`
	// Backend is the pool's backend at creation.
	Backend policyv1alpha1.Backend `json:"backend"`
	// ProtocolSpec is the protocol at creation.
	ProtocolSpec policyv1alpha1.ProtocolSpec `json:"protocolSpec"`
	// Filesystem is the placement's filesystem at creation.
	// +optional
	Filesystem policyv1alpha1.Filesystem `json:"filesystem,omitempty"`
	// Encryption is the placement's encryption at creation (nil: a clear volume), KeySecret
	// always set: the volume's own key Secret or the operator's.
	// +optional
	Encryption *policyv1alpha1.Encryption `json:"encryption,omitempty"`
	// Overrides holds the PVC annotations (name → value) that changed the placement's
	// parameters for this volume; the fields above already include their effect.
	// +optional
	Overrides map[string]string `json:"overrides,omitempty"`
}

// Publication is one node allowed to use the volume (CSI ControllerPublishVolume).
type Publication struct {
	// NodeName is the Node the volume is published to.
	NodeName string `json:"nodeName"`
	// HostNQN is that node's NVMe host NQN (empty for local volumes).
	// +optional
	HostNQN string `json:"hostNQN,omitempty"`
	// AccessMode is the CSI access mode, such as SINGLE_NODE_WRITER.
	AccessMode string `json:"accessMode"`
	// ReadOnly publishes read-only.
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`
}

// VolumeStateSpec is the desired state of one volume. The object name is the CSI volume id.
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.move) || !has(self.move) || self.move == oldSelf.move",message="move cannot change while it is set (one move of a volume at a time): clear it first"
// +kubebuilder:validation:XValidation:rule="!has(self.move) || (!has(oldSelf.move) && self.storeName == self.move.sourceStore) || (has(oldSelf.move) && (self.storeName == oldSelf.storeName || (oldSelf.storeName == self.move.sourceStore && self.storeName == self.move.targetStore)))",message="a move starts from spec.storeName, and while it is set storeName changes only from its sourceStore to its targetStore"
type VolumeStateSpec struct {
	// CSIName is the CreateVolume name as the CO gave it (up to 128 bytes, any characters).
	CSIName string `json:"csiName"`
	// StoreName is the Store that holds the volume.
	StoreName string `json:"storeName"`
	// CapacityBytes is the desired size in bytes, already rounded up to the store's unit.
	// +kubebuilder:validation:Minimum=1
	CapacityBytes int64 `json:"capacityBytes"`
	// VolumeMode is Filesystem or Block.
	// +kubebuilder:validation:Enum=Filesystem;Block
	VolumeMode string `json:"volumeMode"`
	// Policy is the policy frozen at creation.
	Policy FrozenPolicy `json:"policy"`
	// Publications are the nodes allowed to use the volume.
	// +optional
	Publications []Publication `json:"publications,omitempty"`
	// PublicationGeneration increases on every change of Publications; the agent refuses
	// export ACL changes older than the highest it acted on (fencing).
	// +optional
	PublicationGeneration int64 `json:"publicationGeneration,omitempty"`
	// ContentSource is the snapshot or volume the new volume's data is copied from (CSI
	// CreateVolume volume_content_source), on the same Store; unset for an empty volume. It
	// never changes after creation.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="contentSource is immutable"
	ContentSource *ContentSource `json:"contentSource,omitempty"`
	// KeyOrigin says where the LUKS2 header of an encrypted volume made from a content source
	// comes from (its blocks carry the source's header); unset for any other volume. It never
	// changes after creation.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="keyOrigin is immutable"
	KeyOrigin *KeyOrigin `json:"keyOrigin,omitempty"`
	// Attributes are the tier in force: the VolumeAttributesClass the CSI controller last
	// accepted (CreateVolume's mutable_parameters, ControllerModifyVolume) and its limits,
	// which the node plugin of every node that stages the volume writes into the consuming
	// pods' cgroups. Unset: no limits. Unlike Policy it changes over the volume's life.
	// +optional
	Attributes *VolumeAttributes `json:"attributes,omitempty"`
	// Move asks for the volume to leave SourceStore for TargetStore (docs/design.md, "Data
	// mobility"). One field per volume, so two moves of one volume cannot exist: it is set
	// when spec.storeName is its sourceStore, never changed while set (only cleared), and
	// storeName changes, while it is set, only from sourceStore to targetStore (the switch,
	// once status.move says the copy is verified). Unset: the volume stays.
	// +optional
	Move *VolumeMove `json:"move,omitempty"`
}

// VolumeMove is one move of a volume between two Stores.
//
// +kubebuilder:validation:XValidation:rule="self.sourceStore != self.targetStore",message="targetStore must differ from sourceStore"
type VolumeMove struct {
	// ID names this move; status.move.id echoes the move the agent's status is about, so a
	// status of an earlier move of the volume never counts for this one.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ID string `json:"id"`
	// SourceStore is the Store the volume leaves (spec.storeName when the move was set).
	// +kubebuilder:validation:MinLength=1
	SourceStore string `json:"sourceStore"`
	// TargetStore is the Store the volume goes to.
	// +kubebuilder:validation:MinLength=1
	TargetStore string `json:"targetStore"`
}

// MovePhase is the step a move has reached (status.move.phase).
// +kubebuilder:validation:Enum=Waiting;Copying;Copied;Done;Failed
type MovePhase string

const (
	// MoveWaiting: the move cannot start yet (the consumer still uses the volume: it has
	// publications); message says what it waits for. Nothing is made on the target.
	MoveWaiting MovePhase = "Waiting"
	// MoveCopying: the target volume exists and the data is being copied; the source is the
	// live copy.
	MoveCopying MovePhase = "Copying"
	// MoveCopied: the target holds the source's bytes, verified by checksum; the source is
	// still the live copy until the controller switches spec.storeName to the target.
	MoveCopied MovePhase = "Copied"
	// MoveDone: spec.storeName is the target, the volume is served from there and the
	// source's copy is deleted; the controller then clears spec.move.
	MoveDone MovePhase = "Done"
	// MoveFailed: the move cannot be carried out as asked (message says why); the source
	// stays the live copy and nothing of the move is left on the target.
	MoveFailed MovePhase = "Failed"
)

// MoveStatus is the progress of spec.move, written by the agent.
type MoveStatus struct {
	// ID is the spec.move.id this status is about.
	ID string `json:"id"`
	// Phase is the step reached.
	Phase MovePhase `json:"phase"`
	// SourceStore and TargetStore repeat spec.move's.
	SourceStore string `json:"sourceStore"`
	TargetStore string `json:"targetStore"`
	// BytesTotal is what the copy carries: the source volume's size in bytes.
	// +optional
	BytesTotal int64 `json:"bytesTotal,omitempty"`
	// BytesCopied is how many bytes of it are copied (and, from Copied on, verified).
	// +optional
	BytesCopied int64 `json:"bytesCopied,omitempty"`
	// Checksum is "sha256:" and the hex SHA-256 of the copied range, read back from the
	// target and equal to the source's; set from Copied on.
	// +optional
	Checksum string `json:"checksum,omitempty"`
	// PublicationGeneration is the spec.publicationGeneration the copy was made under (no
	// publication then). The switch is valid only while spec still has it: a consumer let in
	// since may have written the source after the copy, which is then made again.
	// +optional
	PublicationGeneration int64 `json:"publicationGeneration,omitempty"`
	// StartedAt is when the copy started; CopiedAt when it was verified.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// +optional
	CopiedAt *metav1.Time `json:"copiedAt,omitempty"`
	// Message says what the move waits for or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// VolumeAttributes is a volume's tier.
type VolumeAttributes struct {
	// Class is the VolumeAttributesClass name.
	Class string `json:"class"`
	// Limits are its limits (the Placement's attributesClasses[].limits).
	Limits policyv1alpha1.IOLimits `json:"limits"`
	// Generation increases with every change of Class or Limits; node plugins report the
	// generation they applied in status.appliedAttributes.
	// +kubebuilder:validation:Minimum=1
	Generation int64 `json:"generation"`
}

// AppliedAttributes is what the node plugin of one node did with spec.attributes.
type AppliedAttributes struct {
	// NodeName is the node that stages the volume.
	NodeName string `json:"nodeName"`
	// Generation is the spec.attributes.generation the node acted on (0: no attributes).
	Generation int64 `json:"generation"`
	// Message is empty when the limits are in force for every pod that consumes the volume
	// on the node; otherwise it says why they could not be applied (the block device or the
	// pod's cgroup is missing, a cgroup write failed).
	// +optional
	Message string `json:"message,omitempty"`
}

// KeyOrigin is the lineage of the LUKS2 header of an encrypted volume or snapshot whose blocks
// are another volume's (a restore, a clone, a snapshot): the source's header, whose keyslot the
// source's key opens (docs/design.md#volume-encryption).
type KeyOrigin struct {
	// Secret is the key Secret the object's own key Secret (Encryption.KeySecret) is a copy
	// of: the source's per-volume key, copied by the CSI controller at creation. Unset when
	// source and object share the operator's Secret.
	// +optional
	Secret *policyv1alpha1.SecretReference `json:"secret,omitempty"`
	// HeaderLabels are the volume ids, besides the volume's own, that the header may be
	// labelled with: the source's id, then the source's own HeaderLabels (a source never
	// staged still carries its own source's label), at most MaxHeaderLabels, nearest first.
	// NodeStage opens such a header and relabels it with the volume's id.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	HeaderLabels []string `json:"headerLabels,omitempty"`
}

// MaxHeaderLabels bounds KeyOrigin.HeaderLabels: a chain of restores longer than that, none
// of them ever staged, loses its oldest labels (NodeStage then refuses the header as another
// volume's, and formats nothing).
const MaxHeaderLabels = 16

// Export is where an NVMe-oF volume is served.
type Export struct {
	// NQN is the subsystem NQN (at most 223 bytes, NVMe Base Specification 4.5).
	NQN string `json:"nqn"`
	// Address is the target's IP address (traddr).
	Address string `json:"address"`
	// Port is the TCP service id (trsvcid).
	Port int32 `json:"port"`
}

// VolumeStateStatus is written by the node agent.
type VolumeStateStatus struct {
	// ObservedGeneration is the metadata.generation the agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ObservedPublicationGeneration is the spec.publicationGeneration the export reflects.
	// +optional
	ObservedPublicationGeneration int64 `json:"observedPublicationGeneration,omitempty"`
	// Phase of the volume.
	// +optional
	Phase VolumePhase `json:"phase,omitempty"`
	// DevicePath is the block device on the storage node, such as /dev/vg0/vol-....
	// +optional
	DevicePath string `json:"devicePath,omitempty"`
	// Export is set when the volume is exported over NVMe-oF.
	// +optional
	Export *Export `json:"export,omitempty"`
	// ActualBytes is the real size of the volume in bytes (≥ spec.capacityBytes when Ready).
	// +optional
	ActualBytes int64 `json:"actualBytes,omitempty"`
	// Conditions hold Ready (reason InsufficientCapacity when there is no room), Reconciling,
	// Stalled.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// AppliedAttributes are written by the node plugins that stage the volume, one entry per
	// node (spec.attributes).
	// +optional
	// +listType=map
	// +listMapKey=nodeName
	AppliedAttributes []AppliedAttributes `json:"appliedAttributes,omitempty"`
	// Move is the progress of spec.move (kept after the move ends, until the next one).
	// +optional
	Move *MoveStatus `json:"move,omitempty"`
	// Encryption is where the key rotation of an encrypted volume stands: written by the node
	// plugin that opened or re-wrapped its LUKS2 header (docs/design.md#volume-key-rotation).
	// +optional
	Encryption *EncryptionStatus `json:"encryption,omitempty"`
}

// EncryptionStatus is the key generation an encrypted volume's LUKS2 header holds.
type EncryptionStatus struct {
	// KeyGeneration is the generation (the key Secret's data "generation", 0 when it has none)
	// of the only passphrase the header's keyslots open: once it reaches the Secret's, the
	// CSI controller drops the previous passphrase from the Secret.
	// +kubebuilder:validation:Minimum=0
	KeyGeneration int64 `json:"keyGeneration"`
	// NodeName is the node whose plugin last opened or re-wrapped the header.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// VolumeState is one volume: the CSI controller writes spec, the agent writes status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=vs,categories=plinth
// +kubebuilder:printcolumn:name="Store",type=string,JSONPath=`.spec.storeName`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.spec.capacityBytes`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VolumeState struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VolumeStateSpec   `json:"spec"`
	Status VolumeStateStatus `json:"status,omitempty"`
}

// VolumeStateList is a list of VolumeStates.
//
// +kubebuilder:object:root=true
type VolumeStateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VolumeState `json:"items"`
}

// GetConditions returns the status conditions.
func (in *VolumeState) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *VolumeState) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }
