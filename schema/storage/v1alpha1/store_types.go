package v1alpha1

import (
	"math"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policyv1alpha1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// StoreSpec is a pool's backend resolved for one node.
type StoreSpec struct {
	// Pool is the StoragePool name.
	Pool string `json:"pool"`
	// NodeName is the Node that holds the store.
	NodeName string `json:"nodeName"`
	// Backend is the pool's backend as declared (exactly one of lvm, zfs, file).
	Backend policyv1alpha1.Backend `json:"backend"`
	// Reserve is the pool's reserve: bytes quantity or percent of physical size.
	// +optional
	Reserve string `json:"reserve,omitempty"`
	// OvercommitPercent is the pool's overcommit limit (thin backends), 100 when unset.
	// +optional
	OvercommitPercent int32 `json:"overcommitPercent,omitempty"`
	// DriftPolicy is the pool's drift policy.
	// +optional
	DriftPolicy policyv1alpha1.DriftPolicy `json:"driftPolicy,omitempty"`
	// Evacuate is true when the pool lists this Store's node in spec.evacuateNodes: the Store
	// takes no new volume (IsDraining) and its volumes are to move to the pool's other Stores
	// (not carried out yet: docs/design.md#data-mobility).
	// +optional
	Evacuate bool `json:"evacuate,omitempty"`
	// MaxParallelMoves is the pool's maxParallelMovesPerStore: how many volume moves this
	// Store takes part in at once, as source or target (1 when unset).
	// +optional
	MaxParallelMoves int32 `json:"maxParallelMoves,omitempty"`
}

// Capacity is a store's capacity in bytes. Available is the one number every part uses:
// (total − reserve) × overcommitPercent/100 for thin backends, minus provisioned, never negative.
type Capacity struct {
	// Total is the physical size in bytes (VG size, thin pool data size, zpool size, filesystem size).
	Total int64 `json:"total"`
	// Allocatable is total − reserve in bytes, clamped at 0.
	Allocatable int64 `json:"allocatable"`
	// Provisioned is the sum of the sizes of the volumes in bytes (virtual sizes for thin).
	Provisioned int64 `json:"provisioned"`
	// Available is what a new volume may take, in bytes (snapshots subtracted for thin backends;
	// with an LVM cache, also no more than the volume whose cache still fits the cache space).
	Available int64 `json:"available"`
	// Snapshots is the space Plinth's snapshots of this Store hold, in bytes: snapshot files
	// (file), blocks mapped by thin snapshot LVs (LVM thin; shared with their origin until it
	// is overwritten), the zvols' usedbysnapshots (ZFS). Not part of provisioned.
	// +optional
	Snapshots int64 `json:"snapshots,omitempty"`
}

// CapacityText is a Store's capacity in binary units for people, as HumanBytes writes it
// ("931.5Gi"): kubectl's columns (CRD additionalPrinterColumns) print an integer as it is and
// have no format for bytes, so the agent writes these next to the bytes of Capacity, which
// stay the numbers every part uses.
type CapacityText struct {
	// Total is Capacity.Total, such as "100Gi".
	Total string `json:"total"`
	// Provisioned is Capacity.Provisioned.
	Provisioned string `json:"provisioned"`
	// Available is Capacity.Available.
	Available string `json:"available"`
}

// HumanBytes writes n bytes in the largest binary unit (Ki, Mi, Gi, Ti, Pi, Ei: powers of
// 1024, the suffixes of Kubernetes quantities) that leaves at least 1, truncated to one
// decimal and without a trailing ".0": 1536 → "1.5Ki", 1073741824 → "1Gi", 1023 → "1023",
// 0 → "0". Truncated, never rounded up, so an available size is never overstated. Negative
// n is written with a leading "-".
func HumanBytes(n int64) string {
	if n < 0 {
		if n == math.MinInt64 {
			return "-8Ei"
		}
		return "-" + HumanBytes(-n)
	}
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatInt(n, 10)
	}
	u, div := -1, int64(1)
	for u+1 < len(units) && n/div >= 1024 {
		u, div = u+1, div*1024
	}
	whole, tenths := n/div, int64(uint64(n%div)*10/uint64(div)) // uint64: (n%div)*10 passes 2^63 in Ei
	if tenths == 0 {
		return strconv.FormatInt(whole, 10) + string(units[u]) + "i"
	}
	return strconv.FormatInt(whole, 10) + "." + strconv.FormatInt(tenths, 10) + string(units[u]) + "i"
}

// CacheCapacity is the cache space of a Store whose volumes have a bcache cache (the LVM
// backend's cache.volumeGroup, the fast VG). Bytes.
type CacheCapacity struct {
	// Total is the fast VG's size in bytes.
	Total int64 `json:"total"`
	// Free is the fast VG's free space in bytes.
	Free int64 `json:"free"`
	// Provisioned is the sum of the sizes of the volumes' cache LVs in bytes.
	Provisioned int64 `json:"provisioned"`
	// RatioPercent is each cache's size in percent of its volume's size.
	RatioPercent int32 `json:"ratioPercent"`
}

