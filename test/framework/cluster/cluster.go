package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/plinth-storage/plinth/test/framework/process"
)

// ZoneLabel is the well-known topology label the harness sets on every node,
// as a cloud provider or bare-metal installer would.
const ZoneLabel = "topology.kubernetes.io/zone"

// PodCIDR is the range the nodes' pod subnets are cut from: node i (from 1)
// gets 10.244.i.0/24.
const PodCIDR = "10.244.0.0/16"

// bridgePrefix names the nodes' CNI bridges: plinth-br<i>.
const bridgePrefix = "plinth-br"

// NodeOptions describe one node.
type NodeOptions struct {
	// Name is the Node's name (a DNS label, at most 40 characters).
	Name string
	// Zone is its topology.kubernetes.io/zone; empty means none.
	Zone string
	// Labels are more labels kubelet registers the node with (beside the zone
	// and Options.Labels); keys in kubernetes.io namespaces are limited to
	// what the NodeRestriction admission plugin lets a kubelet set.
	Labels map[string]string
}

// DefaultNodes returns n nodes named plinth-node-1..n in zones zone-a, zone-b,
// zone-c, zone-a, ... (three zones).
func DefaultNodes(n int) []NodeOptions {
	out := make([]NodeOptions, n)
	for i := range out {
		out[i] = NodeOptions{Name: fmt.Sprintf("plinth-node-%d", i+1), Zone: "zone-" + string(rune('a'+i%3))}
	}
	return out
}

// Options configure Start. APIServer, CAFile, Admin and NodeKubeconfig are
// required: the control plane is the caller's (test/framework/controlplane with
// Options.Nodes, or any other API server set up the same way).
type Options struct {
	// Dir holds each node's folders and the logs; empty means a new temporary
	// folder that Stop removes (unless KeepDir). It must be on a mount with
	// private propagation (true of a plain host; mount namespaces are bound
	// to files in it).
	Dir string
	// KeepDir keeps a temporary Dir after Stop (for reading logs).
	KeepDir bool
	// Nodes to start; empty means DefaultNodes(3).
	Nodes []NodeOptions
	// Labels are added to every node.
	Labels map[string]string
	// NodePaths are more absolute host paths each node gets its own folder
	// at (beside /var/lib/kubelet, /var/lib/plinth, /etc/nvme and the
	// runtime's paths, see the package doc).
	NodePaths []string

	// APIServer is the API server URL as the host reaches it (kubelets and
	// kube-proxy run on the host).
	APIServer string
	// CAFile is the PEM CA the API server's serving certificate chains to.
	CAFile string
	// ClientCAFile is the CA kubelets trust for client certificates (the API
	// server's --kubelet-client-certificate must chain to it); empty means CAFile.
	ClientCAFile string
	// Admin is a cluster-admin REST config: the harness waits for Nodes and
	// reads their state with it.
	Admin *rest.Config
	// NodeKubeconfig returns the kubeconfig file a node's kubelet uses; its
	// identity should be system:node:<node> in group system:nodes (Node
	// authorizer and NodeRestriction).
	NodeKubeconfig func(node string) (string, error)
	// KubeProxyKubeconfig is the kubeconfig of kube-proxy (identity
	// system:kube-proxy); empty means no kube-proxy: pods cannot reach
	// Services.
	KubeProxyKubeconfig string

	// NodeIP is the address kubelets register and serve on; empty means
	// HostIP(). It must not be loopback.
	NodeIP string
	// Kubelet and KubeProxy are the executables (required: built by `make
	// testbin`); Containerd defaults to "containerd" on PATH.
	Kubelet, KubeProxy, Containerd string
	// SandboxImage is containerd's pause image (default DefaultSandboxImage);
	// it must be in one of Images, as nothing is pulled.
	SandboxImage string
	// Images are image archives imported into every node before its kubelet
	// starts (Containerd.Import).
	Images []string
	// StartTimeout bounds each process's start-up and the wait for each
	// Node to be Ready (default 120 s).
	StartTimeout time.Duration
	// LockWaiting, when set, is called at once when Start has to wait for
	// the host's cluster lock (another cluster runs), with who holds it
	// (LockHolder); Start then waits until ctx ends.
	LockWaiting func(holder string)
}

