package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/plinth-storage/plinth/test/framework/process"
)

// KubeletRootDir is the kubelet root folder as every node's kubelet,
// containerd and pods see it: in the node's own mount namespace it is the
// node's <Dir>/<node>/kubelet, bind-mounted. DaemonSets use this path as
// their hostPath (the shipped manifests do).
const KubeletRootDir = "/var/lib/kubelet"

// nodePaths are the host paths each node sees as its own folder: paths kubelet,
// containerd or the CNI plugins use outside their configurable folders, and
// the per-node state folders of Plinth's shipped DaemonSets. Each is
// bind-mounted from <node dir>/<name> in the node's mount namespace, so N
// nodes do not share them and nothing is written to the host's own copy
// (which stays an empty folder, made when missing).
var nodePaths = []struct{ path, name string }{
	{KubeletRootDir, "kubelet"},           // root dir, pki, plugins, plugins_registry, device-plugins, pods
	{"/var/lib/cni", "cni-state"},         // CNI result cache of containerd's CRI plugin
	{"/var/log/pods", "pod-logs"},         // container logs kubelet and containerd write
	{"/var/log/containers", "clogs"},      // kubelet's symlinks to them
	{"/run/netns", "netns"},               // pod network namespaces containerd bind-mounts
	{"/run/containerd", "run-containerd"}, // runc state and shim sockets (fixed paths in containerd 1.6)
	{"/var/lib/plinth", "plinth"},         // agent and CSI node plugin state (kustomize/agent, kustomize/csi)
	{"/etc/nvme", "etc-nvme"},             // the node's host NQN and host ID
}

// Node is one running node: a containerd and a kubelet in the node's own
// mount namespace, with its own cgroup root and CNI bridge.
type Node struct {
	// Name is the Node object's name (kubelet's --hostname-override).
	Name string
	// Zone is its topology.kubernetes.io/zone label.
	Zone string
	// Labels are all labels kubelet registered the node with.
	Labels map[string]string
	// Dir is <Options.Dir>/<Name>: the node's folders, config and logs.
	Dir string
	// RootDir is the host path of the node's kubelet root dir, which its
	// pods see as KubeletRootDir (mounts propagate both ways).
	RootDir string
	// CgroupRoot is kubelet's cgroupRoot, /plinth-<Name>, in every v1 hierarchy.
	CgroupRoot string
	// Bridge is the node's CNI bridge; PodSubnet its pods' addresses.
	Bridge, PodSubnet string
	// KubeletPort is where kubelet serves (on the node IP); HealthzPort its
	// /healthz on 127.0.0.1.
	KubeletPort, HealthzPort int
	// MountNamespace is the file holding the node's mount namespace
	// (`nsenter --mount=<it>` enters what the node sees).
	MountNamespace string
	// Containerd is the node's container runtime.
	Containerd *Containerd

	kubelet *process.Process
	// containerdOpts started Containerd; RestartContainerd starts it again with them.
	containerdOpts ContainerdOptions
	logDir         string
	index          int
	shared         bool // RootDir bind-mounted shared on the host
	nsMade         bool
}

// KubeletLogPath is the node's kubelet log.
func (n *Node) KubeletLogPath() string { return filepath.Join(n.logDir, "kubelet-"+n.Name+".log") }

// Import loads an image archive into the node's containerd (Containerd.Import).
func (n *Node) Import(ctx context.Context, archive string) error {
	return n.Containerd.Import(ctx, archive)
}

// Enter returns the command prefix that runs a program in the node's mount
// namespace: nsenter --mount=<MountNamespace> --.
func (n *Node) Enter() []string {
	return []string{"nsenter", "--mount=" + n.MountNamespace, "--"}
}