// ThinUsage is how full a thin pool is, as lvs(8) data_percent and metadata_percent report it.
type ThinUsage struct {
	// DataPercent is the used share of the thin pool's data, "0.00"–"100.00".
	DataPercent string `json:"dataPercent"`
	// MetadataPercent is the used share of the thin pool's metadata, "0.00"–"100.00".
	MetadataPercent string `json:"metadataPercent"`
}

// DriftItem is one difference between the declaration and what the agent sees.
type DriftItem struct {
	// Kind of the drifted thing: LogicalVolume, Zvol, Export, VolumeGroup, ThinPool.
	Kind string `json:"kind"`
	// Name of the drifted thing (LV name, NQN, ...).
	Name string `json:"name"`
	// Reason is a PascalCase reason such as Missing, Resized, Orphan.
	Reason string `json:"reason"`
	// Message says what differs.
	// +optional
	Message string `json:"message,omitempty"`
}

// MaxUnclaimed bounds StoreStatus.Unclaimed: at about 330 bytes an entry, 2000 keep a Store
// under 1 MiB, inside etcd's 1.5 MiB request limit.
const MaxUnclaimed = 2000

// UnclaimedVolume is a backend volume of a Store that no VolumeState names, as the agent
// scanned it (read only: the agent writes nothing to it).
type UnclaimedVolume struct {
	// VolumeID is the CSI volume id the backend object's name derives from.
	VolumeID string `json:"volumeID"`
	// SizeBytes is the backend object's size in bytes.
	SizeBytes int64 `json:"sizeBytes"`
	// Stamp is its identity stamp in one line (internal/identity Stamp.Line); empty when it
	// has none or it is unreadable.
	// +optional
	Stamp string `json:"stamp,omitempty"`
	// StampError says why the stamp is unreadable (torn, unknown version).
	// +optional
	StampError string `json:"stampError,omitempty"`
}

// StoreStatus is written by the node agent.
type StoreStatus struct {
	// ObservedGeneration is the metadata.generation the agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions hold Ready, Reconciling, Stalled and Drifted.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Capacity in bytes.
	// +optional
	Capacity *Capacity `json:"capacity,omitempty"`
	// CapacityText is Capacity in binary units (HumanBytes), for kubectl's columns.
	// +optional
	CapacityText *CapacityText `json:"capacityText,omitempty"`
	// Thin is the thin pool usage, for thin backends.
	// +optional
	Thin *ThinUsage `json:"thin,omitempty"`
	// Cache is the cache space (the fast VG) of an LVM backend with a bcache cache; capacity
	// above is the volumes' (slow) VG.
	// +optional
	Cache *CacheCapacity `json:"cache,omitempty"`
	// ExtentBytes is the allocation unit volumes round up to (LVM extent size, zvol
	// volblocksize, 1 MiB for files).
	// +optional
	ExtentBytes int64 `json:"extentBytes,omitempty"`
	// Drift lists what differs between declaration and kernel.
	// +optional
	Drift []DriftItem `json:"drift,omitempty"`
	// Unclaimed lists the volumes of this Store that no VolumeState names, sorted by volume
	// id, with their identity stamps: what `plinth adopt` re-adopts after the control plane
	// is lost (docs/design.md "Re-adopting volumes"). At most MaxUnclaimed entries;
	// UnclaimedOmitted counts the rest.
	// +optional
	// +kubebuilder:validation:MaxItems=2000
	Unclaimed []UnclaimedVolume `json:"unclaimed,omitempty"`
	// UnclaimedOmitted is the number of unclaimed volumes beyond MaxUnclaimed not listed.
	// +optional
	UnclaimedOmitted int32 `json:"unclaimedOmitted,omitempty"`
	// LastHeartbeatTime is when the agent last refreshed this status.
	// +optional
	LastHeartbeatTime *metav1.Time `json:"lastHeartbeatTime,omitempty"`
}

// Store is one pool on one node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=plinth
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.capacityText.total`
// +kubebuilder:printcolumn:name="Provisioned",type=string,JSONPath=`.status.capacityText.provisioned`
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.capacityText.available`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Available bytes",type=integer,JSONPath=`.status.capacity.available`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Store struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   StoreSpec   `json:"spec"`
	Status StoreStatus `json:"status,omitempty"`
}

// StoreList is a list of Stores.
//
// +kubebuilder:object:root=true
type StoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Store `json:"items"`
}

// GetConditions returns the status conditions.
func (in *Store) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *Store) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }
