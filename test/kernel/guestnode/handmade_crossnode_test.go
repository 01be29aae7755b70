package guestnode

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/kernel/apimux"
	"github.com/plinth-storage/plinth/test/kernel/guest"
	"github.com/plinth-storage/plinth/test/kernel/netrelay"
)

// The private network and the identities of the two guests.
const (
	storageNode = "storage-0"
	// workerA is the node plugin of the worker guest. workerB is a second node plugin with its
	// own Node and host NQN, run in the STORAGE guest: a second initiator identity in another
	// kernel (two identities in one kernel would share one multipath head, so the stale node's
	// I/O could leave through the new node's path). B reaches the target on the storage guest's
	// own address, A across the relay.
	workerA = "worker-a"
	workerB = "worker-b"

	storageMAC  = "52:54:00:77:00:01"
	workerMAC   = "52:54:00:77:00:02"
	storageAddr = "192.168.77.1"
	workerAddr  = "192.168.77.2"

	hostNQNA = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000a1"
	hostNQNB = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000b2"

	// The protocol's timers (seconds) and queue depth; the kernel must show them back.
	// ctrlLossTmo / reconnectDelay = 6 reconnect attempts (drivers/nvme/host/fabrics.c counts
	// attempts, not time); each attempt over a cut link fails after nvme-tcp's one SYN retry.
	maxQueueSize = 64

	pool = "xthin"
	vg   = "plinth-x"
)

// vm is one guest with shell helpers.
type vm struct {
	name string
	g    *guest.Guest
}

// try runs script in the guest; the exit code is -1 when the guest could not run it.
func (v *vm) try(timeout time.Duration, script string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := v.g.Run(ctx, script, nil)
	if err != nil {
		return string(res.Output) + err.Error(), -1
	}
	return string(res.Output), res.ExitCode
}

// sh runs script and fails t unless it exits 0.
func (v *vm) sh(t testing.TB, timeout time.Duration, script string) string {
	t.Helper()
	out, code := v.try(timeout, script)
	if code != 0 {
		t.Fatalf("%s: %s: exit %d\n%s", v.name, script, code, out)
	}
	return out
}

// suite is the hand-made phase on the booted pair: its own control plane and clients.
type suite struct {
	c       client.Client
	relay   *netrelay.Relay
	storage *vm
	worker  *vm
	ctrl    csipb.ControllerClient
	group   csipb.GroupControllerClient
	nodeA   csipb.NodeClient
	nodeB   csipb.NodeClient
	// storageOpts boot the storage guest again (same WorkDir: same disk) in a reboot.
	storageOpts guest.Options
	// keys is the key server the agent and node plugins get their keys from.
	keys *keyServer
}

// The hand-made phase's ends in the guests, apart from the kubelet phase's (the API server on
// 6443, the key server Service on 8443), so that nothing of one phase answers the other: its
// API mux (to its own control plane) and its node plugins' CSI ports, forwarded to the host.
const (
	handAPIGuestPort = 6444
	nodePortA        = 50051
	nodePortB        = 50052
	// handPoolDisk and handStateDisk are the storage guest's second and third virtio disks:
	// the hand-made pool's and the agent's state (the kubelet phase's pool is on /dev/vda).
	handPoolDisk  = "/dev/vdb"
	handStateDisk = "/dev/vdc"
)

// apimuxScript starts the guest's end of the API mux (the binaries are in the share).
// copyTimeout bounds copying the plinth and apimux binaries (~100 MB) from the 9p share into the
// guest's tmpfs: under software emulation on a loaded host this alone has taken over a minute.
const copyTimeout = 4 * time.Minute

// The key server's mux (keyServerMuxScript) starts with it; /tmp/apimux-hand.pid is the API mux.
var apimuxScript = fmt.Sprintf("cp %[1]s/apimux %[1]s/plinth /tmp/ && (/tmp/apimux -listen 127.0.0.1:%[3]d -upstream %[2]s:%[3]d >/tmp/apimux.log 2>&1 & echo $! > /tmp/apimux-hand.pid) && %[4]s",
	guest.SharePath, guest.GuestForwardAddr, handAPIGuestPort, keyServerMuxScript)

// nodePluginScript starts a node plugin serving CSI on TCP port (forwarded to the host), with
// its keys from the key server; /tmp/csi-<node>.pid is its pid.
func nodePluginScript(node, nqnFile string, port int) string {
	return fmt.Sprintf("(/tmp/plinth csi --mode node --endpoint tcp://0.0.0.0:%d --node-name %s --kubeconfig %s/kubeconfig %s "+
		"--state-dir /tmp/csi-%s --host-nqn-file %s --registration-dir= --health-address= --metrics-address %s --volume-health-interval 2s -v 2 >/tmp/csi-%s.log 2>&1 & echo $! > /tmp/csi-%s.pid)",
		port, node, guest.SharePath, keyServerFlags(node), node, nqnFile, nodeMetricsAddr(port), node, node)
}

