package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Replacement says whether Plinth may delete and recreate a StorageClass whose immutable fields
// (parameters, provisioner, reclaimPolicy, volumeBindingMode — Kubernetes
// ValidateStorageClassUpdate) changed in policy.
// +kubebuilder:validation:Enum=Never;IfUnused;Always
type Replacement string

const (
	// ReplacementNever keeps the old StorageClass and reports the pending change (default).
	ReplacementNever Replacement = "Never"
	// ReplacementIfUnused replaces the StorageClass only when no PV or PVC uses it.
	ReplacementIfUnused Replacement = "IfUnused"
	// ReplacementAlways replaces it; existing PVs keep working, their volumes keep the policy
	// frozen at creation.
	ReplacementAlways Replacement = "Always"
)

// Strategy orders nodes with room for a volume.
// +kubebuilder:validation:Enum=Binpack;Spreadout
type Strategy string

const (
	// StrategyBinpack prefers the node with the least free capacity that still fits.
	StrategyBinpack Strategy = "Binpack"
	// StrategySpreadout prefers the node with the most free capacity.
	StrategySpreadout Strategy = "Spreadout"
)

// PlacementSpec is what apps see: a StorageClass backed by a pool and reached by a protocol.
type PlacementSpec struct {
	// PoolRef names the StoragePool that holds the volumes.
	PoolRef LocalObjectReference `json:"poolRef"`
	// ProtocolRef names the Protocol that serves them.
	ProtocolRef LocalObjectReference `json:"protocolRef"`
	// StorageClass is the class rendered for apps.
	StorageClass StorageClassTemplate `json:"storageClass"`
	// Filesystem is how mount volumes are formatted and mounted.
	// +optional
	Filesystem Filesystem `json:"filesystem,omitempty"`
	// Strategy is Binpack (default) or Spreadout.
	// +optional
	// +kubebuilder:default=Binpack
	Strategy Strategy `json:"strategy,omitempty"`
	// SpreadAcross is a node label key, such as topology.kubernetes.io/zone: plinth-scheduler
	// spreads the volumes of one workload (the pods of one controller, such as a StatefulSet or
	// ReplicaSet; a pod without one is its own workload) across the label's values, at most one
	// volume apart, and never places them on a node without the label. Needs a local Protocol
	// and volumeBindingMode WaitForFirstConsumer. Rendered as the StorageClass parameter
	// plinth.dev/spread-across, so a change replaces the class (see storageClass.replacement).
	// +optional
	// +kubebuilder:validation:MaxLength=316
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	SpreadAcross string `json:"spreadAcross,omitempty"`
	// SnapshotClass, when set, renders a VolumeSnapshotClass (snapshot.storage.k8s.io/v1,
	// driver csi.plinth.dev) for the volumes of this Placement. The pool's backend must take
	// snapshots (file, ZFS, LVM with a thin pool).
	// +optional
	SnapshotClass *SnapshotClassTemplate `json:"snapshotClass,omitempty"`
	// Overrides lists what a PVC of this placement may set for its own volume through
	// annotations (see OverrideAnnotations). Without it, no PVC overrides anything.
	// +optional
	Overrides *Overrides `json:"overrides,omitempty"`
}

// OverrideParameter names a placement parameter a PVC may override.
// +kubebuilder:validation:Enum=mkfsOptions;mountOptions;strategy
type OverrideParameter string

// The parameters a PVC may override, each through its annotation in OverrideAnnotations.
const (
	// OverrideMkfsOptions replaces filesystem.mkfsOptions (annotation value: arguments
	// separated by white space, such as "-m 0 -E lazy_itable_init=0").
	OverrideMkfsOptions OverrideParameter = "mkfsOptions"
	// OverrideMountOptions adds to filesystem.mountOptions (annotation value: options
	// separated by commas, as in fstab, such as "noatime,nodiscard"); the class's own options
	// still reach the mount through the PersistentVolume.
	OverrideMountOptions OverrideParameter = "mountOptions"
	// OverrideStrategy replaces strategy (annotation value: Binpack or Spreadout).
	OverrideStrategy OverrideParameter = "strategy"
)

// OverrideAnnotations maps each OverrideParameter to the PVC annotation that sets it. The CSI
// controller reads them from the PVC that csi-provisioner names (--extra-create-metadata).
var OverrideAnnotations = map[OverrideParameter]string{
	OverrideMkfsOptions:  "plinth.dev/mkfs-options",
	OverrideMountOptions: "plinth.dev/mount-options",
	OverrideStrategy:     "plinth.dev/strategy",
}

