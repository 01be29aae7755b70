package guestnode

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/test/framework/cluster"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/registry"
	"github.com/plinth-storage/plinth/test/kernel/apimux"
	"github.com/plinth-storage/plinth/test/kernel/guest"
	"github.com/plinth-storage/plinth/test/kernel/netrelay"
)

// EnvGuestKubelet gates the suite: it boots two qemu guests and joins their kubelets.
const EnvGuestKubelet = "PLINTH_GUEST_KUBELET"

// The guests as nodes: names, their NICs and addresses on the relay's private network (the
// Nodes' InternalIPs), their pod subnets.
type nodeSpec struct {
	name, mac, addr, podSubnet string
	side                       func(*netrelay.Relay) *netrelay.Side
	// stateDisk is the node's disk for /var/lib/plinth ("": the root's tmpfs).
	stateDisk string
}

// The storage node's /var/lib/plinth is on the disk the hand-made phase's agent used
// (handStateDisk, wiped by its teardown).
var nodeSpecs = []nodeSpec{
	{name: "storage-0", mac: "52:54:00:77:00:01", addr: "192.168.77.1", podSubnet: "10.244.1.0/24", stateDisk: handStateDisk,
		side: func(r *netrelay.Relay) *netrelay.Side { return r.A }},
	{name: "worker-a", mac: "52:54:00:77:00:02", addr: "192.168.77.2", podSubnet: "10.244.2.0/24",
		side: func(r *netrelay.Relay) *netrelay.Side { return r.B }},
}

// Where kubelet serves (the standard ports) and the folders and files the node uses, as the
// guest sees them.
const (
	kubeletPort    = 10250
	kubeletHealthz = 10248
	containerdSock = "/run/containerd/containerd.sock"
	caFile         = "/etc/kubernetes/pki/ca.crt"
	cniConfDir     = "/etc/cni/net.d"
	busyboxImage   = "docker.io/library/busybox:plinth"
	// guestRegistryPort is where the guest reaches the host's registry (its end of a second
	// API mux, on 127.0.0.1).
	guestRegistryPort = 5000
	// keyServerPort is the key server's Service port, as the shipped --key-server URL names it.
	// The guests have no cluster DNS: their /etc/hosts (which kubelet gives hostNetwork pods)
	// maps keyServerHost to 127.0.0.1, where svcforward carries connections to the Service's
	// ClusterIP once the chart made it (startServiceForward).
	keyServerPort = 8443
	keyServerHost = "plinth-key-server.plinth-system.svc"
)

// guestRegistry is the host's registry as the guests reach it: the chart's production values
// name every image there (repository 127.0.0.1:5000/plinth-storage/plinth..., the path and tag
// `make push` gives it, test/framework/registry.Target).
var guestRegistry = fmt.Sprintf("127.0.0.1:%d", guestRegistryPort)

// registryMirror, appended to the node's containerd config, lets containerd pull from that
// registry over plain HTTP (it is on the node's loopback, as a registry mirror would be).
var registryMirror = fmt.Sprintf(`[plugins."io.containerd.grpc.v1.cri".registry.mirrors."%[1]s"]
  endpoint = ["http://%[1]s"]
`, guestRegistry)

// node is one booted guest and its node.
type node struct {
	nodeSpec
	g *guest.Guest
	// hostPort is the host's 127.0.0.1 port forwarded to the guest's kubelet port.
	hostPort int
}

func (n *node) sh(t testing.TB, timeout time.Duration, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := n.g.Run(ctx, script, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s: %s: exit %d, %v\n%s", n.name, script, res.ExitCode, err, res.Output)
	}
	return string(res.Output)
}

func (n *node) try(timeout time.Duration, script string) string {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := n.g.Run(ctx, script, nil)
	if err != nil {
		return string(res.Output) + err.Error()
	}
	return string(res.Output)
}

// uptime is the guest's clock (seconds since its kernel started).
func (n *node) uptime(t testing.TB) string {
	return strings.Fields(n.sh(t, time.Minute, "cut -d' ' -f1 /proc/uptime"))[0]
}

func writeShare(t testing.TB, g *guest.Guest, name string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(g.ShareDir(), name), data, mode); err != nil {
		t.Fatal(err)
	}
}

