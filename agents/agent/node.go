package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/plinth-storage/plinth/agents/nvmet"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// KernelModules are the modules the Agent reports (docs/design.md, "The runtime API").
var KernelModules = []string{"nvmet", "nvmet_tcp", "nvme_tcp", "dm_thin_pool", "bcache"}

// NodeInfo is what the agent found on its node.
type NodeInfo struct {
	// HostNQN from the host NQN file; "" when missing or invalid (HostNQNError says why).
	HostNQN      string
	HostNQNError string
	// Modules are the KernelModules loaded (or built in), sorted.
	Modules []string
	// Missing are the KernelModules not loaded, sorted.
	Missing []string
	// Backends usable on the node: "lvm" (lvm binary and device-mapper),
	// "file" (/dev/loop-control), "raw" (sfdisk, partx and wipefs), sorted.
	Backends []string
	// NVMeAuth and NVMeTLS: where the kernel supports NVMe in-band authentication and
	// NVMe/TCP TLS ("host", "target"), see KernelNVMeSecurity.
	NVMeAuth, NVMeTLS []string
}

// KernelNVMeSecurity reads which parts of the running kernel (sysRoot, normally /sys) support
// NVMe in-band authentication and NVMe/TCP TLS, from the modules that use the shared helper
// modules: nvme_auth is used by nvme_core (CONFIG_NVME_HOST_AUTH) and by nvmet
// (CONFIG_NVME_TARGET_AUTH); nvme_keyring by nvme_tcp (CONFIG_NVME_TCP_TLS) and by nvmet
// (CONFIG_NVME_TARGET_TCP_TLS). Kernels without them (Debian bookworm's 6.1) have no
// /sys/module/nvme_auth at all. The modules must be loaded (the agent's and the node
// plugin's nvme modules are). Each result is sorted: "host", "target".
func KernelNVMeSecurity(sysRoot string) (auth, tls []string) {
	held := func(helper, user string) bool {
		_, err := os.Stat(filepath.Join(sysRoot, "module", helper, "holders", user))
		return err == nil
	}
	if held("nvme_auth", "nvme_core") {
		auth = append(auth, storev1.CapabilityHost)
	}
	if held("nvme_auth", "nvmet") {
		auth = append(auth, storev1.CapabilityTarget)
	}
	if held("nvme_keyring", "nvme_tcp") {
		tls = append(tls, storev1.CapabilityHost)
	}
	if held("nvme_keyring", "nvmet") || held("nvme_keyring", "nvmet_tcp") {
		tls = append(tls, storev1.CapabilityTarget)
	}
	return auth, tls
}

// Probe reads the node: the host NQN file (such as /etc/nvme/hostnqn), the
// modules under sysRoot/module (built-in modules appear there too when they
// have parameters, so /proc/modules is consulted as well), and the tools.
func (o *Options) probe() NodeInfo {
	var ni NodeInfo
	if b, err := os.ReadFile(o.HostNQNFile); err != nil {
		ni.HostNQNError = fmt.Sprintf("host NQN: %v", err)
	} else if nqn := strings.TrimSpace(string(b)); nvmet.ValidateNQN(nqn) != nil {
		ni.HostNQNError = fmt.Sprintf("host NQN in %s is not a valid NQN", o.HostNQNFile)
	} else {
		ni.HostNQN = nqn
	}
	loaded := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(o.ProcRoot, "modules")); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) > 0 {
				loaded[f[0]] = true
			}
		}
	}
	for _, m := range KernelModules {
		if _, err := os.Stat(filepath.Join(o.SysRoot, "module", m)); err == nil || loaded[m] {
			ni.Modules = append(ni.Modules, m)
		} else {
			ni.Missing = append(ni.Missing, m)
		}
	}
	if _, err := os.Stat(filepath.Join(o.DevRoot, "loop-control")); err == nil {
		ni.Backends = append(ni.Backends, "file")
	}
	if _, err := o.LookPath("lvm"); err == nil {
		if _, err := os.Stat(filepath.Join(o.DevRoot, "mapper", "control")); err == nil {
			ni.Backends = append(ni.Backends, "lvm")
		}
	}
	// raw: partition tables with sfdisk (Debian fdisk), the kernel told with partx, wipes with wipefs
	raw := true
	for _, c := range []string{"sfdisk", "partx", "wipefs"} {
		if _, err := o.LookPath(c); err != nil {
			raw = false
		}
	}
	if raw {
		ni.Backends = append(ni.Backends, "raw")
	}
	sort.Strings(ni.Backends)
	ni.NVMeAuth, ni.NVMeTLS = KernelNVMeSecurity(o.SysRoot)
	return ni
}

// AddrLister lists the node's interface addresses (net.InterfaceAddrs).
type AddrLister func() ([]net.Addr, error)

// SelectAddress returns the first node address inside cidr (in the order
// the kernel lists interfaces and addresses), the rule of the Protocol's
// bindCIDR. Errors: a malformed CIDR, or no address inside it.
func SelectAddress(cidr string, list AddrLister) (string, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return "", fmt.Errorf("bindCIDR %q: %w", cidr, err)
	}
	addrs, err := list()
	if err != nil {
		return "", fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if ip != nil && n.Contains(ip) {
			return ip.String(), nil
		}
	}
	return "", fmt.Errorf("no address of this node is inside bindCIDR %s", cidr)
}
