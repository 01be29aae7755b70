package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DriftPolicy says what Plinth does when the kernel or the API objects no longer match policy.
// +kubebuilder:validation:Enum=Report;Correct
type DriftPolicy string

const (
	// DriftPolicyReport reports drift as the Drifted condition and plinth_drift_objects only.
	DriftPolicyReport DriftPolicy = "Report"
	// DriftPolicyCorrect reports drift and converges the drifted object back to policy.
	DriftPolicyCorrect DriftPolicy = "Correct"
)

// StoragePoolSpec declares where capacity lives: which nodes carry the pool and which backend
// holds its volumes on each of them.
// +kubebuilder:validation:XValidation:rule="!has(self.overcommitPercent) || has(self.backend.zfs) || (has(self.backend.lvm) && has(self.backend.lvm.thinPool))",message="overcommitPercent is only valid on thin backends (lvm.thinPool or zfs)"
type StoragePoolSpec struct {
	// NodeSelector selects the nodes that carry this pool. Empty selects no node.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// Backend holds exactly one of lvm, zfs, file or raw.
	Backend Backend `json:"backend"`

	// Reserve is headroom never provisioned on each node: a quantity in bytes ("10Gi") or a
	// percent of the physical size from 1% to 100% ("5%"). Default "0".
	// +optional
	// +kubebuilder:validation:Pattern=`^(([0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?)|(([1-9][0-9]?|100)%))$`
	Reserve string `json:"reserve,omitempty"`

	// OvercommitPercent is the maximum provisioned ÷ physical × 100 of a thin backend
	// (LVM thin pool or ZFS sparse zvols); 100 means no overcommit. Only valid on thin backends.
	// +optional
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=10000
	OvercommitPercent *int32 `json:"overcommitPercent,omitempty"`

	// DriftPolicy is Report (default) or Correct.
	// +optional
	// +kubebuilder:default=Report
	DriftPolicy DriftPolicy `json:"driftPolicy,omitempty"`

	// EvacuateNodes names the nodes (Node names) whose Stores of this pool are to be emptied:
	// each such Store takes no new volume (as a draining one), and its volumes are planned to
	// move to the pool's other Stores (plinth diff shows each move). The pool's Evacuating
	// condition reports the moves' progress; those to another node (all of this pool's, a
	// pool having one Store per node) are not carried out yet and are named there, their
	// volumes left in place (docs/design.md#data-mobility). A node listed here that
	// the pool does not select is a plinth diff violation (EvacuateNodeNotInPool). Unlike dropping a node from nodeSelector
	// (its Store drains: kept until its owners delete their volumes), this is a Git change
	// plinth diff can plan. 1 to 64 unique names.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	EvacuateNodes []string `json:"evacuateNodes,omitempty"`

	// MaxParallelMovesPerStore is how many volume moves a Store of this pool takes part in at
	// once, as source or target, 1–16. Default 1: one volume at a time per Store. plinth diff
	// schedules its estimated durations with it; the move executor starts no more at once.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	// Unset (0) is 1; no API-server default, so that objects stored before the field existed
	// read back unchanged after a CRD upgrade.
	MaxParallelMovesPerStore int32 `json:"maxParallelMovesPerStore,omitempty"`
}

// Backend holds exactly one storage backend.
// +kubebuilder:validation:XValidation:rule="[has(self.lvm), has(self.zfs), has(self.file), has(self.raw)].filter(x, x).size() == 1",message="exactly one of lvm, zfs, file or raw must be set"
type Backend struct {
	// LVM keeps volumes as logical volumes of one volume group, optionally in a thin pool.
	// +optional
	LVM *LVMBackend `json:"lvm,omitempty"`
	// ZFS keeps volumes as zvols under a parent dataset.
	// +optional
	ZFS *ZFSBackend `json:"zfs,omitempty"`
	// File keeps volumes as sparse files attached to loop devices: for development and nodes
	// without LVM.
	// +optional
	File *FileBackend `json:"file,omitempty"`
	// Raw keeps each volume as a GPT partition of one of the declared disks, or as a whole
	// disk (Carina's raw-disk volumes).
	// +optional
	Raw *RawBackend `json:"raw,omitempty"`
}