// setUpStorage starts, in the storage guest (at boot and after a reboot), the API mux, its
// private address, the agent's state disk (handStateDisk at /var/lib/plinth), the agent under
// a restart loop and node plugin B. The loop restarts the agent whenever it exits (as kubelet
// restarts a container) with the crash points named in /tmp/agent-failpoints
// (internal/failpoint; "once" points are remembered in the agent's state dir), recording each
// exit code in /tmp/agent-exits; /tmp/agent.pid is the running agent, /tmp/agent-loop.pid the
// loop.
func (s *suite) setUpStorage(t *testing.T) {
	t.Helper()
	s.storage.sh(t, copyTimeout, apimuxScript)
	setIP(t, s.storage, storageMAC, storageAddr+"/24")
	// the agent's state (fencing marks) lives on the node's disk, as /var/lib/plinth does
	s.storage.sh(t, time.Minute, fmt.Sprintf("mkdir -p /var/lib/plinth && { blkid %[1]s >/dev/null || mkfs.ext4 -q %[1]s; } && mount %[1]s /var/lib/plinth", handStateDisk))
	s.storage.sh(t, time.Minute, fmt.Sprintf(`cat > /tmp/agent-loop.sh <<'LOOP'
while :; do
  PLINTH_FAILPOINTS=$(cat /tmp/agent-failpoints 2>/dev/null) /tmp/plinth agent --node %s --kubeconfig %s/kubeconfig %s \
    --state-dir /var/lib/plinth --refresh-interval 10s --metrics-bind-address %s --health-probe-bind-address 0 --v 1 >>/tmp/agent.log 2>&1 &
  echo $! > /tmp/agent.pid
  wait $!
  echo $? >> /tmp/agent-exits
done
LOOP
(sh /tmp/agent-loop.sh >/dev/null 2>&1 & echo $! > /tmp/agent-loop.pid)`, storageNode, guest.SharePath, keyServerFlags(storageNode), agentMetricsAddr))
	// worker B: a second initiator identity, in this guest (see workerB)
	s.storage.sh(t, time.Minute, fmt.Sprintf("echo %s > /tmp/hostnqn-b && %s", hostNQNB, nodePluginScript(workerB, "/tmp/hostnqn-b", nodePortB)))
}

func grpcClient(t *testing.T, target string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			if strings.HasPrefix(addr, "/") {
				return (&net.Dialer{}).DialContext(ctx, "unix", addr)
			}
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// setIP gives the NIC with mac the address in the guest (the guests' own addresses on the
// relay's network).
func setIP(t *testing.T, v *vm, mac, cidr string) {
	v.sh(t, time.Minute, fmt.Sprintf(`for i in /sys/class/net/*; do [ "$(cat $i/address)" = %s ] && dev=${i##*/}; done
[ -n "$dev" ] || { echo "no NIC with MAC %s"; exit 1; }
ip addr add %s dev $dev && ip link set $dev up`, mac, mac, cidr))
}

func create(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(t.Context(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// handMade is what the hand-made phase needs before the pair boots: its own control plane
// (Plinth's CRDs, the policy as the controller renders it, no controller: the objects are
// made here), the guests' forwards to it and to its key server, and the plinth binary.
type handMade struct {
	cp           *controlplane.ControlPlane
	c            client.Client
	demux        *apimux.Demux
	keys         *keyServer
	portA, portB int
	work         string
	store        string
}

// prepareHandMade starts the hand-made phase's control plane and key server and builds what
// its guests run (apimux is the kubelet phase's build, in work).
func prepareHandMade(t *testing.T, root, work string) *handMade {
	t.Helper()
	t0 := time.Now()
	cp := controlplane.ForTest(t, controlplane.Options{})
	if _, err := envtest.InstallCRDs(cp.Admin.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(root, "schema", "crd", "bases")}, ErrorIfPathMissing: true,
	}); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: csi.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	h := &handMade{cp: cp, c: c, work: work}
	goBuild(t, root, filepath.Join(h.work, "plinth"), "./cmd/plinth")
	t.Logf("TIMING hand-made phase: control plane + build %s", time.Since(t0).Round(time.Millisecond))

	// The policy as the controller renders it: a thin pool on the storage guest's second disk,
	// exported over NVMe-oF/TCP on the private network with an ACL.
	backend := policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: vg, Devices: []string{handPoolDisk},
		ThinPool: &policyv1.ThinPool{Name: "pool", SizePercent: 80}}}
	for _, n := range []string{storageNode, workerA, workerB} {
		create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	create(t, c, &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: pool}, Spec: policyv1.StoragePoolSpec{Backend: backend}})
	create(t, c, &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: pool + "-nvme"}, Spec: policyv1.ProtocolSpec{
		NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: nvmePort, BindCIDR: netCIDR, ACL: ptr.To(true), MaxQueueSize: maxQueueSize,
			CtrlLossTmo: ptr.To[int32](ctrlLossTmo), ReconnectDelay: reconnectDelay}}})
	create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: pool + "-nvme"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: pool}, ProtocolRef: policyv1.LocalObjectReference{Name: pool + "-nvme"},
		StorageClass: policyv1.StorageClassTemplate{Name: pool + "-nvme"},
		Filesystem:   policyv1.Filesystem{FSType: "ext4"},
	}})
	// a second class for the storage reboot: the host keeps reconnecting for 10 minutes
	create(t, c, &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: pool + "-patient"}, Spec: policyv1.ProtocolSpec{
		NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: nvmePort, BindCIDR: netCIDR, ACL: ptr.To(true),
			CtrlLossTmo: ptr.To[int32](600), ReconnectDelay: reconnectDelay}}})
	create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: pool + "-patient"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: pool}, ProtocolRef: policyv1.LocalObjectReference{Name: pool + "-patient"},
		StorageClass: policyv1.StorageClassTemplate{Name: pool + "-patient"},
		Filesystem:   policyv1.Filesystem{FSType: "ext4"},
	}})
	// the first class, encrypted (LUKS2 on the consumer, a key Secret per volume in Plinth's
	// namespace): EncryptedOnTheWire
	create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: pool + "-luks"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: pool}, ProtocolRef: policyv1.LocalObjectReference{Name: pool + "-nvme"},
		StorageClass: policyv1.StorageClassTemplate{Name: pool + "-luks"},
		Filesystem:   policyv1.Filesystem{FSType: "ext4"},
		Encryption:   &policyv1.Encryption{},
	}})
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: policyv1.VolumeKeyNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	h.store = storev1.StoreName(pool, storageNode)
	create(t, c, &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: storageNode, Labels: map[string]string{policyv1.LabelNode: storev1.NameLabelValue(storageNode)}},
		Spec: storev1.AgentSpec{NodeName: storageNode, Stores: []string{h.store}, NVMeoF: &storev1.NVMeoFEndpoint{Port: nvmePort, BindCIDR: netCIDR}}})
	create(t, c, &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: h.store, Labels: map[string]string{
		policyv1.LabelPool: storev1.NameLabelValue(pool), policyv1.LabelNode: storev1.NameLabelValue(storageNode)}},
		Spec: storev1.StoreSpec{Pool: pool, NodeName: storageNode, Backend: backend, Reserve: "5%", OvercommitPercent: 400}})

	h.demux = apimux.StartForTest(t, cp.URL)
	h.keys = startKeyServer(t, c, cp.Admin.Config)
	if h.portA, err = controlplane.FreePort(); err != nil {
		t.Fatal(err)
	}
	if h.portB, err = controlplane.FreePort(); err != nil {
		t.Fatal(err)
	}
	return h
}