// setupMountNamespace makes the node's persistent mount namespace: RootDir
// bind-mounted shared on the host (so mounts that pods make under
// KubeletRootDir show on the host and the host's show in the node), then a
// new namespace holding the host's mounts unchanged, where each of nodePaths
// is bound to the node's own folder. The host's mounts are private here, so
// nothing mounted in the namespace outside RootDir leaks out.
func (n *Node) setupMountNamespace(ctx context.Context, extra []string) error {
	paths := append([]struct{ path, name string }(nil), nodePaths...)
	for i, p := range extra {
		paths = append(paths, struct{ path, name string }{p, fmt.Sprintf("extra-%d", i)})
	}
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Join(n.Dir, p.name), 0o755); err != nil {
			return err
		}
		// The mount point must exist on the host (it stays an empty folder).
		if err := os.MkdirAll(p.path, 0o755); err != nil {
			return err
		}
	}
	if err := run(ctx, "mount", "--bind", n.RootDir, n.RootDir); err != nil {
		return err
	}
	n.shared = true
	if err := run(ctx, "mount", "--make-shared", n.RootDir); err != nil {
		return err
	}
	if err := os.WriteFile(n.MountNamespace, nil, 0o600); err != nil {
		return err
	}
	// --propagation unchanged: the copy of RootDir stays a peer of the host's.
	if err := run(ctx, "unshare", "--mount="+n.MountNamespace, "--propagation", "unchanged", "true"); err != nil {
		return err
	}
	n.nsMade = true
	for _, p := range paths {
		args := append(n.Enter(), "mount", "--bind", filepath.Join(n.Dir, p.name), p.path)
		if err := run(ctx, args[0], args[1:]...); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// cniConfig is the node's CNI network: its own bridge and subnet, IPAM state
// under the node's folder. No masquerade and no portmap: pods talk to the
// host (API server, kubelets); nothing of theirs is published.
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": %[1]q,
  "plugins": [{
    "type": "bridge",
    "bridge": %[2]q,
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "dataDir": %[3]q,
      "ranges": [[{"subnet": %[4]q}]],
      "routes": [{"dst": "0.0.0.0/0"}]
    }
  }]
}
`

func (n *Node) writeCNIConfig(confDir string) error {
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return err
	}
	cfg := fmt.Sprintf(cniConfig, "plinth-"+n.Name, n.Bridge, filepath.Join(n.Dir, "ipam"), n.PodSubnet)
	return os.WriteFile(filepath.Join(confDir, "10-plinth-bridge.conflist"), []byte(cfg), 0o644)
}

// kubeletConfig is the node's KubeletConfiguration. cgroup v1 here:
// failCgroupV1 false and the cgroupfs driver; evictionHard empty and image
// GC off so a busy shared host neither evicts pods nor deletes imported
// images (they cannot be pulled again); x509 client certificates from the
// cluster CA and webhook authorization, as in a real cluster; CSIVolumeHealth on, so kubelet
// asks the node plugin for each volume's health (NodeGetVolumeHealth) for the pod's
// status.volumeHealth, which the API server keeps only with the same gate (the control plane
// does not set it yet). Kubelet v1.37 exports no volume-health metric: the "Abnormal volumes"
// panel counts the node plugins' own plinth_csi_node_volumes_inaccessible.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[1]q}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupRoot: %[2]q
cgroupsPerQOS: true
enforceNodeAllocatable: []
containerRuntimeEndpoint: %[3]q
address: %[4]q
port: %[5]d
healthzBindAddress: 127.0.0.1
healthzPort: %[6]d
readOnlyPort: 0
staticPodPath: ""
resolvConf: /etc/resolv.conf
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
volumePluginDir: /var/lib/kubelet/volumeplugins
registerNode: true
featureGates: {CSIVolumeHealth: true}
rotateCertificates: false
serverTLSBootstrap: false
shutdownGracePeriod: 0s
nodeStatusUpdateFrequency: 5s
`

func (n *Node) startKubelet(ctx context.Context, c *Cluster, kubeconfig string) error {
	cfgPath := filepath.Join(n.Dir, "kubelet-config.yaml")
	cfg := fmt.Sprintf(kubeletConfig, c.clientCA, n.CgroupRoot, "unix://"+n.Containerd.Socket,
		c.NodeIP, n.KubeletPort, n.HealthzPort)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	keys := make([]string, 0, len(n.Labels))
	for k := range n.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var labels []string
	for _, k := range keys {
		labels = append(labels, k+"="+n.Labels[k])
	}
	path, args := wrap(n.Enter(), c.kubeletBin,
		"--config="+cfgPath,
		"--kubeconfig="+kubeconfig,
		"--hostname-override="+n.Name,
		"--node-ip="+c.NodeIP,
		"--root-dir="+KubeletRootDir,
		"--cert-dir="+KubeletRootDir+"/pki",
		"--node-labels="+strings.Join(labels, ","),
		"--v=1",
	)
	p, err := process.Start(ctx, path, n.logDir, process.Spec{
		Name:         "kubelet-" + n.Name,
		Args:         args,
		Ready:        process.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/healthz", n.HealthzPort), nil),
		ReadyTimeout: c.timeout,
	})
	if err != nil {
		return fmt.Errorf("node %s: kubelet did not start: %w", n.Name, err)
	}
	n.kubelet = p
	return nil
}