// LVMBackend is an LVM volume group, created by the agent on the declared devices when they are
// empty (see lvm(8) "VALID NAMES" for the name rules).
// +kubebuilder:validation:XValidation:rule="!has(self.cache) || !has(self.thinPool)",message="cache and thinPool are exclusive: a cached volume's backing device is a linear LV"
// +kubebuilder:validation:XValidation:rule="!has(self.cache) || self.cache.volumeGroup != self.volumeGroup",message="cache.volumeGroup must differ from volumeGroup: the cache LVs live in their own (fast) VG"
type LVMBackend struct {
	// VolumeGroup is the VG name: at most 63 bytes of [A-Za-z0-9+_.-], not starting with "-",
	// so that the device-mapper name of every volume fits in 127 bytes.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$`
	VolumeGroup string `json:"volumeGroup"`

	// Devices are the block devices (absolute /dev paths) that form the VG. The agent creates
	// physical volumes only on devices that carry no signature. Empty means the VG must exist.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Pattern=`^/dev/[A-Za-z0-9/_.:+-]+$`
	Devices []string `json:"devices,omitempty"`

	// ThinPool, when set, holds every volume of the pool as a thin LV in this thin pool.
	// +optional
	ThinPool *ThinPool `json:"thinPool,omitempty"`

	// Cache, when set, puts a bcache cache on a fast device in front of every volume (Carina's
	// tiering): a volume is a linear backing LV in VolumeGroup plus a cache LV in
	// Cache.VolumeGroup, and its block device is the /dev/bcacheN of the pair. Nodes need the
	// bcache module (Agent status.capabilities.kernelModules lists "bcache"); a node without it
	// reports the Store Stalled (reason MissingKernelModules) and makes no volume. Exclusive
	// with ThinPool. Cached volumes do not grow (bcache sizes its device at registration).
	// +optional
	Cache *LVMCache `json:"cache,omitempty"`
}

// CacheMode is bcache's cache_mode (Documentation/admin-guide/bcache.rst).
// +kubebuilder:validation:Enum=writethrough;writeback;writearound
type CacheMode string

const (
	// CacheModeWritethrough: writes reach the backing device and the cache before they
	// complete; reads are cached. The default.
	CacheModeWritethrough CacheMode = "writethrough"
	// CacheModeWriteback: writes complete once in the cache and reach the backing device later;
	// losing the cache device loses them.
	CacheModeWriteback CacheMode = "writeback"
	// CacheModeWritearound: writes bypass the cache; reads are cached.
	CacheModeWritearound CacheMode = "writearound"
)

// LVMCache is the fast VG that holds one bcache cache LV per volume.
type LVMCache struct {
	// VolumeGroup is the fast VG's name (same rules as the backend's volumeGroup), different
	// from the backend's volumeGroup.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$`
	VolumeGroup string `json:"volumeGroup"`

	// Devices are the fast block devices (absolute /dev paths) that form the fast VG; the agent
	// creates physical volumes only on devices that carry no signature. Empty means the VG must
	// exist.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Pattern=`^/dev/[A-Za-z0-9/_.:+-]+$`
	Devices []string `json:"devices,omitempty"`

	// Mode is the cache mode: writethrough (default), writeback or writearound.
	// +optional
	// +kubebuilder:default=writethrough
	Mode CacheMode `json:"mode,omitempty"`

	// RatioPercent is each cache LV's size in percent of its volume's size, 1–100 (at least
	// 128 MiB: the kernel needs more than 512 buckets, of 128 KiB). Default 10.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=10
	RatioPercent int32 `json:"ratioPercent,omitempty"`
}

