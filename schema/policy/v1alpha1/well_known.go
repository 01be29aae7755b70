package v1alpha1

// Labels Plinth puts on what it renders; they name the policy objects that produced it.
const (
	// LabelPool names the StoragePool (on Stores, Agents' stores, VolumeStates, StorageClasses).
	LabelPool = "plinth.dev/pool"
	// LabelPlacement names the Placement (on StorageClasses).
	LabelPlacement = "plinth.dev/placement"
	// LabelProtocol names the Protocol (on StorageClasses).
	LabelProtocol = "plinth.dev/protocol"
	// LabelNode names the Node (on Stores, Agents and VolumeStates).
	LabelNode = "plinth.dev/node"
	// LabelWorkload holds, on the VolumeStates of a Placement with spreadAcross and an
	// NVMe-oF Protocol, the UID of the claim's workload (its StatefulSet, its pod's controller,
	// or the claim itself; see csi/controller spread.go): CreateVolume counts them per domain.
	LabelWorkload = "plinth.dev/workload"
	// LabelManagedBy is app.kubernetes.io/managed-by, set to "plinth".
	LabelManagedBy = "app.kubernetes.io/managed-by"
)

// StorageClass parameters written by render and read by the CSI controller.
const (
	ParamPlacement = "plinth.dev/placement"
	ParamPool      = "plinth.dev/pool"
	ParamProtocol  = "plinth.dev/protocol"
	// ParamFSType is the parameter external-provisioner passes as the volume's fsType.
	ParamFSType = "csi.storage.k8s.io/fstype"
	// ParamSpreadAcross is the Placement's spreadAcross (a node label key), present only when
	// set. The scheduler plugin (local volumes) and CreateVolume (NVMe-oF volumes, from the
	// Placement itself) spread the volumes of one workload across the label's values; being a
	// parameter, it is immutable for the class's lifetime.
	ParamSpreadAcross = "plinth.dev/spread-across"
	// ParamNodeStageSecretName and ParamNodeStageSecretNamespace name the Secret kubelet
	// hands to NodeStage (CSI's node-stage secret, resolved by external-provisioner into
	// the PV's nodeStageSecretRef): the key of an encrypted volume. external-provisioner
	// strips them before CreateVolume.
	ParamNodeStageSecretName      = "csi.storage.k8s.io/node-stage-secret-name"
	ParamNodeStageSecretNamespace = "csi.storage.k8s.io/node-stage-secret-namespace"
	// ParamNodePublishSecretName and ParamNodePublishSecretNamespace name the Secret kubelet
	// hands to NodePublishVolume (the PV's nodePublishSecretRef): the same key Secret, read
	// afresh at every republish, so that a key rotation reaches staged volumes.
	ParamNodePublishSecretName      = "csi.storage.k8s.io/node-publish-secret-name"
	ParamNodePublishSecretNamespace = "csi.storage.k8s.io/node-publish-secret-namespace"
	// ParamFreezeTimeoutSeconds is the VolumeGroupSnapshotClass parameter that bounds the consumers' filesystem freeze of a group snapshot that needs one: an
	// integer of seconds, 1 to 300; absent: DefaultFreezeTimeoutSeconds.
	ParamFreezeTimeoutSeconds = "plinth.dev/freeze-timeout-seconds"
)

// DefaultFreezeTimeoutSeconds bounds a group snapshot's consumer freeze when its class names
// no ParamFreezeTimeoutSeconds.
const DefaultFreezeTimeoutSeconds = 30

// Volume keys of encrypted Placements (docs/design.md#volume-encryption).
const (
	// VolumeKeyNamespace is the namespace of the per-volume (and per-snapshot) key Secrets,
	// and of nothing else: the CSI controller may create and read Secrets there and nowhere
	// else (it copies a source's key into a restore's), so reading there yields volume keys
	// only. The shipped manifests and the chart create it (the chart's does not follow the
	// release namespace).
	VolumeKeyNamespace = "plinth-keys"
	// VolumeKeyPrefix starts the name of a per-volume key Secret; the PV name follows.
	VolumeKeyPrefix = "plinth-luks-"
	// VolumeKeyData is the Secret data key that holds the passphrase: printable (hex), since
	// kubelet hands Secret values to the CSI driver as protobuf strings, which are UTF-8.
	VolumeKeyData = "key"
	// VolumeKeyPreviousData is the Secret data key that holds the passphrase VolumeKeyData
	// replaced in a key rotation, until no keyslot of the volume's header uses it.
	VolumeKeyPreviousData = "key-previous"
	// VolumeKeyGenerationData is the Secret data key that holds the key generation of
	// VolumeKeyData (decimal; absent: 0), so that the node plugin, which gets the Secret's data
	// only, can report the generation it re-wrapped to.
	VolumeKeyGenerationData = "generation"
	// VolumeKeyMinBytes is the shortest passphrase the node plugin accepts.
	VolumeKeyMinBytes = 32
)

// VolumeKeySecretRef returns the Secret that holds the key of the volume named pvName (the
// CSI name: the PV's name) under encryption e: the operator's (e.KeySecret) or the volume's
// own, VolumeKeyPrefix+pvName in VolumeKeyNamespace. Render passes "${pv.name}", the
// external-provisioner template of that name.
func VolumeKeySecretRef(e *Encryption, pvName string) SecretReference {
	if e.KeySecret != nil {
		return *e.KeySecret
	}
	return SecretReference{Name: VolumeKeyPrefix + pvName, Namespace: VolumeKeyNamespace}
}

const (
	// DriverName is the CSI driver name and StorageClass provisioner.
	DriverName = "csi.plinth.dev"
	// TopologyKeyNode is the CSI topology key of local volumes: the node name.
	TopologyKeyNode = "topology.plinth.dev/node"
	// LabelNVMeInitiator marks nodes whose nvme-tcp initiator works ("true").
	LabelNVMeInitiator = "plinth.dev/nvme-initiator"
	// AnnotationHostNQN holds a node's NVMe host NQN, from /etc/nvme/hostnqn.
	AnnotationHostNQN = "plinth.dev/host-nqn"
	// AnnotationMaxVolumes holds the most volumes that may be published to a node at once (a
	// positive decimal, the node plugin's --max-volumes-per-node); absent: no limit.
	AnnotationMaxVolumes = "plinth.dev/max-volumes-per-node"
	// FinalizerInUse keeps a Placement whose StorageClass is still used.
	FinalizerInUse = "plinth.dev/in-use"
)