// Overrides is what PVCs may change for their own volumes.
type Overrides struct {
	// Allowed lists the parameters a PVC may override; each is validated by the same rules as
	// the placement's own field.
	// +listType=set
	Allowed []OverrideParameter `json:"allowed"`
}

// SnapshotClassTemplate is the VolumeSnapshotClass a Placement renders (driver csi.plinth.dev).
type SnapshotClassTemplate struct {
	// Name of the VolumeSnapshotClass (DNS-1123 subdomain, at most 253 bytes).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
	// DeletionPolicy is Delete (default: deleting a VolumeSnapshot deletes the snapshot) or
	// Retain.
	// +optional
	// +kubebuilder:validation:Enum=Delete;Retain
	// +kubebuilder:default=Delete
	DeletionPolicy string `json:"deletionPolicy,omitempty"`
	// IsDefault marks the class as the default for the driver
	// (snapshot.storage.kubernetes.io/is-default-class). At most one placement may set it.
	// +optional
	// +kubebuilder:default=false
	IsDefault bool `json:"isDefault,omitempty"`
	// Velero labels the class velero.io/csi-volumesnapshot-class=true, the label Velero's CSI
	// support looks for to pick the class of a driver. Default false.
	// +optional
	// +kubebuilder:default=false
	Velero bool `json:"velero,omitempty"`
}

// StorageClassTemplate is the StorageClass a Placement renders (provisioner csi.plinth.dev).
type StorageClassTemplate struct {
	// Name of the StorageClass (DNS-1123 subdomain, at most 253 bytes).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
	// ReclaimPolicy is Delete (default) or Retain.
	// +optional
	// +kubebuilder:validation:Enum=Delete;Retain
	// +kubebuilder:default=Delete
	ReclaimPolicy string `json:"reclaimPolicy,omitempty"`
	// VolumeBindingMode is WaitForFirstConsumer (default) or Immediate. The local protocol
	// requires WaitForFirstConsumer.
	// +optional
	// +kubebuilder:validation:Enum=Immediate;WaitForFirstConsumer
	// +kubebuilder:default=WaitForFirstConsumer
	VolumeBindingMode string `json:"volumeBindingMode,omitempty"`
	// AllowVolumeExpansion lets PVCs of the class grow. Default false.
	// +optional
	// +kubebuilder:default=false
	AllowVolumeExpansion bool `json:"allowVolumeExpansion,omitempty"`
	// IsDefault marks the class as the cluster default
	// (storageclass.kubernetes.io/is-default-class). At most one placement may set it.
	// +optional
	// +kubebuilder:default=false
	IsDefault bool `json:"isDefault,omitempty"`
	// Replacement is Never (default), IfUnused or Always.
	// +optional
	// +kubebuilder:default=Never
	Replacement Replacement `json:"replacement,omitempty"`
}

// Filesystem says how mount volumes are formatted (only when blank) and mounted.
type Filesystem struct {
	// FSType is ext4 (default) or xfs.
	// +optional
	// +kubebuilder:validation:Enum=ext4;xfs
	// +kubebuilder:default=ext4
	FSType string `json:"fsType,omitempty"`
	// MkfsOptions are extra arguments to mkfs.<fsType>.
	// +optional
	MkfsOptions []string `json:"mkfsOptions,omitempty"`
	// MountOptions are mount(8) options, also written to the StorageClass.
	// +optional
	MountOptions []string `json:"mountOptions,omitempty"`
}

// Placement is what apps see: a StorageClass.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=splace,categories=plinth
// +kubebuilder:printcolumn:name="StorageClass",type=string,JSONPath=`.spec.storageClass.name`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Protocol",type=string,JSONPath=`.spec.protocolRef.name`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Drifted",type=string,JSONPath=`.status.conditions[?(@.type=="Drifted")].status`
// +kubebuilder:printcolumn:name="InUseBy",type=integer,JSONPath=`.status.inUseBy`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Placement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PlacementSpec `json:"spec"`
	Status PolicyStatus  `json:"status,omitempty"`
}

// PlacementList is a list of Placements.
//
// +kubebuilder:object:root=true
type PlacementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Placement `json:"items"`
}

// GetConditions returns the status conditions.
func (in *Placement) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *Placement) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }
