package volume

// Keys of the volume context (CreateVolume → PV volumeAttributes → NodeStage) and of the
// publish context (ControllerPublish → NodeStage/NodePublish).
const (
	// ContextKind is the protocol kind: "local" or "nvmeofTcp" (both contexts).
	ContextKind = "plinth.dev/protocol-kind"
	// ContextFSType is the filesystem the placement asked for (ext4, xfs).
	ContextFSType = "plinth.dev/fstype"
	// ContextMkfsOptions and ContextMountOptions are JSON lists of strings from the placement.
	ContextMkfsOptions  = "plinth.dev/mkfs-options"
	ContextMountOptions = "plinth.dev/mount-options"
	// ContextEncryption is "LUKS2" for an encrypted volume (absent: clear); ContextCipher and
	// ContextKeySize (bits) are its format parameters, ContextKeySecret the "namespace/name"
	// of the Secret kubelet hands to NodeStage (named in errors; never the key itself).
	ContextEncryption = "plinth.dev/encryption"
	ContextCipher     = "plinth.dev/cipher"
	ContextKeySize    = "plinth.dev/key-size"
	ContextKeySecret  = "plinth.dev/key-secret"
	// PublishDevicePath is the local block device (local volumes).
	PublishDevicePath = "devicePath"
	// PublishNQN, PublishAddress and PublishPort locate an NVMe-oF/TCP export.
	PublishNQN     = "nqn"
	PublishAddress = "address"
	PublishPort    = "port"
	// PublishCtrlLossTmo and PublishReconnectDelay carry the frozen protocol's timers (seconds).
	PublishCtrlLossTmo    = "ctrlLossTmo"
	PublishReconnectDelay = "reconnectDelay"
	// PublishQueueSize carries the frozen protocol's maxQueueSize: the I/O queue depth the node
	// connects with (queue_size, nvme connect --queue-size).
	PublishQueueSize = "queueSize"
	// PublishAuth is "DHHMACCHAP" when the frozen protocol asks for in-band authentication: the
	// node plugin then connects with its host Secret (never without); absent otherwise.
	// PublishAuthBidirectional is "true" when the host must authenticate the target too. The
	// secrets themselves never travel in the publish context (it is kept in VolumeAttachments).
	PublishAuth              = "auth"
	PublishAuthBidirectional = "authBidirectional"
	// PublishTargetNode names the storage node (the Node of the volume's Store): the node
	// plugin asks for its keys toward that node (docs/design.md#key-distribution).
	PublishTargetNode = "targetNode"
)
