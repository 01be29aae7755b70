package v1alpha1

// Default values of the policy API. The CRD markers, the CUE schema and these functions state
// the same defaults; schema/cue's agreement test and schema/vet's decode test hold them equal.
const (
	DefaultThinPoolSizePercent = 90
	DefaultVolBlockSize        = "16K"
	DefaultNVMeoFPort          = 4420
	DefaultReclaimPolicy       = "Delete"
	DefaultVolumeBindingMode   = "WaitForFirstConsumer"
	DefaultFSType              = "ext4"
	DefaultPartitioning        = PartitioningGPT
	DefaultCipher              = "aes-xts-plain64"
	DefaultKeySize             = 512
)

// Default fills the unset fields of a StoragePool with their defaults.
func (in *StoragePool) Default() {
	if in.Spec.DriftPolicy == "" {
		in.Spec.DriftPolicy = DriftPolicyReport
	}
	if l := in.Spec.Backend.LVM; l != nil && l.ThinPool != nil && l.ThinPool.SizePercent == 0 {
		l.ThinPool.SizePercent = DefaultThinPoolSizePercent
	}
	if z := in.Spec.Backend.ZFS; z != nil && z.VolBlockSize == "" {
		z.VolBlockSize = DefaultVolBlockSize
	}
	if r := in.Spec.Backend.Raw; r != nil && r.Partitioning == "" {
		r.Partitioning = DefaultPartitioning
	}
}

// Default fills the unset fields of a Protocol with their defaults.
func (in *Protocol) Default() {
	if n := in.Spec.NVMeoFTCP; n != nil {
		if n.Port == 0 {
			n.Port = DefaultNVMeoFPort
		}
		if n.ACL == nil {
			acl := true
			n.ACL = &acl
		}
	}
}

// Default fills the unset fields of a Placement with their defaults.
func (in *Placement) Default() {
	sc := &in.Spec.StorageClass
	if sc.ReclaimPolicy == "" {
		sc.ReclaimPolicy = DefaultReclaimPolicy
	}
	if sc.VolumeBindingMode == "" {
		sc.VolumeBindingMode = DefaultVolumeBindingMode
	}
	if sc.Replacement == "" {
		sc.Replacement = ReplacementNever
	}
	if in.Spec.Filesystem.FSType == "" {
		in.Spec.Filesystem.FSType = DefaultFSType
	}
	if e := in.Spec.Encryption; e != nil {
		if e.KeySize == 0 {
			e.KeySize = DefaultKeySize
		}
	}
	if in.Spec.Strategy == "" {
		in.Spec.Strategy = StrategyBinpack
	}
	if s := in.Spec.SnapshotClass; s != nil && s.DeletionPolicy == "" {
		s.DeletionPolicy = DefaultReclaimPolicy // Delete, like reclaimPolicy
	}
}
