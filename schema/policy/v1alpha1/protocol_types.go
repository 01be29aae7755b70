package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProtocolSpec says how a volume reaches its consumer: exactly one of local or nvmeofTcp.
// +kubebuilder:validation:XValidation:rule="[has(self.local), has(self.nvmeofTcp)].filter(x, x).size() == 1",message="exactly one of local or nvmeofTcp must be set"
type ProtocolSpec struct {
	// Local serves the volume on the node that holds it; the pod must run there, so placements
	// using it need volumeBindingMode WaitForFirstConsumer.
	// +optional
	Local *LocalProtocol `json:"local,omitempty"`

	// NVMeoFTCP exports the volume from its storage node over NVMe-oF/TCP through the kernel's
	// nvmet target (Documentation/nvme/nvme-target in the kernel tree).
	// +optional
	NVMeoFTCP *NVMeoFTCPProtocol `json:"nvmeofTcp,omitempty"`
}

// LocalProtocol has no settings: the volume is used on its own node.
type LocalProtocol struct{}

// NVMeoFTCPProtocol configures the nvmet TCP port of each storage node and the host side.
type NVMeoFTCPProtocol struct {
	// Port is the TCP service id (trsvcid), 1–65535. Default 4420, the IANA NVMe-oF port.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:default=4420
	Port int32 `json:"port,omitempty"`

	// BindCIDR selects the storage node address the port binds to: the first address of the
	// node inside this CIDR, such as "10.20.0.0/16".
	// +kubebuilder:validation:MinLength=1
	BindCIDR string `json:"bindCIDR"`

	// ACL restricts each subsystem to the host NQNs of its publications
	// (attr_allow_any_host=0). Default true.
	// +optional
	// +kubebuilder:default=true
	ACL *bool `json:"acl,omitempty"`

	// MaxQueueSize is the host's I/O queue depth (nvme connect --queue-size), 16–1024.
	// +optional
	// +kubebuilder:validation:Minimum=16
	// +kubebuilder:validation:Maximum=1024
	MaxQueueSize int32 `json:"maxQueueSize,omitempty"`

	// CtrlLossTmo is how long, in seconds, the host keeps reconnecting a lost controller
	// (nvme connect --ctrl-loss-tmo); -1 retries forever. Default 600.
	// +optional
	// +kubebuilder:validation:Minimum=-1
	// +kubebuilder:validation:Maximum=86400
	CtrlLossTmo *int32 `json:"ctrlLossTmo,omitempty"`

	// ReconnectDelay is the delay between reconnect attempts in seconds
	// (nvme connect --reconnect-delay), 1–3600. Default 10.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	ReconnectDelay int32 `json:"reconnectDelay,omitempty"`
}

// Protocol says how a volume reaches its consumer.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=sproto,categories=plinth
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Drifted",type=string,JSONPath=`.status.conditions[?(@.type=="Drifted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Protocol struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProtocolSpec `json:"spec"`
	Status PolicyStatus `json:"status,omitempty"`
}

// ProtocolList is a list of Protocols.
//
// +kubebuilder:object:root=true
type ProtocolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Protocol `json:"items"`
}

// GetConditions returns the status conditions.
func (in *Protocol) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *Protocol) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

// Kind returns "local" or "nvmeofTcp", or "" when none is set.
func (p ProtocolSpec) Kind() string {
	switch {
	case p.Local != nil:
		return "local"
	case p.NVMeoFTCP != nil:
		return "nvmeofTcp"
	}
	return ""
}