// guestForwards are both guests' ways to the phase's API server and key server.
func (h *handMade) guestForwards() []guest.Forward {
	return []guest.Forward{{HostPort: h.demux.Port(), GuestPort: handAPIGuestPort}, h.keys.forward()}
}

// hostForwards are the host's ways to the node plugins' CSI ports: B in the storage guest,
// A in the worker.
func (h *handMade) hostForwards(storage bool) []guest.Forward {
	if storage {
		return []guest.Forward{{HostPort: h.portB, GuestPort: nodePortB}}
	}
	return []guest.Forward{{HostPort: h.portA, GuestPort: nodePortA}}
}

// newSuite is the phase on the booted pair (storageOpts boot the storage guest again in a
// reboot).
func (h *handMade) newSuite(storage, worker *guest.Guest, storageOpts guest.Options, relay *netrelay.Relay) *suite {
	return &suite{c: h.c, relay: relay, storage: &vm{name: storageNode, g: storage}, worker: &vm{name: "worker", g: worker},
		storageOpts: storageOpts, keys: h.keys}
}

// start starts the phase's parts on s's guests and the CSI controller service in this
// process; it fails t (never skips).
func (h *handMade) start(t *testing.T, s *suite) {
	t.Helper()
	t0 := time.Now()
	c := h.c
	kc, err := h.cp.KubeconfigFor("admin", fmt.Sprintf("https://127.0.0.1:%d", handAPIGuestPort))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*vm{s.storage, s.worker} {
		for name, src := range map[string]string{"plinth": filepath.Join(h.work, "plinth"), "apimux": filepath.Join(h.work, "apimux")} {
			data, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(v.g.ShareDir(), name), data, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(v.g.ShareDir(), "kubeconfig"), kc, 0o600); err != nil {
			t.Fatal(err)
		}
		h.keys.writeShare(t, v.g.ShareDir())
	}
	s.setUpStorage(t)
	s.worker.sh(t, copyTimeout, apimuxScript)
	setIP(t, s.worker, workerMAC, workerAddr+"/24")
	s.worker.sh(t, time.Minute, "ping -c 1 -W 10 "+storageAddr)
	// worker A uses the worker guest's /etc/nvme/hostnqn
	s.worker.sh(t, time.Minute, fmt.Sprintf("echo %s > /etc/nvme/hostnqn && %s", hostNQNA, nodePluginScript(workerA, "/etc/nvme/hostnqn", nodePortA)))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := s.storage.try(time.Minute, "tail -n 80 /tmp/agent.log; echo ---- B; tail -n 40 /tmp/csi-worker-b.log; lvs -a; find /sys/kernel/config/nvmet -maxdepth 4 | head -60; dmesg | tail -n 40")
			t.Logf("storage guest:\n%s", out)
			out, _ = s.worker.try(time.Minute, "tail -n 60 /tmp/csi-worker-a.log; ls /sys/class/nvme-subsystem; dmesg | tail -n 60")
			t.Logf("worker guest:\n%s", out)
		}
	})

	// The controller service in this process, on the host.
	d, err := csi.New(csi.Options{Mode: csi.ModeController, Endpoint: "unix://" + filepath.Join(h.work, "ctrl.sock"), Config: h.cp.Admin.Config,
		WaitTimeout: 3 * time.Minute, Log: testr.NewWithOptions(t, testr.Options{Verbosity: 1})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := d.Run(ctx); err != nil {
			t.Errorf("csi controller: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-d.Serving():
	case <-done:
		t.Fatal("csi controller stopped at start")
	}
	ctrlConn := grpcClient(t, filepath.Join(h.work, "ctrl.sock"))
	s.ctrl, s.group = csipb.NewControllerClient(ctrlConn), csipb.NewGroupControllerClient(ctrlConn)
	s.nodeA = csipb.NewNodeClient(grpcClient(t, fmt.Sprintf("127.0.0.1:%d", h.portA)))
	s.nodeB = csipb.NewNodeClient(grpcClient(t, fmt.Sprintf("127.0.0.1:%d", h.portB)))

	// The agent reports the thin pool and its address; both node plugins annotate their Nodes.
	controlplane.Eventually(t, 5*time.Minute, 500*time.Millisecond, "store ready and node plugins registered", func() error {
		var st storev1.Store
		if err := c.Get(t.Context(), client.ObjectKey{Name: h.store}, &st); err != nil {
			return err
		}
		if !apimeta.IsStatusConditionTrue(st.Status.Conditions, "Ready") || st.Status.Capacity == nil {
			return fmt.Errorf("store %s not ready: %+v", h.store, st.Status.Conditions)
		}
		for name, nqn := range map[string]string{workerA: hostNQNA, workerB: hostNQNB} {
			var n corev1.Node
			if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &n); err != nil {
				return err
			}
			if n.Annotations[policyv1.AnnotationHostNQN] != nqn || n.Labels[policyv1.LabelNVMeInitiator] != "true" {
				return fmt.Errorf("node %s: labels %v annotations %v", name, n.Labels, n.Annotations)
			}
		}
		return nil
	})
	t.Logf("TIMING hand-made phase ready %s", time.Since(t0).Round(time.Millisecond))
}

// teardown ends the hand-made phase in the guests, so that the kubelet phase starts on nodes
// that hold nothing of it: every process it started (by pid: the agent's loop before the
// agent), NVMe controllers, mounts and dm-crypt devices left by a failed step, every nvmet
// object, the state disk's mount and the pool's volume group. It fails t unless both guests
// are left with no nvmet object, no NVMe controller and no volume group.
func (s *suite) teardown(t *testing.T) {
	t.Helper()
	const stop = `for f in /tmp/agent-loop.pid /tmp/agent.pid /tmp/csi-*.pid /tmp/apimux-*.pid; do
  [ -f $f ] || continue; p=$(cat $f); rm -f $f
  kill $p 2>/dev/null || continue
  i=0; while kill -0 $p 2>/dev/null; do i=$((i+1)); [ $i -lt 100 ] || { kill -9 $p; break; }; sleep 0.1; done
done
for m in $(awk '$2 ~ "^/tmp/" {print $2}' /proc/mounts | sort -r); do umount -l $m; done
for d in $(ls /dev/mapper | grep '^plinth-[^-]'); do dmsetup remove --force $d; done
nvme disconnect-all >/dev/null 2>&1 || true
rm -f /tmp/plinth /tmp/*.src
`
	const nvmetClean = `if cd /sys/kernel/config/nvmet 2>/dev/null; then
for p in ports/*; do [ -d $p ] || continue; rm -f $p/subsystems/*; rmdir $p; done
for s in subsystems/*; do [ -d $s ] || continue
  rm -f $s/allowed_hosts/*
  for n in $s/namespaces/*; do [ -d $n ] && { echo 0 > $n/enable; rmdir $n; }; done
  rmdir $s
done
for h in hosts/*; do [ -d $h ] && rmdir $h; done
cd /
fi
`
	s.worker.sh(t, 2*time.Minute, stop)
	s.storage.sh(t, 2*time.Minute, stop+nvmetClean+fmt.Sprintf(`umount /var/lib/plinth 2>/dev/null || true
vgremove -f -y %[1]s >/dev/null 2>&1 || true
pvremove -y %[2]s >/dev/null 2>&1 || true
wipefs -a -q %[2]s %[3]s`, vg, handPoolDisk, handStateDisk))
	for _, v := range []*vm{s.storage, s.worker} {
		out := v.sh(t, time.Minute, `ls -A /sys/kernel/config/nvmet/ports /sys/kernel/config/nvmet/subsystems /sys/kernel/config/nvmet/hosts 2>/dev/null; ls /sys/class/nvme 2>/dev/null; vgs --noheadings -o vg_name 2>/dev/null; true`)
		var left []string
		for _, l := range strings.Split(out, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasSuffix(l, ":") {
				left = append(left, l)
			}
		}
		if len(left) != 0 {
			t.Fatalf("%s after the hand-made phase: %v left", v.name, left)
		}
	}
}

// controllerAttrs reads, in guest v, the sysfs attributes of each controller of the
// subsystem nqn: one map per controller (name, state, hostnqn, address, sqsize, ctrl_loss_tmo,
// reconnect_delay, transport). None when not connected.
func (s *suite) controllerAttrs(t testing.TB, v *vm, nqn string) []map[string]string {
	t.Helper()
	out := v.sh(t, time.Minute, fmt.Sprintf(`for sub in /sys/class/nvme-subsystem/*; do
  [ "$(cat $sub/subsysnqn 2>/dev/null)" = %q ] || continue
  for c in $sub/nvme*; do
    n=${c##*/}; echo "$n" | grep -qE '^nvme[0-9]+$' || continue
    echo "name=$n"
    for a in state hostnqn address sqsize ctrl_loss_tmo reconnect_delay transport; do echo "$a=$(cat /sys/class/nvme/$n/$a 2>/dev/null | tr -d '\n')"; done
    echo "--"
  done
done`, nqn))
	var res []map[string]string
	cur := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if line == "--" {
			res = append(res, cur)
			cur = map[string]string{}
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			cur[k] = v
		}
	}
	return res
}