func copyShare(t testing.TB, g *guest.Guest, name, src string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	writeShare(t, g, name, data, 0o755)
}

// joinScript makes the booted guest a node: plinth-node-up, the API mux, the node's address on
// the private network, containerd (config from the share), the image archives, kubelet and
// kube-proxy. The API mux listens on the API server's own port on every address, and the
// guest holds the host's address (apiHost, what the API server advertises as the `kubernetes`
// Service's endpoint) on its loopback device: kubelet and kube-proxy reach 127.0.0.1:<port>,
// pods reach the Service, which kube-proxy sends to apiHost:<port> — both end at the mux, the
// guest's only way to the host. Pods reach the other node's pods through a route to its pod
// subnet via its address on the private network (what a host-gateway CNI sets up).
func joinScript(n *node, other nodeSpec, apiHost string, apiPort int) string {
	return fmt.Sprintf(`set -e
S=%[1]s
plinth-node-up %[2]s
ip addr add %[11]s/32 dev lo
cp $S/apimux /usr/bin/apimux
(apimux -listen 0.0.0.0:%[3]d -upstream %[4]s:6443 >/var/log/apimux.log 2>&1 &)
(apimux -listen 127.0.0.1:%[13]d -upstream %[4]s:%[13]d >/var/log/apimux-registry.log 2>&1 &)
cp $S/svcforward /usr/bin/svcforward
echo "127.0.0.1 %[15]s" >> /etc/hosts
for i in /sys/class/net/*; do [ "$(cat $i/address)" = %[5]s ] && dev=${i##*/}; done
[ -n "$dev" ] || { echo "no NIC with MAC %[5]s"; exit 1; }
ip addr replace %[6]s/24 dev $dev && ip link set $dev up
ip route add %[16]s via %[17]s dev $dev
sysctl -qw net.ipv4.ip_forward=1
%[18]s
cp $S/containerd.toml /etc/containerd/config.toml
cp $S/10-plinth-bridge.conflist %[7]s/
cp $S/ca.crt %[8]s
cp $S/kubelet.yaml /etc/kubernetes/kubelet.yaml
cp $S/kubelet.kubeconfig /etc/kubernetes/kubelet.kubeconfig
cp $S/kube-proxy.kubeconfig /etc/kubernetes/kube-proxy.kubeconfig
(containerd --config /etc/containerd/config.toml >/var/log/containerd.log 2>&1 &)
i=0; until ctr -a %[9]s version >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 240 ] || { tail -20 /var/log/containerd.log; exit 1; }; sleep 0.5; done
echo "containerd up $(cut -d' ' -f1 /proc/uptime)"
for a in $S/images/*.tar; do ctr -a %[9]s -n k8s.io images import "$a" >/dev/null; done
echo "images imported $(cut -d' ' -f1 /proc/uptime)"
(kubelet --config=/etc/kubernetes/kubelet.yaml --kubeconfig=/etc/kubernetes/kubelet.kubeconfig \
  --hostname-override=%[2]s --node-ip=%[6]s --root-dir=/var/lib/kubelet --cert-dir=/var/lib/kubelet/pki \
  --v=1 >/var/log/kubelet.log 2>&1 &)
(kube-proxy --kubeconfig=/etc/kubernetes/kube-proxy.kubeconfig --proxy-mode=iptables --hostname-override=%[2]s \
  --bind-address=%[6]s --cluster-cidr=%[12]s --healthz-bind-address=127.0.0.1:10256 \
  --metrics-bind-address=127.0.0.1:10249 --v=1 >/var/log/kube-proxy.log 2>&1 &)
i=0; until wget -q -O /dev/null http://127.0.0.1:%[10]d/healthz 2>/dev/null; do i=$((i+1)); [ $i -lt 240 ] || { tail -30 /var/log/kubelet.log; exit 1; }; sleep 0.5; done
echo "kubelet healthy $(cut -d' ' -f1 /proc/uptime)"`,
		guest.SharePath, n.name, apiPort, guest.GuestForwardAddr, n.mac, n.addr, cniConfDir, caFile,
		containerdSock, kubeletHealthz, apiHost, cluster.PodCIDR, guestRegistryPort, keyServerPort, keyServerHost,
		other.podSubnet, other.addr, stateDiskScript(n.stateDisk))
}

