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

// ExistingVolumes says what happens to a Placement's existing volumes when its poolRef changes.
// +kubebuilder:validation:Enum=Stay;Move
type ExistingVolumes string

const (
	// ExistingVolumesStay leaves existing volumes in the pool they were made in (their policy
	// is frozen at creation); only new volumes go to the new pool. The default.
	ExistingVolumesStay ExistingVolumes = "Stay"
	// ExistingVolumesMove moves each existing volume of the Placement to a Store of its new
	// pool when poolRef changes: plinth diff shows the plan, the move executor (CSI
	// controller) carries out the moves to a Store of the volume's own node; moves between
	// nodes are not carried out yet (docs/design.md#data-mobility).
	ExistingVolumesMove ExistingVolumes = "Move"
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

// The filesystem options' allow-lists of the policy schema (#Filesystem in schema/cue/policy.cue,
// whose tables these expressions are computed from; schema/cue's TestCRDOptionRulesAgree holds
// them equal), so that the API server refuses what plinth vet refuses; vet names the argument.
// +kubebuilder:validation:XValidation:rule=`!has(self.filesystem) || !has(self.filesystem.mkfsOptions) || self.filesystem.mkfsOptions.all(a, a != '' && !a.contains(' ')) && self.filesystem.mkfsOptions.join(' ').matches((has(self.filesystem.fsType) && self.filesystem.fsType == 'xfs') ? '^((-K|-q|-L ?([A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,11})|-b ?(size=(512|1024|2048|4096|8192|16384|32768|65536))|-d ?((agcount=[0-9]{1,10}|agsize=[0-9]{1,12}[kmgtKMGT]?|su=[0-9]{1,12}[kmgtKMGT]?|sw=[0-9]{1,10}|sunit=[0-9]{1,10}|swidth=[0-9]{1,10}|noalign|cowextsize=[0-9]{1,10}|extszinherit=[0-9]{1,10}|projinherit=[0-9]{1,10}|concurrency=[0-9]{1,10})(,(agcount=[0-9]{1,10}|agsize=[0-9]{1,12}[kmgtKMGT]?|su=[0-9]{1,12}[kmgtKMGT]?|sw=[0-9]{1,10}|sunit=[0-9]{1,10}|swidth=[0-9]{1,10}|noalign|cowextsize=[0-9]{1,10}|extszinherit=[0-9]{1,10}|projinherit=[0-9]{1,10}|concurrency=[0-9]{1,10}))*)|-i ?((size=(256|512|1024|2048)|maxpct=[0-9]{1,10}|(align|sparse|projid32bit|nrext64)=[01]|attr=2)(,(size=(256|512|1024|2048)|maxpct=[0-9]{1,10}|(align|sparse|projid32bit|nrext64)=[01]|attr=2))*)|-l ?((size=[0-9]{1,12}[kmgtKMGT]?|version=2|sunit=[0-9]{1,10}|su=[0-9]{1,12}[kmgtKMGT]?|lazy-count=[01]|internal(=1)?)(,(size=[0-9]{1,12}[kmgtKMGT]?|version=2|sunit=[0-9]{1,10}|su=[0-9]{1,12}[kmgtKMGT]?|lazy-count=[01]|internal(=1)?))*)|-m ?(((crc|finobt|rmapbt|reflink|inobtcount|bigtime)=[01])(,((crc|finobt|rmapbt|reflink|inobtcount|bigtime)=[01]))*)|-n ?((size=(512|1024|2048|4096|8192|16384|32768|65536)|version=(2|ci)|ftype=1|parent=[01])(,(size=(512|1024|2048|4096|8192|16384|32768|65536)|version=(2|ci)|ftype=1|parent=[01]))*)|-s ?(size=(512|1024|2048|4096|8192|16384|32768)))( (-K|-q|-L ?([A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,11})|-b ?(size=(512|1024|2048|4096|8192|16384|32768|65536))|-d ?((agcount=[0-9]{1,10}|agsize=[0-9]{1,12}[kmgtKMGT]?|su=[0-9]{1,12}[kmgtKMGT]?|sw=[0-9]{1,10}|sunit=[0-9]{1,10}|swidth=[0-9]{1,10}|noalign|cowextsize=[0-9]{1,10}|extszinherit=[0-9]{1,10}|projinherit=[0-9]{1,10}|concurrency=[0-9]{1,10})(,(agcount=[0-9]{1,10}|agsize=[0-9]{1,12}[kmgtKMGT]?|su=[0-9]{1,12}[kmgtKMGT]?|sw=[0-9]{1,10}|sunit=[0-9]{1,10}|swidth=[0-9]{1,10}|noalign|cowextsize=[0-9]{1,10}|extszinherit=[0-9]{1,10}|projinherit=[0-9]{1,10}|concurrency=[0-9]{1,10}))*)|-i ?((size=(256|512|1024|2048)|maxpct=[0-9]{1,10}|(align|sparse|projid32bit|nrext64)=[01]|attr=2)(,(size=(256|512|1024|2048)|maxpct=[0-9]{1,10}|(align|sparse|projid32bit|nrext64)=[01]|attr=2))*)|-l ?((size=[0-9]{1,12}[kmgtKMGT]?|version=2|sunit=[0-9]{1,10}|su=[0-9]{1,12}[kmgtKMGT]?|lazy-count=[01]|internal(=1)?)(,(size=[0-9]{1,12}[kmgtKMGT]?|version=2|sunit=[0-9]{1,10}|su=[0-9]{1,12}[kmgtKMGT]?|lazy-count=[01]|internal(=1)?))*)|-m ?(((crc|finobt|rmapbt|reflink|inobtcount|bigtime)=[01])(,((crc|finobt|rmapbt|reflink|inobtcount|bigtime)=[01]))*)|-n ?((size=(512|1024|2048|4096|8192|16384|32768|65536)|version=(2|ci)|ftype=1|parent=[01])(,(size=(512|1024|2048|4096|8192|16384|32768|65536)|version=(2|ci)|ftype=1|parent=[01]))*)|-s ?(size=(512|1024|2048|4096|8192|16384|32768))))*)?$' : '^((-D|-j|-q|-v|-C ?([0-9]{1,12}[kmgtKMGT]?)|-E ?((mmp_update_interval=[0-9]{1,10}|stride=[0-9]{1,10}|stripe[-_]width=[0-9]{1,10}|resize=[0-9]{1,10}|lazy_itable_init(=[01])?|lazy_journal_init(=[01])?|num_backup_sb=[012]|root_owner(=[0-9]{1,10}:[0-9]{1,10})?|packed_meta_blocks(=[01])?|discard|nodiscard|quotatype=(usrquota|grpquota|prjquota)(:(usrquota|grpquota|prjquota))*|encoding=utf8(-12\\.1)?|encoding_flags=strict|orphan_file_size=[0-9]{1,12}[kmgtKMGT]?|assume_storage_prezeroed(=[01])?|no_copy_xattrs)(,(mmp_update_interval=[0-9]{1,10}|stride=[0-9]{1,10}|stripe[-_]width=[0-9]{1,10}|resize=[0-9]{1,10}|lazy_itable_init(=[01])?|lazy_journal_init(=[01])?|num_backup_sb=[012]|root_owner(=[0-9]{1,10}:[0-9]{1,10})?|packed_meta_blocks(=[01])?|discard|nodiscard|quotatype=(usrquota|grpquota|prjquota)(:(usrquota|grpquota|prjquota))*|encoding=utf8(-12\\.1)?|encoding_flags=strict|orphan_file_size=[0-9]{1,12}[kmgtKMGT]?|assume_storage_prezeroed(=[01])?|no_copy_xattrs))*)|-G ?([0-9]{1,10})|-I ?((128|256|512|1024|2048|4096))|-J ?((size=[0-9]{1,10}|fast_commit_size=[0-9]{1,10}|location=[0-9]{1,12}[kmgtKMGT]?)(,(size=[0-9]{1,10}|fast_commit_size=[0-9]{1,10}|location=[0-9]{1,12}[kmgtKMGT]?))*)|-L ?([A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,15})|-N ?([0-9]{1,10})|-O ?((\\^?(64bit|bigalloc|casefold|dir_index|dir_nlink|ea_inode|encrypt|ext_attr|extent|extents|extra_isize|fast_commit|filetype|flex_bg|has_journal|huge_file|inline_data|large_dir|large_file|metadata_csum|metadata_csum_seed|meta_bg|mmp|orphan_file|project|quota|resize_inode|sparse_super|sparse_super2|stable_inodes|uninit_bg|verity))(,(\\^?(64bit|bigalloc|casefold|dir_index|dir_nlink|ea_inode|encrypt|ext_attr|extent|extents|extra_isize|fast_commit|filetype|flex_bg|has_journal|huge_file|inline_data|large_dir|large_file|metadata_csum|metadata_csum_seed|meta_bg|mmp|orphan_file|project|quota|resize_inode|sparse_super|sparse_super2|stable_inodes|uninit_bg|verity)))*)|-T ?((default|floppy|small|big|huge|news|largefile|largefile4|hurd)(,(default|floppy|small|big|huge|news|largefile|largefile4|hurd))*)|-b ?((1024|2048|4096|8192|16384|32768|65536))|-e ?((continue|remount-ro))|-g ?([0-9]{1,10})|-i ?([0-9]{1,10})|-m ?(([0-9]|[1-4][0-9]|50)(\\.[0-9]{1,3})?))( (-D|-j|-q|-v|-C ?([0-9]{1,12}[kmgtKMGT]?)|-E ?((mmp_update_interval=[0-9]{1,10}|stride=[0-9]{1,10}|stripe[-_]width=[0-9]{1,10}|resize=[0-9]{1,10}|lazy_itable_init(=[01])?|lazy_journal_init(=[01])?|num_backup_sb=[012]|root_owner(=[0-9]{1,10}:[0-9]{1,10})?|packed_meta_blocks(=[01])?|discard|nodiscard|quotatype=(usrquota|grpquota|prjquota)(:(usrquota|grpquota|prjquota))*|encoding=utf8(-12\\.1)?|encoding_flags=strict|orphan_file_size=[0-9]{1,12}[kmgtKMGT]?|assume_storage_prezeroed(=[01])?|no_copy_xattrs)(,(mmp_update_interval=[0-9]{1,10}|stride=[0-9]{1,10}|stripe[-_]width=[0-9]{1,10}|resize=[0-9]{1,10}|lazy_itable_init(=[01])?|lazy_journal_init(=[01])?|num_backup_sb=[012]|root_owner(=[0-9]{1,10}:[0-9]{1,10})?|packed_meta_blocks(=[01])?|discard|nodiscard|quotatype=(usrquota|grpquota|prjquota)(:(usrquota|grpquota|prjquota))*|encoding=utf8(-12\\.1)?|encoding_flags=strict|orphan_file_size=[0-9]{1,12}[kmgtKMGT]?|assume_storage_prezeroed(=[01])?|no_copy_xattrs))*)|-G ?([0-9]{1,10})|-I ?((128|256|512|1024|2048|4096))|-J ?((size=[0-9]{1,10}|fast_commit_size=[0-9]{1,10}|location=[0-9]{1,12}[kmgtKMGT]?)(,(size=[0-9]{1,10}|fast_commit_size=[0-9]{1,10}|location=[0-9]{1,12}[kmgtKMGT]?))*)|-L ?([A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,15})|-N ?([0-9]{1,10})|-O ?((\\^?(64bit|bigalloc|casefold|dir_index|dir_nlink|ea_inode|encrypt|ext_attr|extent|extents|extra_isize|fast_commit|filetype|flex_bg|has_journal|huge_file|inline_data|large_dir|large_file|metadata_csum|metadata_csum_seed|meta_bg|mmp|orphan_file|project|quota|resize_inode|sparse_super|sparse_super2|stable_inodes|uninit_bg|verity))(,(\\^?(64bit|bigalloc|casefold|dir_index|dir_nlink|ea_inode|encrypt|ext_attr|extent|extents|extra_isize|fast_commit|filetype|flex_bg|has_journal|huge_file|inline_data|large_dir|large_file|metadata_csum|metadata_csum_seed|meta_bg|mmp|orphan_file|project|quota|resize_inode|sparse_super|sparse_super2|stable_inodes|uninit_bg|verity)))*)|-T ?((default|floppy|small|big|huge|news|largefile|largefile4|hurd)(,(default|floppy|small|big|huge|news|largefile|largefile4|hurd))*)|-b ?((1024|2048|4096|8192|16384|32768|65536))|-e ?((continue|remount-ro))|-g ?([0-9]{1,10})|-i ?([0-9]{1,10})|-m ?(([0-9]|[1-4][0-9]|50)(\\.[0-9]{1,3})?)))*)?$')`,message="filesystem.mkfsOptions: an argument is not one Plinth passes to mkfs.<fsType> in the shape allowed (one argument per element; plinth vet names it and the rule)"
// +kubebuilder:validation:XValidation:rule=`!has(self.filesystem) || !has(self.filesystem.mountOptions) || self.filesystem.mountOptions.all(o, o.matches((has(self.filesystem.fsType) && self.filesystem.fsType == 'xfs') ? '^(async|sync|dirsync|atime|noatime|diratime|nodiratime|relatime|norelatime|strictatime|nostrictatime|lazytime|nolazytime|exec|noexec|nosuid|nodev|ro|rw|iversion|noiversion|nosymfollow|silent|loud|attr2|noattr2|discard|nodiscard|grpid|bsdgroups|nogrpid|sysvgroups|filestreams|ikeep|noikeep|inode32|inode64|largeio|nolargeio|noalign|nouuid|noquota|uquota|usrquota|quota|uqnoenforce|qnoenforce|gquota|grpquota|gqnoenforce|pquota|prjquota|pqnoenforce|swalloc|wsync|dax|allocsize=([0-9]{1,12}[kmgtKMGT]?)|dax=((always|never|inode))|logbsize=((16384|32768|65536|131072|262144|16k|32k|64k|128k|256k))|logbufs=([2-8])|sunit=([0-9]{1,10})|swidth=([0-9]{1,10}))$' : '^(async|sync|dirsync|atime|noatime|diratime|nodiratime|relatime|norelatime|strictatime|nostrictatime|lazytime|nolazytime|exec|noexec|nosuid|nodev|ro|rw|iversion|noiversion|nosymfollow|silent|loud|journal_checksum|nojournal_checksum|journal_async_commit|barrier|nobarrier|delalloc|nodelalloc|auto_da_alloc|noauto_da_alloc|noinit_itable|init_itable|discard|nodiscard|block_validity|noblock_validity|dioread_lock|dioread_nolock|i_version|nombcache|prjquota|grpquota|usrquota|quota|noquota|acl|noacl|user_xattr|bsddf|minixdf|grpid|bsdgroups|nogrpid|sysvgroups|oldalloc|orlov|dax|inlinecrypt|auto_da_alloc=([01])|barrier=([01])|commit=([0-9]{1,10})|data=((journal|ordered|writeback))|dax=((always|never|inode))|errors=((continue|remount-ro))|init_itable=([0-9]{1,10})|inode_readahead_blks=([0-9]{1,10})|journal_ioprio=([0-7])|max_batch_time=([0-9]{1,10})|max_dir_size_kb=([0-9]{1,10})|min_batch_time=([0-9]{1,10})|resgid=([0-9]{1,10})|resuid=([0-9]{1,10})|stripe=([0-9]{1,10}))$'))`,message="filesystem.mountOptions: an option is not one Plinth passes to <fsType> in the shape allowed (suid, dev, bind, remount, x-*, helper= and errors=panic are refused; plinth vet names it and the rule)"
// +kubebuilder:validation:XValidation:rule=`!has(self.filesystem) || !has(self.filesystem.mountOptions) || !('exec' in self.filesystem.mountOptions && 'noexec' in self.filesystem.mountOptions) && !('ro' in self.filesystem.mountOptions && 'rw' in self.filesystem.mountOptions)`,message="filesystem.mountOptions: exec and noexec, or ro and rw, contradict each other"
// +kubebuilder:validation:XValidation:rule="!has(self.encryption) || !has(self.encryption.keySecret) || self.encryption.keySecret.namespace != 'plinth-keys'",message="encryption.keySecret.namespace: plinth-keys holds Plinth's own volume keys only (plinth vet says the same)"

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
	// ExistingVolumes is Stay (default: a change of poolRef applies to new volumes only) or
	// Move (the existing volumes of this Placement follow a change of poolRef: plinth diff
	// plans a move of each to a Store of the new pool, carried out within a node).
	// Unset is Stay; no API-server default, so that objects stored before the field existed
	// read back unchanged after a CRD upgrade.
	// +optional
	ExistingVolumes ExistingVolumes `json:"existingVolumes,omitempty"`
	// SpreadAcross is a node label key, such as topology.kubernetes.io/zone: the volumes of one
	// workload (the pods of one controller, such as a StatefulSet or ReplicaSet; a pod without
	// one is its own workload) are spread across the label's values, at most one volume apart,
	// and never placed on a node without the label. With a local Protocol plinth-scheduler
	// spreads them (volumeBindingMode must be WaitForFirstConsumer); with NVMe-oF CreateVolume
	// spreads them across the storage nodes (either binding mode). Rendered as the StorageClass
	// parameter plinth.dev/spread-across, so a change replaces the class (see
	// storageClass.replacement).
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
	// AttributesClasses are the tiers the claims of this placement may use: each renders a
	// VolumeAttributesClass (storage.k8s.io/v1, driverName csi.plinth.dev) of its name, which a
	// PVC names in spec.volumeAttributesClassName at creation or later (csi-resizer then calls
	// ControllerModifyVolume: the limits change live, the pod is not restarted). A claim of
	// another placement naming one of these classes is refused (INVALID_ARGUMENT). A claim
	// without a class has no limits. At most 32.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	AttributesClasses []AttributesClassTemplate `json:"attributesClasses,omitempty"`
	// Encryption, when set, encrypts every new volume of the placement with LUKS2 (dm-crypt)
	// opened on the node that consumes it, so an NVMe-oF volume is ciphertext on the storage
	// node and on the wire (docs/design.md#volume-encryption). It is frozen into each volume at
	// creation: removing it later leaves existing volumes encrypted.
	// +optional
	Encryption *Encryption `json:"encryption,omitempty"`
}

