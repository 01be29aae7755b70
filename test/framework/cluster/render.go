package cluster

import "fmt"

// The renderers below give the configuration files this package writes for its host nodes to
// nodes that run elsewhere (test/kernel/guestnode: a kubelet inside a qemu guest), so both
// kinds of node run the same containerd, CNI and kubelet settings. Paths are as the node sees
// them.

// ContainerdConfigFiles are the paths and names of RenderContainerdConfig.
type ContainerdConfigFiles struct {
	// Root and State are containerd's root (images, snapshots) and state (runtime) folders.
	Root, State string
	// Socket is the gRPC socket; its ttrpc socket is Socket + ".ttrpc".
	Socket string
	// Opt is the folder of the opt plugin.
	Opt string
	// SandboxImage defaults to DefaultSandboxImage.
	SandboxImage string
	// CNIBinDir defaults to DefaultCNIBinDir; CNIConfDir is required.
	CNIBinDir, CNIConfDir string
}

// RenderContainerdConfig returns the containerd 1.6 config (version 2, CRI plugin with the
// overlayfs snapshotter) StartContainerd writes, for the given paths.
func RenderContainerdConfig(f ContainerdConfigFiles) string {
	if f.SandboxImage == "" {
		f.SandboxImage = DefaultSandboxImage
	}
	if f.CNIBinDir == "" {
		f.CNIBinDir = DefaultCNIBinDir
	}
	return fmt.Sprintf(containerdConfig, f.Root, f.State, f.Socket, f.Socket+".ttrpc", f.Opt, f.SandboxImage, f.CNIBinDir, f.CNIConfDir)
}

// RenderCNIConfig returns a node's CNI network config (a .conflist: the bridge plugin with
// host-local IPAM, no masquerade): network name, bridge device, IPAM state folder and the
// node's pod subnet (CIDR).
func RenderCNIConfig(network, bridge, ipamDir, podSubnet string) string {
	return fmt.Sprintf(cniConfig, network, bridge, ipamDir, podSubnet)
}

// KubeletConfigValues are the per-node values of RenderKubeletConfig.
type KubeletConfigValues struct {
	// ClientCAFile verifies client certificates (the API server's kubelet client).
	ClientCAFile string
	// CgroupRoot is kubelet's cgroupRoot ("/" for a node that owns its cgroups).
	CgroupRoot string
	// RuntimeEndpoint is the CRI endpoint, unix:///path/containerd.sock.
	RuntimeEndpoint string
	// Address and Port are where kubelet serves its API; HealthzPort is its /healthz on
	// 127.0.0.1.
	Address           string
	Port, HealthzPort int
}

// RenderKubeletConfig returns the KubeletConfiguration (kubelet.config.k8s.io/v1beta1) this
// package's nodes run with: cgroupfs driver, x509 + webhook authentication, webhook
// authorization, no hard eviction, image GC off, node status every 5 s.
func RenderKubeletConfig(v KubeletConfigValues) string {
	return fmt.Sprintf(kubeletConfig, v.ClientCAFile, v.CgroupRoot, v.RuntimeEndpoint, v.Address, v.Port, v.HealthzPort)
}