// waitController polls guest v's sysfs until ok holds for the subsystem's controllers
// (bounded by timeout); it returns the last attributes read.
func (s *suite) waitController(t testing.TB, v *vm, nqn, what string, timeout time.Duration, ok func([]map[string]string) bool) []map[string]string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		attrs := s.controllerAttrs(t, v, nqn)
		if ok(attrs) {
			return attrs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; controllers of %s: %v", what, timeout, nqn, attrs)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func stateIs(state string) func([]map[string]string) bool {
	return func(a []map[string]string) bool { return len(a) == 1 && a[0]["state"] == state }
}

func fsCap(mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode}}
}

// volume is one created, published and staged remote volume.
type volume struct {
	id, nqn, staging string
	pc, vc           map[string]string
	capability       *csipb.VolumeCapability
}

// createVolume creates a volume of the class placement (pool + "-nvme" or pool + "-patient").
func (s *suite) createVolume(t *testing.T, name, placement string, size int64) *volume {
	t.Helper()
	capability := fsCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	params := map[string]string{policyv1.ParamPlacement: placement, policyv1.ParamPool: pool, policyv1.ParamProtocol: placement}
	cv, err := s.ctrl.CreateVolume(t.Context(), &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csipb.VolumeCapability{capability}, Parameters: params})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	return &volume{id: cv.GetVolume().GetVolumeId(), vc: cv.GetVolume().GetVolumeContext(), capability: capability,
		staging: "/tmp/staging-" + cv.GetVolume().GetVolumeId()}
}

