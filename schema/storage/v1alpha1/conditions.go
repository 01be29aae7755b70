package v1alpha1

// The conditions of Agent, Store and VolumeState status: the contract between the node agent
// that writes them and the CSI driver, the scheduler plugin, the policy controller and
// operators that read them. Types follow kstatus (Ready, Reconciling, Stalled) plus the
// domain conditions Drifted and Fenced; reasons are PascalCase.

// Condition types.
const (
	// ConditionReady surfaces on every Agent, Store and VolumeState: True once the agent
	// converged the kernel to the spec; False with a reason below while it cannot.
	ConditionReady = "Ready"
	// ConditionReconciling surfaces while the agent works toward the spec.
	ConditionReconciling = "Reconciling"
	// ConditionStalled surfaces when the agent cannot make progress without a change of the
	// spec or of the node (a declared device that carries data).
	ConditionStalled = "Stalled"
	// ConditionDrifted surfaces on Stores and VolumeStates: True while the kernel differs from
	// the declaration and the driftPolicy is Report.
	ConditionDrifted = "Drifted"
	// ConditionFenced surfaces on a VolumeState whose work the agent's fencing mark refused
	// (the reason is a fencing reason below).
	ConditionFenced = "Fenced"
	// ConditionHostNQNConflict surfaces on an Agent whose node's host NQN another node already
	// presents (another Agent's status.hostNQN or another Node's plinth.dev/host-nqn): True
	// with reason DuplicateHostNQN, naming both nodes; the Agent's status.hostNQN stays empty
	// (the registration is rejected). Absent when the NQN is the node's alone.
	ConditionHostNQNConflict = "HostNQNConflict"
)

// Reasons of an Agent's Ready condition.
const (
	// ReasonMissingKernelModules surfaces when a module the node's Agent spec needs (nvmet,
	// nvmet_tcp for NVMe-oF; dm_thin_pool for thin pools; bcache for an LVM cache) is not
	// loaded. On a Store (with Stalled=True) when its backend needs a module the kernel lacks
	// (bcache for lvm.cache): no volume of the Store is made, never one without its cache.
	ReasonMissingKernelModules = "MissingKernelModules"
	// ReasonNoBindAddress surfaces when no node address is inside spec.nvmeof.bindCIDR.
	ReasonNoBindAddress = "NoBindAddress"
	// ReasonAuthUnsupported surfaces (Ready=False, Stalled=True) when spec.nvmeof.auth asks
	// for DH-HMAC-CHAP and the node's kernel has no NVMe target authentication
	// (CONFIG_NVME_TARGET_AUTH; status.capabilities.nvmeAuth lacks "target"). The node's
	// volumes that ask for it are not exported: never without authentication.
	ReasonAuthUnsupported = "AuthUnsupported"
)

// Reasons of a VolumeState's Ready condition about in-band authentication.
const (
	// ReasonAuthSecretMissing surfaces when a publication's host Secret (nvme-auth-<node> in
	// the controller's namespace) is missing, belongs to another host NQN or is malformed:
	// the host is not allowed until it is there.
	ReasonAuthSecretMissing = "AuthSecretMissing"
)

// Reasons of a Store's and a VolumeState's conditions.
const (
	// ReasonSucceeded surfaces with Ready=True: converged.
	ReasonSucceeded = "Succeeded"
	// ReasonDeviceNotEmpty surfaces on a Store when a declared device carries data: the agent
	// never writes to it.
	ReasonDeviceNotEmpty = "DeviceNotEmpty"
	// ReasonBackendFailed surfaces on a Store when the backend cannot be built, ensured or
	// observed for another reason (the message says which).
	ReasonBackendFailed = "BackendFailed"
	// ReasonDrifted surfaces with Ready=False when the kernel differs from the declaration and
	// the driftPolicy is Report.
	ReasonDrifted = "Drifted"
	// ReasonNoDrift surfaces with Drifted=False: the kernel matches the declaration.
	ReasonNoDrift = "NoDrift"
	// ReasonStoreNotReady surfaces on a VolumeState when its Store is not in this node's
	// cache yet or its backend is not ready.
	ReasonStoreNotReady = "StoreNotReady"
	// ReasonVolumeFailed surfaces on a VolumeState when the backend refused or failed an
	// operation (the message carries the command and its stderr).
	ReasonVolumeFailed = "VolumeFailed"
	// ReasonExpansionRefused surfaces on a VolumeState's Ready when the backend cannot give the
	// volume the size its spec asks for whatever the free space: a raw partition with too
	// little free space right after it, a whole-disk volume asked to outgrow its disk. The
	// volume keeps its size; the CSI controller answers ControllerExpandVolume OUT_OF_RANGE.
	ReasonExpansionRefused = "ExpansionRefused"
	// ReasonExportFailed surfaces on a VolumeState when the nvmet export could not be made.
	ReasonExportFailed = "ExportFailed"
	// ReasonFenced surfaces on a VolumeState's Ready when fencing refused the work.
	ReasonFenced = "Fenced"
	// ReasonDeleting surfaces on a VolumeState's Ready while its export and volume are removed.
	ReasonDeleting = "Deleting"
)

// Reasons of a VolumeState's Fenced condition (and the reason label of
// plinth_agent_fencing_rejections_total).
const (
	// ReasonStaleGeneration surfaces when the work's metadata.generation is lower than the
	// highest one acted on.
	ReasonStaleGeneration = "StaleGeneration"
	// ReasonStalePublicationGeneration surfaces when spec.publicationGeneration is lower than
	// the highest one acted on.
	ReasonStalePublicationGeneration = "StalePublicationGeneration"
	// ReasonRetiredLifecycle surfaces when the work belongs to a VolumeState UID whose
	// lifecycle already ended (volume deleted, mark released).
	ReasonRetiredLifecycle = "RetiredLifecycle"
	// ReasonLifecycleConflict surfaces when a new VolumeState UID asks for a volume whose
	// previous lifecycle never released it: the old data is not handed to the new lifecycle.
	ReasonLifecycleConflict = "LifecycleConflict"
	// ReasonCorruptMark surfaces when the fencing mark file does not parse.
	ReasonCorruptMark = "CorruptMark"
)

// ReasonStoreDraining surfaces on a VolumeState's Ready when its Store takes no new volume
// (Store.IsDraining: it carries plinth.dev/draining, or spec.evacuate) and the volume does not
// exist yet: such a Store keeps serving the volumes it holds and takes no new one (the agent
// retries at its refresh interval, in case the mark is lifted).
const ReasonStoreDraining = "StoreDraining"

// Reasons of Ready=False the controller writes on the Agent and the Stores of a node whose
// agent cannot answer (controllers/liveness); the agent's next report replaces them.
const (
	// ReasonNodeDeleted surfaces when the Node object of the Agent or Store no longer exists:
	// its volumes left with it (DeleteVolume releases them).
	ReasonNodeDeleted = "NodeDeleted"
	// ReasonAgentSilent surfaces when the agent's last heartbeat is older than the
	// controller's silence threshold (two minutes): the node may come back; DeleteVolume of
	// its volumes answers UNAVAILABLE until it does.
	ReasonAgentSilent = "AgentSilent"
)