// Cluster is a set of running nodes of one control plane. Its fields are
// read-only.
type Cluster struct {
	// Dir is the working folder (Options.Dir).
	Dir string
	// Nodes in Options.Nodes order.
	Nodes []*Node
	// NodeIP is the address every kubelet serves and registers on.
	NodeIP string
	// StartDuration is Start → every Node Ready.
	StartDuration time.Duration

	opts        Options
	tmpDir      bool
	logDir      string
	clientCA    string
	kubeletBin  string
	timeout     time.Duration
	hierarchies []string
	chains      map[string]bool // iptables chains before Start
	kubeProxy   *process.Process
	lock        *os.File

	mu      sync.Mutex
	stopped bool
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$`)

// lockPath serialises clusters on a host: kube-proxy owns the host's
// Service rules and the kubelets share its iptables utility chains, so two
// clusters at once would tear down each other's.
const lockPath = "/run/plinth-cluster.lock"

// waitLock takes the lock on the open file lock (at path), waiting while another cluster holds
// it (tests of several packages that each start a cluster take turns) until ctx ends; the
// error then says that another cluster still runs, and who holds the lock. When it has to
// wait, it calls waiting at once, before waiting, with the holder (LockHolder).
func waitLock(ctx context.Context, lock *os.File, path string, waiting func(holder string)) error {
	told := false
	for {
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("lock %s: %w", path, err)
		}
		if !told && waiting != nil {
			waiting(LockHolder(path))
			told = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("another node cluster runs on this host (%s is locked by %s; one at a time): %w", path, LockHolder(path), context.Cause(ctx))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Start starts every node — containerd, images, kubelet — waits until each
// Node is Ready, then starts kube-proxy (when configured) and waits until it
// is healthy. Only one cluster runs on a host at a time: Start first waits for
// the host's lock while another cluster holds it. ctx bounds that wait and
// start-up. On error everything started is stopped and cleaned up; the
// error names the node and ends with the tail of the failing log.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if err := validate(&opts); err != nil {
		return nil, err
	}
	if err := CheckHost(); err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, timeout: opts.StartTimeout, clientCA: opts.ClientCAFile, kubeletBin: opts.Kubelet}
	if c.timeout == 0 {
		c.timeout = 120 * time.Second
	}
	if c.clientCA == "" {
		c.clientCA = opts.CAFile
	}
	if c.NodeIP = opts.NodeIP; c.NodeIP == "" {
		if c.NodeIP, err = HostIP(); err != nil {
			return nil, err
		}
	}
	if c.hierarchies, err = cgroupV1Hierarchies(); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := waitLock(ctx, lock, lockPath, opts.LockWaiting); err != nil {
		lock.Close()
		return nil, err
	}
	c.lock = lock
	if c.Dir = opts.Dir; c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "plinth-cluster-"); err != nil {
			c.unlock()
			return nil, err
		}
		c.tmpDir = true
	}
	if c.Dir, err = filepath.Abs(c.Dir); err != nil {
		c.unlock()
		return nil, err
	}
	defer func() {
		if err != nil {
			if serr := c.Stop(); serr != nil {
				err = fmt.Errorf("%w (and cleaning up: %v)", err, serr)
			}
		}
	}()
	c.logDir = filepath.Join(c.Dir, "logs")
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return nil, err
	}
	c.chains = iptablesChains(ctx)
	t0 := time.Now()

	for i, no := range opts.Nodes {
		n := &Node{
			Name: no.Name, Zone: no.Zone, Dir: filepath.Join(c.Dir, no.Name), logDir: c.logDir, index: i + 1,
			CgroupRoot: "/plinth-" + no.Name, Bridge: fmt.Sprintf("%s%d", bridgePrefix, i+1),
			PodSubnet: fmt.Sprintf("10.244.%d.0/24", i+1), Labels: map[string]string{},
		}
		n.RootDir = filepath.Join(n.Dir, "kubelet")
		n.MountNamespace = filepath.Join(n.Dir, "mntns")
		for k, v := range opts.Labels {
			n.Labels[k] = v
		}
		for k, v := range no.Labels {
			n.Labels[k] = v
		}
		if no.Zone != "" {
			n.Labels[ZoneLabel] = no.Zone
		}
		c.Nodes = append(c.Nodes, n)
	}
	// Nodes start one after the other: on 2 cores, parallel kubelets only
	// slow each other's start-up and make a failure harder to read.
	for _, n := range c.Nodes {
		if err := c.startNode(ctx, n); err != nil {
			return nil, err
		}
	}
	if err := c.WaitReady(ctx); err != nil {
		return nil, err
	}
	// After the nodes: kube-proxy waits for its Node object (the first
	// node's) and reports healthy only once it has it.
	if opts.KubeProxyKubeconfig != "" {
		if err := c.startKubeProxy(ctx); err != nil {
			return nil, err
		}
	}
	c.StartDuration = time.Since(t0)
	return c, nil
}

func validate(opts *Options) error {
	var errs []error
	if opts.APIServer == "" {
		errs = append(errs, errors.New("APIServer is required"))
	}
	if opts.CAFile == "" {
		errs = append(errs, errors.New("CAFile is required"))
	}
	if opts.Admin == nil {
		errs = append(errs, errors.New("Admin is required"))
	}
	if opts.NodeKubeconfig == nil {
		errs = append(errs, errors.New("NodeKubeconfig is required"))
	}
	if opts.Kubelet == "" {
		errs = append(errs, errors.New("Kubelet (path of the kubelet binary, `make testbin`) is required"))
	} else if _, err := os.Stat(opts.Kubelet); err != nil {
		errs = append(errs, fmt.Errorf("kubelet binary: %w (run `make testbin`)", err))
	}
	if opts.KubeProxyKubeconfig != "" {
		if opts.KubeProxy == "" {
			errs = append(errs, errors.New("KubeProxy (path of the kube-proxy binary) is required with KubeProxyKubeconfig"))
		} else if _, err := os.Stat(opts.KubeProxy); err != nil {
			errs = append(errs, fmt.Errorf("kube-proxy binary: %w (run `make testbin`)", err))
		}
	}
	if len(opts.Nodes) == 0 {
		opts.Nodes = DefaultNodes(3)
	}
	if len(opts.Nodes) > 250 {
		errs = append(errs, fmt.Errorf("%d nodes: at most 250 (one /24 of %s each)", len(opts.Nodes), PodCIDR))
	}
	seen := map[string]bool{}
	for i, n := range opts.Nodes {
		if !dnsLabel.MatchString(n.Name) {
			errs = append(errs, fmt.Errorf("Nodes[%d].Name %q: want a lower-case DNS label of at most 40 characters", i, n.Name))
		}
		if seen[n.Name] {
			errs = append(errs, fmt.Errorf("Nodes[%d].Name %q: given twice", i, n.Name))
		}
		seen[n.Name] = true
	}
	for i, p := range opts.NodePaths {
		if !filepath.IsAbs(p) || filepath.Clean(p) == "/" {
			errs = append(errs, fmt.Errorf("NodePaths[%d] %q: want an absolute path below /", i, p))
		}
	}
	for _, img := range opts.Images {
		if _, err := os.Stat(img); err != nil {
			errs = append(errs, fmt.Errorf("image archive: %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("cluster options: %w", errors.Join(errs...))
	}
	return nil
}

func (c *Cluster) startNode(ctx context.Context, n *Node) error {
	if err := os.MkdirAll(n.RootDir, 0o755); err != nil {
		return err
	}
	if err := n.createCgroups(c.hierarchies); err != nil {
		return err
	}
	if err := n.setupMountNamespace(ctx, c.opts.NodePaths); err != nil {
		return fmt.Errorf("node %s: mount namespace: %w", n.Name, err)
	}
	confDir := filepath.Join(n.Dir, "cni-conf")
	if err := n.writeCNIConfig(confDir); err != nil {
		return fmt.Errorf("node %s: CNI config: %w", n.Name, err)
	}
	var err error
	n.containerdOpts = ContainerdOptions{
		Name: n.Name, Dir: filepath.Join(n.Dir, "containerd"), LogDir: c.logDir,
		Binary: c.opts.Containerd, SandboxImage: c.opts.SandboxImage, CNIConfDir: confDir,
		Wrap: n.Enter(), StartTimeout: c.timeout,
	}
	n.Containerd, err = StartContainerd(ctx, n.containerdOpts)
	if err != nil {
		return err
	}
	for _, img := range c.opts.Images {
		if err := n.Import(ctx, img); err != nil {
			return err
		}
	}
	kubeconfig, err := c.opts.NodeKubeconfig(n.Name)
	if err != nil {
		return fmt.Errorf("node %s: kubeconfig: %w", n.Name, err)
	}
	if n.KubeletPort, err = process.FreePort(); err != nil {
		return err
	}
	if n.HealthzPort, err = process.FreePort(); err != nil {
		return err
	}
	return n.startKubelet(ctx, c, kubeconfig)
}

func (c *Cluster) startKubeProxy(ctx context.Context) error {
	hz, err := process.FreePort()
	if err != nil {
		return err
	}
	mport, err := process.FreePort()
	if err != nil {
		return err
	}
	name := "plinth-host"
	if len(c.opts.Nodes) > 0 {
		name = c.opts.Nodes[0].Name
	}
	c.kubeProxy, err = process.Start(ctx, c.opts.KubeProxy, c.logDir, process.Spec{
		Name: "kube-proxy",
		Args: []string{
			"--kubeconfig=" + c.opts.KubeProxyKubeconfig,
			"--proxy-mode=iptables",
			"--hostname-override=" + name,
			"--bind-address=" + c.NodeIP,
			"--cluster-cidr=" + PodCIDR,
			fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz),
			fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mport),
			"--conntrack-max-per-core=0",            // leave the host's conntrack table size alone
			"--iptables-localhost-nodeports=false",  // and its route_localnet sysctl
			"--conntrack-tcp-timeout-established=0", // and its conntrack timeouts
			"--conntrack-tcp-timeout-close-wait=0",
			"--v=1",
		},
		Ready:        process.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/healthz", hz), nil),
		ReadyTimeout: c.timeout,
	})
	if err != nil {
		return fmt.Errorf("kube-proxy did not start: %w", err)
	}
	return nil
}

// WaitReady waits until every node's Node object is Ready (at most
// StartTimeout per node). The error names the nodes that are not, with
// their Ready condition and the tail of their kubelet's log.
func (c *Cluster) WaitReady(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.opts.Admin)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		notReady := map[string]string{}
		for _, n := range c.Nodes {
			if n.kubelet != nil && n.kubelet.Exited() {
				return fmt.Errorf("node %s: %w", n.Name, n.kubelet.Failure(fmt.Sprintf("exited: %v", n.kubelet.Err())))
			}
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				notReady[n.Name] = err.Error()
				continue
			}
			if cond := readyCondition(node); cond == nil || cond.Status != corev1.ConditionTrue {
				notReady[n.Name] = "Ready condition: " + describe(cond)
			}
		}
		if len(notReady) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			var errs []error
			names := make([]string, 0, len(notReady))
			for name := range notReady {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				n := c.Node(name)
				errs = append(errs, fmt.Errorf("node %s not Ready after %s (%s); last lines of %s:\n%s",
					name, c.timeout, notReady[name], n.KubeletLogPath(), process.Indent(n.kubelet.Tail(process.TailLines))))
			}
			return errors.Join(errs...)
		case <-tick.C:
		}
	}
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func describe(c *corev1.NodeCondition) string {
	if c == nil {
		return "not reported yet"
	}
	return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Import loads an image archive into every node's containerd.
func (c *Cluster) Import(ctx context.Context, archive string) error {
	for _, n := range c.Nodes {
		if err := n.Import(ctx, archive); err != nil {
			return err
		}
	}
	return nil
}

// LogPaths returns the log file of every process the cluster started, by
// process name (containerd-<node>, kubelet-<node>, kube-proxy).
func (c *Cluster) LogPaths() map[string]string {
	out := map[string]string{}
	if c.kubeProxy != nil {
		out[c.kubeProxy.Name] = c.kubeProxy.LogPath
	}
	for _, n := range c.Nodes {
		if n.Containerd != nil {
			out["containerd-"+n.Name] = n.Containerd.LogPath()
		}
		if n.kubelet != nil {
			out[n.kubelet.Name] = n.kubelet.LogPath
		}
	}
	return out
}

// PIDs returns the process ids of kube-proxy, every containerd and kubelet.
func (c *Cluster) PIDs() []int {
	var pids []int
	if c.kubeProxy != nil {
		pids = append(pids, c.kubeProxy.PID())
	}
	for _, n := range c.Nodes {
		if n.Containerd != nil {
			pids = append(pids, n.Containerd.PID())
		}
		if n.kubelet != nil {
			pids = append(pids, n.kubelet.PID())
		}
	}
	return pids
}

// Stop ends every node (kubelet, containerd, the pods' processes) and
// kube-proxy, and removes what they made on the host: mounts, mount
// namespaces, cgroup folders, CNI bridges, iptables chains that did not
// exist before Start, and a temporary Dir unless KeepDir. Calling it again
// does nothing. It goes on after an error and returns all of them.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	if c.kubeProxy != nil {
		if err := c.kubeProxy.StopWithin(5 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	// Kubelets first, all of them, so none restarts a pod another node's
	// stop is killing.
	for _, n := range c.Nodes {
		if n.kubelet != nil {
			if err := n.kubelet.StopWithin(5 * time.Second); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		if err := c.Nodes[i].stop(ctx, c.hierarchies); err != nil {
			errs = append(errs, err)
		}
	}
	if c.chains != nil {
		var added []string
		for ch := range iptablesChains(ctx) {
			if !c.chains[ch] && ownChain(ch) {
				added = append(added, ch)
			}
		}
		sort.Strings(added)
		if err := removeChains(ctx, added); err != nil {
			errs = append(errs, fmt.Errorf("iptables: %w", err))
		}
	}
	if c.Dir != "" && c.tmpDir && !c.opts.KeepDir && len(errs) == 0 {
		// Never delete through a mount: that would remove a host folder's files.
		if m, err := MountsUnder(c.Dir); err != nil || len(m) > 0 {
			errs = append(errs, fmt.Errorf("not removing %s: mounts left under it %v (%v)", c.Dir, m, err))
		} else if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	c.unlock()
	return errors.Join(errs...)
}

// ownChain reports whether an iptables chain is one kubelet or kube-proxy
// makes (KUBE-*) or a CNI plugin (CNI-*), the only chains Stop removes.
func ownChain(tableChain string) bool {
	_, chain, _ := strings.Cut(strings.TrimPrefix(tableChain, "6:"), "/")
	return strings.HasPrefix(chain, "KUBE-") || strings.HasPrefix(chain, "CNI-")
}

func (c *Cluster) unlock() {
	if c.lock != nil {
		_ = syscall.Flock(int(c.lock.Fd()), syscall.LOCK_UN)
		c.lock.Close()
		c.lock = nil
	}
}
