package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AgentSpec is rendered by the controller: what the node agent needs without reading policy.
type AgentSpec struct {
	// NodeName is the Node this agent serves (equal to the object name).
	NodeName string `json:"nodeName"`
	// Stores are the names of the Store objects of this node, sorted.
	// +optional
	Stores []string `json:"stores,omitempty"`
	// NVMeoF is the resolved NVMe-oF/TCP endpoint when a pool of this node is served over it.
	// +optional
	NVMeoF *NVMeoFEndpoint `json:"nvmeof,omitempty"`
}

// NVMeoFEndpoint is the nvmet TCP port an agent opens.
type NVMeoFEndpoint struct {
	// Port is the TCP service id (trsvcid), 1–65535.
	Port int32 `json:"port"`
	// BindCIDR selects the node address to bind: the first node address inside it.
	BindCIDR string `json:"bindCIDR"`
	// Auth is true when a Protocol of this node's pools asks for DH-HMAC-CHAP: the agent then
	// needs NVMe target authentication in the kernel (Ready=False, reason AuthUnsupported,
	// without it).
	// +optional
	Auth bool `json:"auth,omitempty"`
	// A rotation (Protocol keyGeneration) is not here: the agent learns it from the keys the
	// key server serves (docs/design.md#key-distribution).
}

// HostKey names the DH-HMAC-CHAP secrets an agent last wrote into nvmet's host entry of one
// host: the key id of the host Secret they came from (its plinth.dev/dhchap-key-id
// annotation), never the secrets.
type HostKey struct {
	// HostNQN is the host entry's NQN (hosts/<hostnqn>).
	HostNQN string `json:"hostNQN"`
	// KeyID is the plinth.dev/dhchap-key-id annotation of the Secret whose secrets the entry
	// holds.
	KeyID string `json:"keyID"`
}

// Values of AgentCapabilities.NVMeAuth and NVMeTLS.
const (
	// CapabilityTarget: the kernel's nvmet target supports it.
	CapabilityTarget = "target"
	// CapabilityHost: the kernel's NVMe host (initiator) supports it.
	CapabilityHost = "host"
)

// AgentCapabilities is what the agent found on its node.
type AgentCapabilities struct {
	// Backends usable on the node: "lvm", "zfs", "file".
	// +optional
	Backends []string `json:"backends,omitempty"`
	// KernelModules loaded or loadable: nvmet, nvmet_tcp, nvme_tcp, dm_thin_pool, bcache, zfs.
	// +optional
	KernelModules []string `json:"kernelModules,omitempty"`
	// NVMeAuth says where the kernel supports NVMe in-band authentication (DH-HMAC-CHAP):
	// "host" (nvme-core uses nvme-auth: CONFIG_NVME_HOST_AUTH) and "target" (nvmet uses
	// nvme-auth: CONFIG_NVME_TARGET_AUTH), sorted; empty on kernels without (Debian
	// bookworm's 6.1). Read from /sys/module/nvme_auth/holders.
	// +optional
	NVMeAuth []string `json:"nvmeAuth,omitempty"`
	// NVMeTLS says where the kernel supports NVMe/TCP TLS: "host" (nvme-tcp uses
	// nvme-keyring: CONFIG_NVME_TCP_TLS) and "target" (nvmet uses nvme-keyring:
	// CONFIG_NVME_TARGET_TCP_TLS), sorted. The TLS handshake also needs the tlshd daemon
	// (ktls-utils), which is not checked. Read from /sys/module/nvme_keyring/holders.
	// +optional
	NVMeTLS []string `json:"nvmeTLS,omitempty"`
}

// AgentStatus is written by the node agent.
type AgentStatus struct {
	// ObservedGeneration is the metadata.generation the agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions hold Ready, Reconciling, Stalled and what is missing on the node.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Address is the node address the NVMe-oF port binds to (inside spec.nvmeof.bindCIDR).
	// +optional
	Address string `json:"address,omitempty"`
	// HostNQN is the node's NVMe host NQN from /etc/nvme/hostnqn.
	// +optional
	HostNQN string `json:"hostNQN,omitempty"`
	// Capabilities the agent found on the node.
	// +optional
	Capabilities AgentCapabilities `json:"capabilities,omitempty"`
	// Version of the agent binary.
	// +optional
	Version string `json:"version,omitempty"`
	// HostKeys lists, for each host entry this agent wrote DH-HMAC-CHAP secrets into since it
	// started, which Secret key id the entry holds. A host's node plugin hands rotated secrets
	// to its live controllers only once the agent of the storage node they connect to lists the
	// Secret's current key id for it (the target must hold a key before a host presents it).
	// +optional
	// +listType=map
	// +listMapKey=hostNQN
	HostKeys []HostKey `json:"hostKeys,omitempty"`
	// LastHeartbeatTime is when the agent last reported.
	// +optional
	LastHeartbeatTime *metav1.Time `json:"lastHeartbeatTime,omitempty"`
}

// Agent is one node's storage agent: rendered spec, observed status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=plinth
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.address`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Heartbeat",type=date,JSONPath=`.status.lastHeartbeatTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Agent struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AgentSpec   `json:"spec"`
	Status AgentStatus `json:"status,omitempty"`
}

// AgentList is a list of Agents.
//
// +kubebuilder:object:root=true
type AgentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Agent `json:"items"`
}

// GetConditions returns the status conditions.
func (in *Agent) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *Agent) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }
