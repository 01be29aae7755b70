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
// +kubebuilder:validation:XValidation:rule="!has(self.auth) || self.auth.mode != 'DHHMACCHAP' || !has(self.acl) || self.acl",message="auth mode DHHMACCHAP needs acl: true (a host admitted by allow_any_host is never asked for a secret)"
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

	// Auth is in-band authentication of each host by the storage node's target (and, when
	// bidirectional, of the target by the host). Default: none, only the ACL of host NQNs.
	// With mode DHHMACCHAP the ACL must stay on: a host the target does not list is never
	// asked for a secret.
	// +optional
	Auth *NVMeoFAuth `json:"auth,omitempty"`
}

// NVMeoFAuthMode is the in-band authentication protocol of NVMe-oF hosts.
// +kubebuilder:validation:Enum=None;DHHMACCHAP
type NVMeoFAuthMode string

// Authentication modes.
const (
	// AuthNone admits any host the ACL lists, on its NQN alone.
	AuthNone NVMeoFAuthMode = "None"
	// AuthDHHMACCHAP makes every host prove a per-host secret with DH-HMAC-CHAP (NVMe Base
	// Specification 2.0, 8.13.5; Linux nvmet hosts/<hostnqn>/dhchap_* and nvme connect
	// --dhchap-secret). Needs Linux >= 6.0 built with CONFIG_NVME_AUTH and, on storage
	// nodes, CONFIG_NVME_TARGET_AUTH (Agent status.capabilities.nvmeAuth).
	AuthDHHMACCHAP NVMeoFAuthMode = "DHHMACCHAP"
)

// NVMeoFAuth configures DH-HMAC-CHAP. The secrets themselves are never in policy: the
// controller generates one per host into Secrets of its own namespace.
// +kubebuilder:validation:XValidation:rule="self.mode == 'DHHMACCHAP' || !self.bidirectional",message="bidirectional needs mode DHHMACCHAP"
type NVMeoFAuth struct {
	// Mode is None (default) or DHHMACCHAP.
	// +optional
	// +kubebuilder:default=None
	Mode NVMeoFAuthMode `json:"mode,omitempty"`

	// Hash is the HMAC hash of the challenge (the target's dhchap_hash hmac(<hash>)):
	// sha256 (default), sha384 or sha512. Every Protocol with DHHMACCHAP must name the same
	// hash and dhGroup: the kernel keeps one setting per host (plinth vet checks it).
	// +optional
	// +kubebuilder:default=sha256
	// +kubebuilder:validation:Enum=sha256;sha384;sha512
	Hash string `json:"hash,omitempty"`

	// DHGroup adds an ephemeral Diffie-Hellman exchange (RFC 7919 groups) to each
	// authentication: ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or ffdhe8192. Unset (default)
	// is the kernel's "null" group: no exchange, cheaper, no forward secrecy.
	// +optional
	// +kubebuilder:validation:Enum=ffdhe2048;ffdhe3072;ffdhe4096;ffdhe6144;ffdhe8192
	DHGroup string `json:"dhGroup,omitempty"`

	// Bidirectional makes the host authenticate the target too (a controller secret,
	// nvme connect --dhchap-ctrl-secret). Default false.
	// +optional
	// +kubebuilder:default=false
	Bidirectional bool `json:"bidirectional"`

	// KeyGeneration rotates the per-host secrets: raising it in Git makes the controller
	// generate a new host secret into every host Secret made for a lower generation (the
	// controller secret of bidirectional authentication stays); the storage nodes' agents write
	// it into nvmet's host entries (from then on the old one is refused), and each host's node
	// plugin then hands it to its live controllers, which re-authenticate with it (Linux sysfs
	// /sys/class/nvme/nvmeX/dhchap_secret). Lowering it does nothing. Every Protocol with
	// DHHMACCHAP must name the same keyGeneration (plinth vet checks it): a host has one key.
	// Default 0.
	// +optional
	// +kubebuilder:validation:Minimum=0
	KeyGeneration int64 `json:"keyGeneration,omitempty"`
}

// Enabled reports whether a is set and asks for authentication.
func (a *NVMeoFAuth) Enabled() bool { return a != nil && a.Mode == AuthDHHMACCHAP }

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