// stateDiskScript mounts the node's state disk, when it has one, at /var/lib/plinth (made
// ext4 at its first use): the agent's state outlives a reboot, as on a real node's disk.
func stateDiskScript(disk string) string {
	if disk == "" {
		return ""
	}
	return fmt.Sprintf("mkdir -p /var/lib/plinth && { blkid %[1]s >/dev/null || mkfs.ext4 -q %[1]s; } && mount %[1]s /var/lib/plinth", disk)
}

func goBuild(t *testing.T, root, out, pkg string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// Expected: both guests boot the node initramfs, run containerd and a kubelet that registers
// its Node with the host's API server under its own node credentials (system:node:<name>), and
// each Node becomes Ready with its private-network address as InternalIP; a busybox pod bound
// to each node runs to completion, and its log, read through the API server (which reaches
// the guest's kubelet through the egress proxy), is what the container printed.
func TestGuestKubelet(t *testing.T) {
	if os.Getenv(EnvGuestKubelet) != "1" {
		t.Skip("boots two qemu guests as Kubernetes nodes: set " + EnvGuestKubelet + "=1 (after make testbin, make images and make kernel-node-assets)")
	}
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubeControllerManager,
		controlplane.BinPlinthScheduler)
	ctrllog.SetLogger(testr.New(t))
	// pause and busybox are imported from their archives; every image the chart names is
	// pulled from the registry (see guestRegistry)
	images := controlplane.ImageArchives(t, "pause", "busybox")
	chartArchives := controlplane.ImageArchives(t, "plinth", "plinth-scheduler", "csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter")
	t0 := time.Now()
	work := t.TempDir()
	egress, err := StartEgress(filepath.Join(work, "egress.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { egress.Close() })
	egressCfg := filepath.Join(work, "egress-selector.yaml")
	if err := os.WriteFile(egressCfg, EgressSelectorConfig(egress.Socket), 0o644); err != nil {
		t.Fatal(err)
	}
	// Scheduler: DaemonSet pods are bound by the default scheduler
	cp := controlplane.ForTest(t, controlplane.Options{Nodes: true, Scheduler: true, StartTimeout: 3 * time.Minute,
		APIServerArgs: []string{"--egress-selector-config-file=" + egressCfg}})
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	root, err := controlplane.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	goBuild(t, root, filepath.Join(work, "apimux"), "./test/kernel/cmd/apimux")
	goBuild(t, root, filepath.Join(work, "svcforward"), "./test/kernel/guestnode/cmd/svcforward")
	hand := prepareHandMade(t, root, work)
	apiURL, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	apiPort, err := strconv.Atoi(apiURL.Port())
	if err != nil {
		t.Fatal(err)
	}
	guestAPI := fmt.Sprintf("https://127.0.0.1:%d", apiPort) // the guest's end of the API mux
	proxyUser, err := cp.AddUser(controlplane.User{Name: "system:kube-proxy"})
	if err != nil {
		t.Fatal(err)
	}
	proxyKC, err := cp.KubeconfigFor(proxyUser.Name, guestAPI)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(cp.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TIMING control plane + build %s", time.Since(t0).Round(time.Millisecond))

	// Debian's docker-registry on the host's loopback, with the chart's images pushed as `make
	// push` pushes them; each guest reaches it through its own API-mux pair on guestRegistryPort.
	regDir := filepath.Join(work, "registry")
	if err := os.MkdirAll(regDir, 0o755); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.StartServer(t.Context(), registry.ServerOptions{Dir: regDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Stop() }) //nolint:errcheck
	pushStart := time.Now()
	pushed, err := registry.Push(t.Context(), reg.Addr, false, chartArchives...)
	if err != nil {
		t.Fatalf("push %v: %v", chartArchives, err)
	}
	if len(pushed) != len(chartArchives) {
		t.Fatalf("pushed %d images of %d archives", len(pushed), len(chartArchives))
	}
	for _, p := range pushed {
		t.Logf("pushed %s as %s (%s)", p.Source, p.Target, p.Digest)
	}
	t.Logf("TIMING %d images pushed in %s", len(pushed), time.Since(pushStart).Round(time.Millisecond))
	regDemux := apimux.StartForTest(t, "http://"+reg.Addr)

	relay, err := netrelay.Start(nodeSpecs[0].mac, nodeSpecs[1].mac)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	demux := apimux.StartForTest(t, cp.URL)
	nodes := make([]*node, len(nodeSpecs))
	for i, spec := range nodeSpecs {
		port, err := controlplane.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = &node{nodeSpec: spec, hostPort: port}
		egress.Route(fmt.Sprintf("%s:%d", spec.addr, kubeletPort), fmt.Sprintf("127.0.0.1:%d", port))
	}

	// Both guests boot at once, each on one vCPU; the hand-made phase runs on them, then each
	// joins (in parallel). The storage guest's disks: the kubelet phase's pool (/dev/vda), the
	// hand-made phase's pool and agent state (handPoolDisk, handStateDisk); its WorkDir keeps
	// them over a reboot.
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	opts := make([]guest.Options, len(nodes))
	bootStart := time.Now()
	// Each guest lives as long as the suite may (its -timeout; the Makefile gives 80m): a
	// fixed 40 minutes killed the worker mid-suite on a loaded host (timeout(1)'s exit 124,
	// in the steps after the helm upgrade). Cleanup stops both.
	life := 80 * time.Minute
	if d, ok := t.Deadline(); ok {
		life = time.Until(d) + time.Minute
	}
	for i, n := range nodes {
		opts[i] = guest.Options{Flavor: guest.FlavorNode, MemoryMiB: 2560,
			Timeout: life, BootTimeout: 5 * time.Minute,
			GuestForwards: append([]guest.Forward{{HostPort: demux.Port(), GuestPort: 6443}, {HostPort: regDemux.Port(), GuestPort: guestRegistryPort}},
				hand.guestForwards()...),
			HostForwards: append([]guest.Forward{{HostPort: n.hostPort, GuestPort: kubeletPort}}, hand.hostForwards(i == 0)...),
			ExtraArgs:    n.side(relay).NetdevArgs("p0")}
		if i == 0 {
			opts[i].DiskBytes = []int64{2 << 30, 2 << 30, 64 << 20}
			opts[i].WorkDir = t.TempDir()
		} else { // the worker's /dev/vdb: its disk of the spread pool (SpreadAcrossZones)
			opts[i].DiskBytes = []int64{64 << 20, 2 << 30}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.g, errs[i] = guest.Boot(t.Context(), opts[i])
		}()
	}
	wg.Wait()
	for i, n := range nodes {
		if n.g != nil {
			t.Cleanup(func() { n.g.Stop() }) //nolint:errcheck
		}
		if errs[i] != nil {
			t.Fatalf("boot %s: %v", n.name, errs[i])
		}
		t.Logf("TIMING %s booted in %s", n.name, n.g.BootTime.Round(time.Millisecond))
	}
	t.Logf("TIMING both guests booted %s", time.Since(bootStart).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("%s:\n%s", n.name, n.try(time.Minute, "tail -n 40 /var/log/kubelet.log; echo ---; tail -n 15 /var/log/containerd.log; echo ---; tail -n 5 /var/log/apimux.log; echo ---; tail -n 10 /var/log/kube-proxy.log; free -m"))
			}
		}
	})

	// The hand-made phase, then its teardown: the kubelet phase starts on guests that hold
	// nothing of it (its control plane stops here too).
	handStart := time.Now()
	hs := hand.newSuite(nodes[0].g, nodes[1].g, opts[0], relay)
	t.Run("HandMade", func(t *testing.T) {
		hand.start(t, hs)
		testHandMade(t, hs)
	})
	if hs.storage == nil {
		t.Fatal("the storage guest did not boot again in the hand-made phase")
	}
	nodes[0].g = hs.storage.g // rebooted in StorageRebootRestoresExports
	hs.teardown(t)
	if err := hand.cp.Stop(); err != nil {
		t.Errorf("stop the hand-made phase's control plane: %v", err)
	}
	t.Logf("TIMING hand-made phase with its teardown %s", time.Since(handStart).Round(time.Millisecond))

	for _, n := range nodes {
		if _, err := cp.NodeKubeconfig(n.name); err != nil {
			t.Fatal(err)
		}
		kc, err := cp.KubeconfigFor("system:node:"+n.name, guestAPI)
		if err != nil {
			t.Fatal(err)
		}
		writeShare(t, n.g, "kubelet.kubeconfig", kc, 0o600)
		writeShare(t, n.g, "kube-proxy.kubeconfig", proxyKC, 0o600)
		writeShare(t, n.g, "ca.crt", ca, 0o644)
		writeShare(t, n.g, "containerd.toml", []byte(cluster.RenderContainerdConfig(cluster.ContainerdConfigFiles{
			Root: "/var/lib/containerd", State: "/run/containerd", Socket: containerdSock, Opt: "/opt/containerd",
			CNIConfDir: cniConfDir})+registryMirror), 0o644)
		writeShare(t, n.g, "10-plinth-bridge.conflist", []byte(cluster.RenderCNIConfig("plinth-"+n.name, "cni0", "/var/lib/cni/networks", n.podSubnet)), 0o644)
		writeShare(t, n.g, "kubelet.yaml", []byte(cluster.RenderKubeletConfig(cluster.KubeletConfigValues{
			ClientCAFile: caFile, CgroupRoot: "/", RuntimeEndpoint: "unix://" + containerdSock,
			// every address (kubelet's default): the host's hostfwd arrives on the guest's
			// user-network address, the Node reports the private one
			Address: "0.0.0.0", Port: kubeletPort, HealthzPort: kubeletHealthz})), 0o644)
		copyShare(t, n.g, "apimux", filepath.Join(work, "apimux"))
		copyShare(t, n.g, "svcforward", filepath.Join(work, "svcforward"))
		if err := os.MkdirAll(filepath.Join(n.g.ShareDir(), "images"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, a := range images {
			copyShare(t, n.g, filepath.Join("images", filepath.Base(a)), a)
		}
	}
	// join makes the booted guest of nodes[i] a node (at first, and after a reboot).
	join := func(t *testing.T, i int) error {
		n := nodes[i]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		res, err := n.g.Run(ctx, joinScript(n, nodes[1-i].nodeSpec, cp.NodeIP, apiPort), nil)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d", res.ExitCode)
		}
		if err != nil {
			return fmt.Errorf("%s: join: %w\n%s", n.name, err, res.Output)
		}
		t.Logf("%s (guest clock):\n%s", n.name, res.Output)
		return nil
	}
	joinStart := time.Now()
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = join(t, i)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("TIMING containerd and kubelet up on both %s", time.Since(joinStart).Round(time.Millisecond))

	for _, n := range nodes {
		controlplane.Eventually(t, 5*time.Minute, time.Second, "node "+n.name+" Ready", func() error {
			nd, err := cs.CoreV1().Nodes().Get(t.Context(), n.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range nd.Status.Conditions {
				if c.Type == corev1.NodeReady {
					if c.Status != corev1.ConditionTrue {
						return fmt.Errorf("Ready=%s: %s", c.Status, c.Message)
					}
					return nil
				}
			}
			return fmt.Errorf("no Ready condition yet")
		})
		nd, err := cs.CoreV1().Nodes().Get(t.Context(), n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var internal string
		for _, a := range nd.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = a.Address
			}
		}
		if internal != n.addr || nd.Status.DaemonEndpoints.KubeletEndpoint.Port != kubeletPort {
			t.Errorf("node %s: InternalIP %q port %d, want %s and %d", n.name, internal, nd.Status.DaemonEndpoints.KubeletEndpoint.Port, n.addr, kubeletPort)
		}
		t.Logf("node %s Ready: kernel %s, runtime %s, kubelet %s", n.name, nd.Status.NodeInfo.KernelVersion,
			nd.Status.NodeInfo.ContainerRuntimeVersion, nd.Status.NodeInfo.KubeletVersion)
	}
	t.Logf("TIMING both nodes Ready %s after the join started", time.Since(joinStart).Round(time.Millisecond))

	podStart := time.Now()
	for _, n := range nodes {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hello-" + n.name, Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: n.name, RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "hello", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
					Command: []string{"sh", "-c", "echo hello from $(hostname) on $(uname -r); cat /sys/fs/cgroup/cgroup.controllers >/dev/null && echo cgroup2"}}},
				TerminationGracePeriodSeconds: ptr.To[int64](1)}}
		// the ServiceAccount admission plugin refuses pods until the controller made "default"
		controlplane.Eventually(t, 2*time.Minute, time.Second, "create pod on "+n.name, func() error {
			_, err := cs.CoreV1().Pods("default").Create(t.Context(), pod, metav1.CreateOptions{})
			return err
		})
	}
	for _, n := range nodes {
		name := "hello-" + n.name
		controlplane.Eventually(t, 5*time.Minute, time.Second, "pod "+name+" Succeeded", func() error {
			p, err := cs.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase == corev1.PodFailed {
				t.Fatalf("pod %s failed: %+v", name, p.Status)
			}
			if p.Status.Phase != corev1.PodSucceeded {
				return fmt.Errorf("phase %s: %+v", p.Status.Phase, p.Status.ContainerStatuses)
			}
			return nil
		})
		before := egress.Dials(fmt.Sprintf("%s:%d", n.addr, kubeletPort))
		logs, err := cs.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
		if err != nil {
			t.Fatalf("logs of %s through the API server: %v", name, err)
		}
		want := fmt.Sprintf("hello from %s on ", name)
		if !strings.Contains(string(logs), want) || !strings.Contains(string(logs), "cgroup2") {
			t.Errorf("logs of %s: %q, want %q... and cgroup2", name, logs, want)
		}
		if after := egress.Dials(fmt.Sprintf("%s:%d", n.addr, kubeletPort)); after != before+1 {
			t.Errorf("the API server dialled %s's kubelet %d times for the logs, want once through the egress proxy", n.name, after-before)
		}
		t.Logf("logs of %s: %s", name, strings.TrimSpace(string(logs)))
	}
	t.Logf("TIMING pods created → logs read on both nodes %s", time.Since(podStart).Round(time.Millisecond))

	for _, n := range nodes {
		controlplane.Eventually(t, 5*time.Minute, time.Second, n.name+": kube-proxy's rule for the kubernetes Service", func() error {
			if out := n.sh(t, time.Minute, "iptables-save -t nat | grep -c 'default/kubernetes:https' || true"); strings.TrimSpace(out) == "0" {
				return fmt.Errorf("none in iptables-save -t nat; kube-proxy's log:\n%s", n.try(time.Minute, "tail -n 20 /var/log/kube-proxy.log"))
			}
			return nil
		})
	}
	if t.Failed() {
		return
	}
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: csi.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	s := &scene{cs: cs, c: c, cp: cp, root: root, work: work, nodes: nodes, relay: relay, reg: reg.Addr,
		storageOpts: opts[0], join: join, cleanup: t.Cleanup}
	// Every step needs the release and the writer's volume: a failure of the first two ends the
	// test; the others run on after a failure of one of them.
	for i, step := range []struct {
		name string
		run  func(*testing.T, *scene)
	}{
		{"HelmInstall", testHelmInstall},
		{"NVMeoFVolumeOnWorker", testNVMeVolume},
		{"ShortLinkCutPausesIO", testShortCut},
		{"LongLinkCutFailsIOThenRestartRecovers", testLongCut},
		{"StorageNodeRebootRestoresExports", testStorageReboot},
		{"HelmUpgradeUnderMounts", testHelmUpgrade},
		{"HelmUninstallKeepsDataReinstallAdopts", testReinstall},
		{"PodMovedRevokesTheOldHostFirst", testMove},
		{"LocalVolumeGrownOnline", testLocalGrow},
		{"TierLimitsOnCgroupV2", testTierLimits},
		{"NodeLacksModules", testNodeLacksModules},
		{"SpreadAcrossZones", testSpread},
	} {
		stepStart := time.Now()
		ok := t.Run(step.name, func(t *testing.T) { step.run(t, s) })
		t.Logf("TIMING step %s %s", step.name, time.Since(stepStart).Round(time.Millisecond))
		if !ok && i < 2 {
			return
		}
	}
}