// EncryptionProvider is the on-disk format of encrypted volumes.
// +kubebuilder:validation:Enum=LUKS2
type EncryptionProvider string

// EncryptionLUKS2 is LUKS2 through cryptsetup(8) (luksFormat --type luks2) on dm-crypt.
const EncryptionLUKS2 EncryptionProvider = "LUKS2"

// Encryption is how a Placement's volumes are encrypted.
// +kubebuilder:validation:XValidation:rule="!has(self.keyGeneration) || self.keyGeneration == 0 || !has(self.keySecret)",message="encryption.keyGeneration rotates the per-volume keys Plinth generates: with keySecret, rotate your Secret by writing key-previous (the old passphrase) and key (plinth vet says the same)"
type Encryption struct {
	// Provider is LUKS2 (the only one; empty means LUKS2).
	// +optional
	Provider EncryptionProvider `json:"provider,omitempty"`
	// Cipher is the dm-crypt cipher: aes-xts-plain64 (the only one; empty means it).
	// +optional
	// +kubebuilder:validation:Enum=aes-xts-plain64
	Cipher string `json:"cipher,omitempty"`
	// KeySize is the volume key's size in bits: 512 (default; AES-256 in XTS mode) or 256
	// (AES-128).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == 256 || self == 512",message="keySize: 256 or 512 (bits)"
	// +kubebuilder:default=512
	KeySize int32 `json:"keySize,omitempty"`
	// KeySecret names the operator's Secret (data key "key", at least 32 bytes) whose value
	// unlocks every volume of the class, in any namespace but plinth-keys. Absent (default):
	// the CSI controller generates one Secret per volume at CreateVolume (64 random bytes) in
	// the key namespace, plinth-keys. Either way kubelet hands the Secret to NodeStage (the
	// StorageClass's node-stage secret).
	// +optional
	KeySecret *SecretReference `json:"keySecret,omitempty"`
	// KeyGeneration rotates the per-volume keys: raising it in Git makes the CSI controller
	// write a new random passphrase into the key Secret of every volume of the placement (the
	// old one kept as key-previous until the volume's header no longer holds it), and the node
	// that opens the volume re-wraps its LUKS2 header: a keyslot for the new passphrase added,
	// the old one removed. The volume key stays, so no data is re-encrypted and nothing is
	// unmounted (docs/design.md#volume-key-rotation). Lowering it does nothing. Only with
	// per-volume keys (no keySecret). Default 0; at most 2^31-1.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	KeyGeneration int64 `json:"keyGeneration,omitempty"`
}