// ThinPool is an LVM thin pool inside the volume group (lvmthin(7)).
type ThinPool struct {
	// Name of the thin pool LV: at most 63 bytes of [A-Za-z0-9+_.-], not starting with "-".
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$`
	Name string `json:"name"`

	// SizePercent is the share of the VG the thin pool takes when created, 1–100. Default 90.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=90
	SizePercent int32 `json:"sizePercent,omitempty"`
}

// ZFSBackend is a zpool; volumes are zvols under ParentDataset (zfsprops(7)).
type ZFSBackend struct {
	// Pool is the zpool name: at most 63 bytes, starts with a letter, [A-Za-z0-9_.:-].
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9_.:-]*$`
	Pool string `json:"pool"`

	// ParentDataset is the dataset path below the pool that holds the zvols, such as
	// "k8s/volumes"; at most 150 bytes so that generated zvol names stay under ZFS's 255.
	// +optional
	// +kubebuilder:validation:MaxLength=150
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:-]+(/[A-Za-z0-9_.:-]+)*$`
	ParentDataset string `json:"parentDataset,omitempty"`

	// VolBlockSize is the zvol volblocksize, a power of two from 4K to 128K. Default "16K".
	// +optional
	// +kubebuilder:validation:Enum="4K";"8K";"16K";"32K";"64K";"128K"
	// +kubebuilder:default="16K"
	VolBlockSize string `json:"volBlockSize,omitempty"`

	// Properties are extra ZFS properties set on each zvol (for example compression: lz4).
	// +optional
	Properties map[string]string `json:"properties,omitempty"`
}

// FileBackend keeps each volume as a sparse file in Directory, attached to a loop device.
type FileBackend struct {
	// Directory is the absolute path that holds the volume files.
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:Pattern=`^/.*`
	Directory string `json:"directory"`
}

// Partitioning says how the raw backend carves volumes out of its disks.
// +kubebuilder:validation:Enum=GPT;Whole
type Partitioning string

const (
	// PartitioningGPT makes each volume a GPT partition the agent carves from a disk's free
	// space (first 1 MiB-aligned start of the largest free region; sizes in whole MiB).
	PartitioningGPT Partitioning = "GPT"
	// PartitioningWhole makes each volume take one whole disk: the smallest free disk that
	// holds the requested size. The disk carries a GPT with one partition spanning it, which
	// is where the volume's id is kept (a bare disk has no place for a name).
	PartitioningWhole Partitioning = "Whole"
)

// RawBackend keeps volumes on the declared disks directly, without a volume manager: a GPT
// partition per volume, or a whole disk per volume. The agent writes a GPT only on disks that
// carry no signature, or that carry a GPT whose every partition is Plinth's.
type RawBackend struct {
	// Devices are the whole disks (absolute /dev paths; stable ones such as
	// /dev/disk/by-id/... where udev makes them), never partitions. 1 to 64, unique.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^/dev/[A-Za-z0-9/_.:+-]+$`
	Devices []string `json:"devices"`

	// Partitioning is GPT (default: a partition per volume) or Whole (a disk per volume).
	// +optional
	// +kubebuilder:default=GPT
	Partitioning Partitioning `json:"partitioning,omitempty"`
}

// StoragePool declares where capacity lives.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=spool,categories=plinth
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Drifted",type=string,JSONPath=`.status.conditions[?(@.type=="Drifted")].status`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.matchedNodes`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.capacity.available`,priority=1
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type StoragePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   StoragePoolSpec `json:"spec"`
	Status PolicyStatus    `json:"status,omitempty"`
}

// StoragePoolList is a list of StoragePools.
//
// +kubebuilder:object:root=true
type StoragePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StoragePool `json:"items"`
}

// GetConditions returns the status conditions.
func (in *StoragePool) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *StoragePool) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

// IsThin reports whether the backend provisions thinly (LVM thin pool or ZFS zvols, which
// Plinth creates sparse), the only backends where OvercommitPercent applies.
func (b Backend) IsThin() bool {
	return (b.LVM != nil && b.LVM.ThinPool != nil) || b.ZFS != nil
}

// Kind returns "lvm", "zfs", "file" or "raw", or "" when no backend is set.
func (b Backend) Kind() string {
	switch {
	case b.LVM != nil:
		return "lvm"
	case b.ZFS != nil:
		return "zfs"
	case b.File != nil:
		return "file"
	case b.Raw != nil:
		return "raw"
	}
	return ""
}