// RestartKubelet ends the kubelet of the node named name and starts it again with the same
// configuration, as restarting the kubelet service does on a real node: the node's pods keep
// running under containerd meanwhile, and the new kubelet finds them, its plugins' sockets and
// its volumes' mounts where the old one left them. hard ends it with SIGKILL (a crashed
// kubelet); otherwise SIGTERM with 5 s of grace. ctx bounds the new kubelet's start-up (its
// /healthz). The error names the node.
func (c *Cluster) RestartKubelet(ctx context.Context, name string, hard bool) error {
	n := c.Node(name)
	if n == nil || n.kubelet == nil {
		return fmt.Errorf("restart kubelet: no running node %q", name)
	}
	if err := n.kubelet.StopWithin(grace(hard)); err != nil {
		return fmt.Errorf("node %s: stop kubelet: %w", name, err)
	}
	kubeconfig, err := c.opts.NodeKubeconfig(n.Name)
	if err != nil {
		return fmt.Errorf("node %s: kubeconfig: %w", n.Name, err)
	}
	return n.startKubelet(ctx, c, kubeconfig)
}

// RestartContainerd ends the containerd of the node named name and starts it again with the
// same configuration and state folders, as restarting the containerd service does: running
// containers keep running (their shims are not containerd's children) and the new containerd
// reconnects to them; kubelet's CRI connection comes back on its own. hard ends it with
// SIGKILL, otherwise SIGTERM with 5 s of grace. ctx bounds the new containerd's start-up.
func (c *Cluster) RestartContainerd(ctx context.Context, name string, hard bool) error {
	n := c.Node(name)
	if n == nil || n.Containerd == nil {
		return fmt.Errorf("restart containerd: no running node %q", name)
	}
	if err := n.Containerd.proc.StopWithin(grace(hard)); err != nil {
		return fmt.Errorf("node %s: stop containerd: %w", name, err)
	}
	cd, err := StartContainerd(ctx, n.containerdOpts)
	if err != nil {
		return err
	}
	n.Containerd = cd
	return nil
}

// grace is how long a restart waits after SIGTERM before SIGKILL: none when hard.
func grace(hard bool) time.Duration {
	if hard {
		return 0
	}
	return 5 * time.Second
}

// createCgroups makes CgroupRoot in every v1 hierarchy: kubelet checks it
// exists everywhere before it starts ("cgroup has some missing paths").
func (n *Node) createCgroups(hierarchies []string) error {
	for _, h := range hierarchies {
		if err := os.MkdirAll(filepath.Join(h, n.CgroupRoot), 0o755); err != nil {
			return fmt.Errorf("node %s: cgroup root: %w", n.Name, err)
		}
	}
	return nil
}

// stop ends the node and removes everything it made on the host: kubelet,
// containerd, every process left in its mount namespace (shims) or cgroups
// (pods), the namespace, mounts under RootDir, cgroups, the bridge.
func (n *Node) stop(ctx context.Context, hierarchies []string) error {
	var errs []error
	if n.kubelet != nil {
		if err := n.kubelet.StopWithin(5 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if n.Containerd != nil {
		if err := n.Containerd.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := n.killAll(hierarchies); err != nil {
		errs = append(errs, err)
	}
	if n.nsMade {
		// Nothing runs in it now: dropping the last reference frees it and
		// every mount only it had (pod netns files, rootfs overlays).
		if err := run(ctx, "umount", n.MountNamespace); err != nil {
			errs = append(errs, err)
		}
		n.nsMade = false
	}
	if n.shared {
		// Mounts pods made under the root dir propagated here; unmount them
		// and the shared bind itself, deepest first.
		mounts, err := MountsUnder(n.RootDir)
		if err != nil {
			errs = append(errs, err)
		}
		for _, m := range mounts {
			if err := run(ctx, "umount", m); err != nil {
				errs = append(errs, err)
			}
		}
		n.shared = false
	}
	if err := removeCgroups(hierarchies, n.CgroupRoot, time.Now().Add(20*time.Second)); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat("/sys/class/net/" + n.Bridge); err == nil {
		if err := run(ctx, "ip", "link", "del", n.Bridge); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("node %s: stop: %w", n.Name, errors.Join(errs...))
	}
	return nil
}

// killAll SIGKILLs every process in the node's mount namespace and cgroups
// until none is left: pods are not kubelet's or containerd's children (their
// shims are reparented), and with both gone nothing starts new ones.
func (n *Node) killAll(hierarchies []string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		var pids []int
		if n.nsMade {
			p, err := pidsInMountNS(n.MountNamespace)
			if err != nil {
				return fmt.Errorf("node %s: find processes: %w", n.Name, err)
			}
			pids = append(pids, p...)
		}
		pids = append(pids, pidsInCgroups(hierarchies, n.CgroupRoot)...)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s: processes %v still run after SIGKILL", n.Name, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond) // reaping by init is asynchronous: poll /proc again
	}
}