// SecretReference names a Secret.
type SecretReference struct {
	// Name of the Secret (DNS-1123 subdomain).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
	// Namespace of the Secret (DNS-1123 label).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`
}

// AttributesClassTemplate is one tier of a Placement: a VolumeAttributesClass and the limits it
// sets on the volumes of its claims.
type AttributesClassTemplate struct {
	// Name of the VolumeAttributesClass (DNS-1123 subdomain, at most 253 bytes), unique among
	// all Placements' classes.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
	// Limits cap the I/O of the pods that consume a volume of the class, on the node that
	// runs them (docs/design.md#qos).
	Limits IOLimits `json:"limits"`
}

// The bounds of IOLimits' fields: 0 or less is no rate at all (a limit of 0 would stop the
// volume, and the kernel reads 0 as "no limit"), and nothing beyond these is a rate a block
// device reaches.
const (
	// MaxIOPSLimit bounds readIOPS and writeIOPS (operations per second).
	MaxIOPSLimit = 100_000_000
	// MinBytesPerSecondLimit is one 512-byte sector per second.
	MinBytesPerSecondLimit = 512
	// MaxBytesPerSecondLimit is 1 PiB per second.
	MaxBytesPerSecondLimit = 1 << 50
)

// IOLimits are the rates the node plugin writes into the consuming pod's cgroup for the
// volume's block device: blkio.throttle.{read,write}_{iops,bps}_device on cgroup v1, io.max
// (riops, wiops, rbps, wbps) on cgroup v2 (Linux Documentation/admin-guide/cgroup-v1/blkio-
// controller.rst and cgroup-v2.rst). A field left out is not limited; at least one is set.
// +kubebuilder:validation:XValidation:rule=`has(self.readIOPS) || has(self.writeIOPS) || has(self.readBytesPerSecond) || has(self.writeBytesPerSecond)`,message="limits: set at least one of readIOPS, writeIOPS, readBytesPerSecond, writeBytesPerSecond (a claim without a class is unlimited)"
type IOLimits struct {
	// ReadIOPS is the most read operations per second, 1 to 100000000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000000
	ReadIOPS *int64 `json:"readIOPS,omitempty"`
	// WriteIOPS is the most write operations per second, 1 to 100000000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000000
	WriteIOPS *int64 `json:"writeIOPS,omitempty"`
	// ReadBytesPerSecond is the most bytes read per second, 512 to 2^50.
	// +optional
	// +kubebuilder:validation:Minimum=512
	// +kubebuilder:validation:Maximum=1125899906842624
	ReadBytesPerSecond *int64 `json:"readBytesPerSecond,omitempty"`
	// WriteBytesPerSecond is the most bytes written per second, 512 to 2^50.
	// +optional
	// +kubebuilder:validation:Minimum=512
	// +kubebuilder:validation:Maximum=1125899906842624
	WriteBytesPerSecond *int64 `json:"writeBytesPerSecond,omitempty"`
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

// OverrideValueMaxBytes bounds the value of each override annotation. The options end up in
// one mount(2) data page (4096 bytes) beside the class's own and those kubelet and Plinth add,
// and are copied into the VolumeState and the volume context of every volume; any useful list
// of the allowed options is far shorter. A longer value is refused before it is parsed.
const OverrideValueMaxBytes = 1024

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
	// Group also renders a VolumeGroupSnapshotClass (groupsnapshot.storage.k8s.io/v1) of the
	// same name, deletion policy and default mark
	// (groupsnapshot.storage.kubernetes.io/is-default-class), for VolumeGroupSnapshots of the
	// placement's volumes; the cluster needs external-snapshotter's group snapshot CRDs.
	// Default false.
	// +optional
	// +kubebuilder:default=false
	Group bool `json:"group,omitempty"`
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
	// MkfsOptions are extra arguments to mkfs.<fsType>, at most 32 of at most 256 characters:
	// each a flag the policy schema allows for fsType (mke2fs(8), mkfs.xfs(8)), the value of the
	// flag before it, or a one-letter flag with its value attached. Nothing else reaches mkfs.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=256
	MkfsOptions []string `json:"mkfsOptions,omitempty"`
	// MountOptions are mount options, also written to the StorageClass, at most 32 of at most
	// 256 characters, one per element: those of mount(8), ext4(5) or xfs(5) the policy schema
	// allows for fsType; suid, dev, bind, remount, x-*, helper= and errors=panic are refused, and
	// an option after its contrary (exec after noexec, rw after ro, and back).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=256
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