func (s *suite) publish(t *testing.T, v *volume, node string) {
	t.Helper()
	pub, err := s.ctrl.ControllerPublishVolume(t.Context(), &csipb.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: node, VolumeCapability: v.capability})
	if err != nil {
		t.Fatalf("ControllerPublish to %s: %v", node, err)
	}
	v.pc = pub.GetPublishContext()
	v.nqn = v.pc[csi.PublishNQN]
}

func (s *suite) stage(t *testing.T, node csipb.NodeClient, v *volume) {
	t.Helper()
	if _, err := node.NodeStageVolume(t.Context(), &csipb.NodeStageVolumeRequest{VolumeId: v.id, PublishContext: v.pc,
		StagingTargetPath: v.staging, VolumeCapability: v.capability, VolumeContext: v.vc}); err != nil {
		t.Fatalf("NodeStage: %v", err)
	}
}

func (s *suite) unstage(t *testing.T, node csipb.NodeClient, v *volume) {
	t.Helper()
	if _, err := node.NodeUnstageVolume(t.Context(), &csipb.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging}); err != nil {
		t.Fatalf("NodeUnstage: %v", err)
	}
}

// allowedHosts lists, in the storage guest, the host NQNs linked into the subsystem's
// allowed_hosts and its attr_allow_any_host.
func (s *suite) allowedHosts(t testing.TB, nqn string) (hosts []string, anyHost string) {
	t.Helper()
	out := s.storage.sh(t, time.Minute, fmt.Sprintf("d=/sys/kernel/config/nvmet/subsystems/%s; cat $d/attr_allow_any_host; ls $d/allowed_hosts", nqn))
	lines := strings.Fields(out)
	if len(lines) == 0 {
		t.Fatalf("no subsystem %s on the storage guest", nqn)
	}
	return lines[1:], lines[0]
}

// writeFile writes mib MiB of random data to name in the staging folder on the worker, synced
// to the device, and returns its sha256.
func (s *suite) writeFile(t testing.TB, v *volume, name string, mib int) string {
	t.Helper()
	return writeFileOn(t, s.worker, v, name, mib)
}

// writeFileOn is writeFile in guest g (the guest whose node plugin staged v).
func writeFileOn(t testing.TB, g *vm, v *volume, name string, mib int) string {
	t.Helper()
	out := g.sh(t, 5*time.Minute, fmt.Sprintf("dd if=/dev/urandom of=%s/%s bs=1M count=%d conv=fsync 2>/dev/null && sha256sum %s/%s",
		v.staging, name, mib, v.staging, name))
	return strings.Fields(out)[0]
}

// readSum drops guest g's page cache (so the bytes come over the network) and returns the
// file's sha256.
func (s *suite) readSum(t testing.TB, g *vm, v *volume, name string) string {
	t.Helper()
	out := g.sh(t, 5*time.Minute, fmt.Sprintf("sync; echo 3 > /proc/sys/vm/drop_caches; sha256sum %s/%s", v.staging, name))
	return strings.Fields(out)[0]
}

type bgResult struct {
	out  string
	code int
}

// background runs script in guest g without waiting for it; the channel yields its output and
// exit code.
func background(g *vm, timeout time.Duration, script string) <-chan bgResult {
	ch := make(chan bgResult, 1)
	go func() {
		out, code := g.try(timeout, script)
		ch <- bgResult{out, code}
	}()
	return ch
}

// directWriteScript makes mib MiB of random data in /tmp/<name>.src, prints its sha256, then
// writes it with O_DIRECT and fsync to <staging>/<name>, the dd's pid in /tmp/<name>.pid.
func directWriteScript(v *volume, name string, mib int) string {
	return fmt.Sprintf(`dd if=/dev/urandom of=/tmp/%[1]s.src bs=1M count=%[3]d 2>/dev/null && sha256sum /tmp/%[1]s.src || exit 99
dd if=/tmp/%[1]s.src of=%[2]s/%[1]s bs=1M oflag=direct conv=fsync & echo $! > /tmp/%[1]s.pid; wait $!`, name, v.staging, mib)
}

// waitBlocked waits until the dd of directWriteScript(name) sleeps uninterruptibly in the
// kernel (state D in /proc/<pid>/stat): its I/O is held, neither done nor failed.
func waitBlocked(t testing.TB, g *vm, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, _ := g.try(time.Minute, fmt.Sprintf(`p=$(cat /tmp/%s.pid 2>/dev/null) && [ -n "$p" ] && cut -d' ' -f3 /proc/$p/stat`, name))
		if strings.TrimSpace(out) == "D" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the write %s is not blocked in the kernel after %s (state %q)", name, timeout, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// await bounds the wait for a background command: a hang is a failure, not a wait.
func await(t testing.TB, ch <-chan bgResult, what string, timeout time.Duration) bgResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(timeout):
		t.Fatalf("%s: still running after %s (a hang)", what, timeout)
	}
	return bgResult{}
}

// mounted returns the device mounted at the staging folder in guest g and its filesystem UUID.
func mounted(t testing.TB, g *vm, v *volume) (dev, uuid string) {
	t.Helper()
	out := g.sh(t, time.Minute, fmt.Sprintf(`d=$(awk -v p=%s '$2==p {print $1}' /proc/mounts | head -n 1); [ -n "$d" ] || { echo "nothing mounted"; exit 1; }
echo $d; blkid -o value -s UUID $d`, v.staging))
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("mount of %s: %q", v.staging, out)
	}
	return f[0], f[1]
}

// readSeconds reads the first 64 MiB of dev in guest g with O_DIRECT in 128 KiB blocks and
// returns the seconds taken (guest clock, /proc/uptime: 10 ms resolution).
func readSeconds(t testing.TB, g *vm, dev string) float64 {
	t.Helper()
	out := g.sh(t, 5*time.Minute, fmt.Sprintf(`a=$(cut -d' ' -f1 /proc/uptime); dd if=%s of=/dev/null bs=128k count=512 iflag=direct 2>/dev/null || exit 1
b=$(cut -d' ' -f1 /proc/uptime); echo "$a $b"`, dev))
	var a, b float64
	if _, err := fmt.Sscan(out, &a, &b); err != nil || b <= a {
		t.Fatalf("read timing %q: %v", out, err)
	}
	return b - a
}

// testHandMade runs the scenarios kubelet cannot drive, with the CSI calls made here: a node
// plugin kept staged while its volume moves (fencing), the agent killed at crash points, the
// storage guest rebooted under a staged volume, two initiator identities, DH-HMAC-CHAP with key
// rotation through the key server, encryption on the wire, snapshots. The link cuts are the
// kubelet phase's (testShortCut, testLongCut): the pod's view of the same kernel behaviour.
func testHandMade(t *testing.T, s *suite) {
	suiteStart := time.Now()
	defer func() { t.Logf("TIMING hand-made tests %s", time.Since(suiteStart).Round(time.Millisecond)) }()

	v := s.createVolume(t, "pvc-crossnode-0", pool+"-nvme", 256<<20)
	sums := map[string]string{} // file in the volume → sha256 of what was written

	// Expected: the LV is exported on the storage guest's private address only to worker A's
	// host NQN; worker A stages it over the relay; data written reads back equal after the
	// page cache is dropped; the kernel shows every Protocol field as set.
	t.Run("RemoteVolumeEndToEnd", func(t *testing.T) {
		s.publish(t, v, workerA)
		if v.pc[csi.PublishAddress] != storageAddr || v.pc[csi.PublishPort] != fmt.Sprint(nvmePort) {
			t.Fatalf("publish context %v: want address %s port %d (bindCIDR %s)", v.pc, storageAddr, nvmePort, netCIDR)
		}
		hosts, anyHost := s.allowedHosts(t, v.nqn)
		if anyHost != "0" || len(hosts) != 1 || hosts[0] != hostNQNA {
			t.Errorf("ACL of %s: allow_any_host=%s hosts %v, want 0 and only %s", v.nqn, anyHost, hosts, hostNQNA)
		}
		s.stage(t, s.nodeA, v)
		sum := s.writeFile(t, v, "data", 32)
		if got := s.readSum(t, s.worker, v, "data"); got != sum {
			t.Errorf("read back %s, wrote %s", got, sum)
		}
		sums["data"] = sum
	})

	t.Run("ProtocolFieldsInTheKernel", func(t *testing.T) {
		// initiator side (worker guest sysfs)
		attrs := s.controllerAttrs(t, s.worker, v.nqn)
		if len(attrs) != 1 {
			t.Fatalf("controllers of %s: %v, want 1", v.nqn, attrs)
		}
		a := attrs[0]
		want := map[string]string{
			"transport":       "tcp",
			"hostnqn":         hostNQNA,
			"ctrl_loss_tmo":   fmt.Sprint(ctrlLossTmo),
			"reconnect_delay": fmt.Sprint(reconnectDelay),
			"sqsize":          fmt.Sprint(maxQueueSize - 1), // the kernel keeps queue_size - 1 (0's based)
			"state":           "live",
		}
		for k, w := range want {
			if a[k] != w {
				t.Errorf("worker sysfs %s of %s = %q, want %q", k, a["name"], a[k], w)
			}
		}
		if !strings.Contains(a["address"], "traddr="+storageAddr) || !strings.Contains(a["address"], fmt.Sprintf("trsvcid=%d", nvmePort)) {
			t.Errorf("worker sysfs address %q, want traddr=%s trsvcid=%d", a["address"], storageAddr, nvmePort)
		}
		// target side (storage guest configfs): the port bound in bindCIDR, on port 4420
		out := s.storage.sh(t, time.Minute, fmt.Sprintf(`for p in /sys/kernel/config/nvmet/ports/*; do
  [ -e $p/subsystems/%s ] && echo "$(cat $p/addr_trtype) $(cat $p/addr_traddr) $(cat $p/addr_trsvcid)"
done`, v.nqn))
		if strings.TrimSpace(out) != fmt.Sprintf("tcp %s %d", storageAddr, nvmePort) {
			t.Errorf("nvmet ports linking %s: %q, want one: tcp %s %d", v.nqn, out, storageAddr, nvmePort)
		}
	})

	if t.Failed() {
		return // the faults need the staged volume
	}

	// Measured, not asserted (emulation makes absolute numbers meaningless): sequential 128 KiB
	// O_DIRECT reads of the same 64 MiB of the volume, remotely on worker A over the relay and
	// locally from the LV on the storage guest, in this run.
	t.Run("MeasureSequentialRead", func(t *testing.T) {
		var vs storev1.VolumeState
		if err := s.c.Get(t.Context(), client.ObjectKey{Name: v.id}, &vs); err != nil {
			t.Fatal(err)
		}
		dev, _ := mounted(t, s.worker, v)
		remote := readSeconds(t, s.worker, dev)
		local := readSeconds(t, s.storage, vs.Status.DevicePath)
		t.Logf("MEASURE sequential read 64 MiB bs=128k O_DIRECT: remote %.2fs (%.1f MiB/s), local %.2fs (%.1f MiB/s), remote/local bandwidth %.2f",
			remote, 64/remote, local, 64/local, local/remote)
	})

	// Expected: an RWO volume moves from worker A to worker B while A is still staged (a node
	// cut off from its control plane keeps its mount). ControllerUnpublish(A) returns only once
	// the target lists no host (allow_any_host stays 0); the target cuts A's live connection at
	// that point, so A's controller leaves "live" and never comes back (its reconnects are
	// refused); a write A attempts afterwards fails with EIO and never reaches the LV. Publish to
	// B is allowed only then; B (another kernel, another host NQN) stages the same filesystem,
	// reads every file, and the file A tried to write is not there.
	t.Run("RWOMoveRevokesTheOldHostFirst", func(t *testing.T) {
		if _, err := s.ctrl.ControllerPublishVolume(t.Context(), &csipb.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: workerB, VolumeCapability: v.capability}); err == nil {
			t.Fatal("publish to B while published to A succeeded (RWO)")
		}
		if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: workerA}); err != nil {
			t.Fatalf("ControllerUnpublish A: %v", err)
		}
		if hosts, anyHost := s.allowedHosts(t, v.nqn); anyHost != "0" || len(hosts) != 0 {
			t.Fatalf("after unpublishing A: allow_any_host=%s hosts %v, want 0 and none", anyHost, hosts)
		}
		s.waitController(t, s.worker, v.nqn, "A's connection cut by the target", 2*time.Minute, func(a []map[string]string) bool {
			return len(a) == 0 || a[0]["state"] != "live"
		})
		w := background(s.worker, 10*time.Minute, directWriteScript(v, "stale", 1))
		s.publish(t, v, workerB)
		if hosts, anyHost := s.allowedHosts(t, v.nqn); anyHost != "0" || len(hosts) != 1 || hosts[0] != hostNQNB {
			t.Errorf("after publishing to B: allow_any_host=%s hosts %v, want only %s", anyHost, hosts, hostNQNB)
		}
		r := await(t, w, "A's write after the revocation", 5*time.Minute)
		if r.code == 0 {
			t.Errorf("A wrote after its host NQN was revoked:\n%s", r.out)
		}
		if a := s.controllerAttrs(t, s.worker, v.nqn); len(a) != 0 {
			t.Errorf("A still has controllers of %s: %v", v.nqn, a)
		}
		s.stage(t, s.nodeB, v)
		for name, want := range sums {
			if got := s.readSum(t, s.storage, v, name); got != want {
				t.Errorf("B reads %s = %s, A wrote %s", name, got, want)
			}
		}
		if out, code := s.storage.try(time.Minute, "ls -l "+v.staging+"/stale"); code == 0 {
			t.Errorf("A's write after the revocation reached the volume: %s", out)
		}
		s.unstage(t, s.nodeB, v)
		s.unstage(t, s.nodeA, v) // A's dead mount
		if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: workerB}); err != nil {
			t.Errorf("ControllerUnpublish B: %v", err)
		}
	})

	// Expected: the agent is killed twice while exporting a new volume — once with the subsystem
	// made and its namespace enabled but not yet linked into a port, once with the export
	// complete but not yet reported — and restarted each time (the loop, as kubelet would).
	// CreateVolume still completes; the agent exited exactly twice with the crash code; the
	// restarted agent adopted what it found: one subsystem for the volume, one namespace, one
	// port link, and still one nvmet port on the node (the shared one, not a second); the volume
	// then serves worker A.
	t.Run("AgentKilledMidExportIsAdopted", func(t *testing.T) {
		s.storage.sh(t, time.Minute, "echo nvmet.subsystem.created=once,agent.export.created=once > /tmp/agent-failpoints && : > /tmp/agent-exits && kill $(cat /tmp/agent.pid)")
		defer s.storage.sh(t, time.Minute, "rm -f /tmp/agent-failpoints")
		v2 := s.createVolume(t, "pvc-crossnode-crash", pool+"-nvme", 64<<20)
		exits := strings.Fields(s.storage.sh(t, time.Minute, "cat /tmp/agent-exits"))
		crashes := 0
		for _, e := range exits {
			if e == "86" {
				crashes++
			}
		}
		if crashes != 2 || len(exits) != 3 {
			t.Errorf("agent exits %v, want the kill's then 86 twice (failpoint.ExitCode)", exits)
		}
		out := s.storage.sh(t, time.Minute, fmt.Sprintf(`cd /sys/kernel/config/nvmet
echo "subsystems=$(ls subsystems | grep -c ':%[1]s$')"
echo "namespaces=$(ls subsystems/*:%[1]s/namespaces | wc -w) enabled=$(cat subsystems/*:%[1]s/namespaces/1/enable)"
echo "links=$(ls ports/*/subsystems | grep -c ':%[1]s$')"
echo "ports=$(ls ports | wc -w)"`, v2.id))
		want := "subsystems=1\nnamespaces=1 enabled=1\nlinks=1\nports=1"
		if strings.TrimSpace(out) != want {
			t.Errorf("nvmet after the crashes:\n%s\nwant\n%s", out, want)
		}
		s.publish(t, v2, workerA)
		s.stage(t, s.nodeA, v2)
		sum := s.writeFile(t, v2, "data", 4)
		if got := s.readSum(t, s.worker, v2, "data"); got != sum {
			t.Errorf("read back %s, wrote %s", got, sum)
		}
		s.unstage(t, s.nodeA, v2)
		if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: v2.id, NodeId: workerA}); err != nil {
			t.Errorf("ControllerUnpublish: %v", err)
		}
		if _, err := s.ctrl.DeleteVolume(t.Context(), &csipb.DeleteVolumeRequest{VolumeId: v2.id}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})

	// Expected: a volume of the patient class (ctrlLossTmo 600 s) is staged on worker A with
	// data; the storage guest powers off and boots again on the same disk. Meanwhile A's
	// controller leaves "live" and keeps reconnecting (it is not removed) and a write issued
	// then is held. After the boot the agent, started as at the first boot with nothing restored
	// by hand, exports the volume again from its VolumeState (ACL with only A's host NQN, port on
	// the private address); A's same controller is live again, the held write completes and every
	// file verifies.
	t.Run("StorageRebootRestoresExports", func(t *testing.T) {
		v3 := s.createVolume(t, "pvc-crossnode-reboot", pool+"-patient", 64<<20)
		s.publish(t, v3, workerA)
		s.stage(t, s.nodeA, v3)
		files := map[string]string{"before": s.writeFile(t, v3, "before", 4)}
		before := s.controllerAttrs(t, s.worker, v3.nqn)
		if len(before) != 1 || before[0]["ctrl_loss_tmo"] != "600" {
			t.Fatalf("controllers of %s: %v, want one with ctrl_loss_tmo 600", v3.nqn, before)
		}
		downAt := time.Now()
		s.storage.g.Stop() //nolint:errcheck
		s.waitController(t, s.worker, v3.nqn, "controller leaves live with the storage guest down", 2*time.Minute, func(a []map[string]string) bool {
			return len(a) == 1 && a[0]["state"] != "live"
		})
		w := background(s.worker, 10*time.Minute, directWriteScript(v3, "held", 2))
		waitBlocked(t, s.worker, "held", 2*time.Minute)
		g, err := guest.Boot(t.Context(), s.storageOpts)
		if err != nil {
			s.storage = nil
			t.Fatalf("boot the storage guest again: %v", err)
		}
		s.storage = &vm{name: storageNode, g: g}
		t.Logf("TIMING storage guest booted again in %s", g.BootTime.Round(time.Millisecond))
		s.setUpStorage(t)
		after := s.waitController(t, s.worker, v3.nqn, "A's controller live again after the reboot", 5*time.Minute, stateIs("live"))
		t.Logf("MEASURE storage guest down → A's controller live again: %s", time.Since(downAt).Round(100*time.Millisecond))
		if after[0]["name"] != before[0]["name"] {
			t.Errorf("controller %s after the reboot, was %s: removed and made anew", after[0]["name"], before[0]["name"])
		}
		r := await(t, w, "write held during the reboot", 5*time.Minute)
		if r.code != 0 {
			t.Fatalf("write held during the reboot: exit %d\n%s", r.code, r.out)
		}
		files["held"] = strings.Fields(r.out)[0]
		for name, want := range files {
			if got := s.readSum(t, s.worker, v3, name); got != want {
				t.Errorf("%s reads %s, wrote %s", name, got, want)
			}
		}
		if hosts, anyHost := s.allowedHosts(t, v3.nqn); anyHost != "0" || len(hosts) != 1 || hosts[0] != hostNQNA {
			t.Errorf("ACL after the reboot: allow_any_host=%s hosts %v, want only %s", anyHost, hosts, hostNQNA)
		}
		s.unstage(t, s.nodeA, v3)
		if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: v3.id, NodeId: workerA}); err != nil {
			t.Errorf("ControllerUnpublish: %v", err)
		}
		if _, err := s.ctrl.DeleteVolume(t.Context(), &csipb.DeleteVolumeRequest{VolumeId: v3.id}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})

	for _, x := range extraTests { // publication_test.go
		t.Run(x.name, func(t *testing.T) { x.run(t, s) })
	}
	t.Run("Auth", s.testAuth)

	t.Run("DeleteLeavesNothing", func(t *testing.T) {
		if _, err := s.ctrl.DeleteVolume(t.Context(), &csipb.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
		if out := s.storage.sh(t, time.Minute, fmt.Sprintf("lvs --noheadings -o lv_name %s | grep -v '^ *pool$'; ls -A /sys/kernel/config/nvmet/subsystems; ls -A /sys/class/nvme-subsystem; true", vg)); strings.TrimSpace(out) != "" {
			t.Errorf("left on the storage guest: %s", out)
		}
		if out := s.worker.sh(t, time.Minute, "ls -A /sys/class/nvme-subsystem; grep /tmp/staging /proc/mounts; true"); strings.TrimSpace(out) != "" {
			t.Errorf("left on the worker guest: %s", out)
		}
	})
}
