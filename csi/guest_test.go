package csi_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/csisanity"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/kernel/apimux"
	"github.com/plinth-storage/plinth/test/kernel/guest"
)

// The CSI guest suite: `plinth agent` (LVM thin pool, NVMe-oF/TCP export through nvmet) and
// `plinth csi --mode all` run as root in the qemu guest of test/kernel (Debian's kernel, real
// LVM, real nvmet configfs, the real nvme-tcp initiator), against this host's kube-apiserver
// (reached through test/kernel/apimux and guestfwd). csi-sanity runs in the guest
// next to the driver's socket; then this package's test binary runs in the guest
// (TestInGuestNVMeoFNode) for the node path's failure modes on the real kernel. The guest's
// node connects to its own nvmet target over loopback TCP: the same kernel code as between
// two machines. In the same boot, two raw pools on four more virtio disks (GPT partitions,
// whole disks; the local protocol) get a csi-sanity run of their own and TestInGuestRaw.
//
// It boots one guest (several minutes under software emulation), so it runs only with
// PLINTH_GUEST_CSI=1, after make testbin and make kernel-assets (make test-kernel does both).

// The raw pools' disks in the guest: GPT partitions on the first two, whole disks on the
// others (the smaller one first).
var (
	guestRawGPTDisks   = []string{"/dev/vdb", "/dev/vdc"}
	guestRawWholeDisks = []string{"/dev/vdd", "/dev/vde"}
)

// rawSanitySkip is the ginkgo.skip of the raw csi-sanity run: the snapshot, restore and clone
// specs, which raw volumes cannot pass (CreateSnapshot and clones refuse them with
// INVALID_ARGUMENT); the LVM run covers them.
const rawSanitySkip = "Snapshot|from an existing source"

// guestZpool is the zpool of the ZFS class in the guest, on /dev/vdf.
const guestZpool = "gzpool"

// checkZFSSanityReport checks the ZFS run, focused on the specs rawSanitySkip names: at least
// 10 of them passed, none failed, and every spec skipped is one outside the focus or one every
// run skips (sanitySkipped).
func checkZFSSanityReport(t *testing.T, path string) {
	t.Helper()
	res, err := csisanity.ReadReport(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ZFS csi-sanity report: %d passed, %d skipped, %d failed, %d pending", res.Passed, res.Skipped, res.Failed, res.Pending)
	re := regexp.MustCompile(rawSanitySkip)
	for _, s := range res.SkippedSpecs {
		if re.MatchString(s) && !slices.Contains(sanitySkipped, s) {
			t.Errorf("ZFS run skipped snapshot spec %q", s)
		}
	}
	if res.Failed != 0 || res.Passed < 10 {
		t.Errorf("ZFS run: %d snapshot and clone specs passed (want at least 10), %d failed: %q", res.Passed, res.Failed, res.FailedSpecs)
	}
}

// guestSanitySkipped are the specs the guest's csi-sanity runs skip besides sanitySkipped: the
// attach limit spec. The guest suite's one node plugin serves every step of the suite, and the
// group snapshot steps publish more volumes to it at once than a limit small enough for
// csi-sanity to fill (it makes limit + 1 volumes, on the raw disks too); the host run, whose
// node plugin serves csi-sanity alone, runs the spec with a limit of 3.
var guestSanitySkipped = []string{
	"Controller Service [Controller Server] ControllerPublishVolume should fail when publishing more volumes than the node max attach limit",
}

// checkRawSanityReport is checkSanityReport for the raw run: the specs skipped are those of
// every run (sanitySkipped) and those rawSanitySkip names, at least 10 of them (a skip
// pattern that matched nothing, or a snapshot capability gone, shows), and nothing fails.
func checkRawSanityReport(t *testing.T, path string) {
	t.Helper()
	res, err := csisanity.ReadReport(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("raw csi-sanity report: %d passed, %d skipped, %d failed, %d pending", res.Passed, res.Skipped, res.Failed, res.Pending)
	re := regexp.MustCompile(rawSanitySkip)
	skipped := append(slices.Clone(sanitySkipped), guestSanitySkipped...)
	extra := 0
	for _, s := range res.SkippedSpecs {
		if !slices.Contains(skipped, s) && re.MatchString(s) {
			skipped = append(skipped, s)
			extra++
		}
	}
	if extra < 10 {
		t.Errorf("the raw run skipped %d snapshot and clone specs, want at least 10", extra)
	}
	if err := res.Check(csisanity.Specs-len(skipped), csisanity.Pending, skipped); err != nil {
		t.Errorf("raw csi-sanity did not run as this driver must (skipped now: %q):\n%v", res.SkippedSpecs, err)
	}
}

const (
	csiGuestNode = "guest-node"
	// csiGuestHostNQN is the guest's /etc/nvme/hostnqn (test/kernel/README.md).
	csiGuestHostNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001"
	// guestSocket is the driver's socket in the guest.
	guestSocket = "/tmp/csi/csi.sock"
	// guestStateDir holds the node's stage records in the guest.
	guestStateDir = "/tmp/csi/state"
)

type csiGuest struct {
	t *testing.T
	g *guest.Guest
}

// sh runs script in the guest and fails t unless it exits 0.
func (g csiGuest) sh(timeout time.Duration, script string) string {
	g.t.Helper()
	out, code := g.try(timeout, script)
	if code != 0 {
		g.t.Fatalf("guest: %s: exit %d\n%s", script, code, out)
	}
	return out
}

// inGuest runs the in-guest test name (a Test function of this package, built as /tmp/csi.test
// in the guest) with the environment env ("K=V ..." beside PLINTH_CSI_GUEST_SOCKET and
// PLINTH_CSI_GUEST_NODE, which it sets) for at most timeout, logs its output and time, and fails
// g.t unless it passed with nothing skipped: a subtest that skipped in the guest would pass
// its parent, so no skip counts as run.
func (g csiGuest) inGuest(name, env string, timeout time.Duration) {
	g.t.Helper()
	start := time.Now()
	out, code := g.try(timeout, fmt.Sprintf("cd /tmp && PLINTH_CSI_GUEST_SOCKET=%s PLINTH_CSI_GUEST_NODE=%s %s /tmp/csi.test -test.run '^%s$' -test.v -test.count=1 -test.timeout=%s 2>&1",
		guestSocket, csiGuestNode, env, name, timeout-time.Minute))
	g.t.Logf("TIMING %s %s; in the guest:\n%s", name, time.Since(start).Round(time.Second), out)
	if code != 0 || !strings.Contains(out, "--- PASS: "+name) {
		g.t.Fatalf("%s in the guest: exit %d", name, code)
	}
	if strings.Contains(out, "--- SKIP") {
		g.t.Errorf("%s skipped subtests in the guest (see its output above)", name)
	}
}

func (g csiGuest) try(timeout time.Duration, script string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := g.g.Run(ctx, script, nil)
	if err != nil {
		return err.Error(), -1
	}
	return string(res.Output), res.ExitCode
}

// goBuild builds pkg for the guest (static, CGO_ENABLED=0) into out; test means go test -c.
func goBuild(t *testing.T, root, out, pkg string, test bool) {
	t.Helper()
	args := []string{"build", "-o", out, pkg}
	if test {
		args = []string{"test", "-c", "-o", out, pkg}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

func TestGuestCSISanityLVMNVMeoF(t *testing.T) {
	if os.Getenv("PLINTH_GUEST_CSI") != "1" {
		t.Skip("boots a qemu guest with the agent and the CSI driver: set PLINTH_GUEST_CSI=1 (after make testbin and make kernel-assets)")
	}
	controlplane.RequireBinaries(t, controlplane.BinCSISanity)
	cp := sharedControlPlane(t)
	root, err := controlplane.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	c := kubeClient(t, cp.Admin.Config)

	work := t.TempDir()
	if p := os.Getenv("PLINTH_BINARY"); p != "" { // must be static (CGO_ENABLED=0) for the guest
		data, err := os.ReadFile(p)
		if err != nil || os.WriteFile(filepath.Join(work, "plinth"), data, 0o755) != nil {
			t.Fatalf("PLINTH_BINARY %s: %v", p, err)
		}
	} else {
		goBuild(t, root, filepath.Join(work, "plinth"), "./cmd/plinth", false)
	}
	goBuild(t, root, filepath.Join(work, "apimux"), "./test/kernel/cmd/apimux", false)
	goBuild(t, root, filepath.Join(work, "csi.test"), "./csi", true)
	sanity, err := controlplane.BinaryPath("", controlplane.BinCSISanity)
	if err != nil {
		t.Fatal(err)
	}
	demux := apimux.StartForTest(t, cp.URL)

	p := createGuestPolicy(t, c)
	store, zfsStore, rawStores := p.store, p.zfsStore, p.rawStores

	bootStart := time.Now()
	gg, err := guest.Boot(ctx, guest.Options{
		// /dev/vda: the VG; /dev/vdb, /dev/vdc: the raw GPT pool; /dev/vdd, /dev/vde: the raw
		// Whole pool; /dev/vdf: the zpool
		DiskBytes:     []int64{3 << 30, 1 << 30, 512 << 20, 128 << 20, 192 << 20, 1 << 30},
		GuestForwards: []guest.Forward{{HostPort: demux.Port(), GuestPort: 6443}},
		Timeout:       40 * time.Minute,
	})
	if err != nil {
		t.Fatalf("boot guest: %v", err)
	}
	t.Cleanup(func() { gg.Stop() }) //nolint:errcheck
	g := csiGuest{t, gg}
	t.Logf("TIMING guest-boot %s", time.Since(bootStart).Round(time.Millisecond))

	shareGuestFiles(t, cp, gg, p, filepath.Join(work, "plinth"), filepath.Join(work, "apimux"), filepath.Join(work, "csi.test"), sanity)
	share := guest.SharePath
	g.sh(time.Minute, fmt.Sprintf("cp %s/apimux %s/plinth %s/csi-sanity %s/csi.test /tmp/ && (/tmp/apimux -listen 127.0.0.1:6443 -upstream %s:6443 >/tmp/apimux.log 2>&1 &)",
		share, share, share, share, guest.GuestForwardAddr))
	// the zpool exists before the agent starts (Plinth creates datasets, not pools)
	g.sh(time.Minute, "zpool create -f -o ashift=12 "+guestZpool+" /dev/vdf")
	// cgroup v2 at /sys/fs/cgroup with the io controller for the root's children, as a node's
	// init system leaves it (the guest's init mounts none): the node plugin detects the
	// hierarchy when it starts and writes the tiers' limits into io.max (TierLimits).
	g.sh(time.Minute, "grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts || mount -t cgroup2 cgroup2 /sys/fs/cgroup; echo +io > /sys/fs/cgroup/cgroup.subtree_control")
	g.sh(time.Minute, fmt.Sprintf("/tmp/plinth agent --node %s --kubeconfig %s/kubeconfig --state-dir /tmp/agent-state --refresh-interval 10s "+
		"--metrics-bind-address 0 --health-probe-bind-address 0 --v 1 >/tmp/agent.log 2>&1 &", csiGuestNode, share))
	g.sh(time.Minute, fmt.Sprintf("mkdir -p /tmp/csi && /tmp/plinth csi --mode all --endpoint unix://%s --node-name %s --kubeconfig %s/kubeconfig "+
		"--state-dir %s --wait-timeout 3m --registration-dir= --key-rotation-interval 2s -v 2 >/tmp/csi.log 2>&1 &", guestSocket, csiGuestNode, share, guestStateDir))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := g.try(time.Minute, "tail -n 60 /tmp/agent.log; echo ---- csi; tail -n 120 /tmp/csi.log; echo ----; cat /tmp/apimux.log; lvs -a; "+
				"ls /sys/class/nvme-subsystem/; ls /sys/kernel/config/nvmet/subsystems; grep -v ' /sys\\| /proc\\| /dev' /proc/self/mountinfo")
			t.Logf("guest logs and kernel state:\n%s", out)
		}
	})

	waitGuestReady(t, g, c, store, zfsStore, rawStores)

	t.Run("Sanity", func(t *testing.T) { guestSanity(t, gg, share) })

	t.Run("NodeNVMeoF", func(t *testing.T) {
		csiGuest{t, gg}.inGuest("TestInGuestNVMeoFNode", fmt.Sprintf("PLINTH_CSI_GUEST_PARAMS=%s/params.yaml PLINTH_CSI_GUEST_STATE=%s", share, guestStateDir), 15*time.Minute)
	})

	// An encrypted class over the same NVMe-oF export: LUKS2 opened on the consumer, the LV
	// holding ciphertext only, a wrong or missing key refused, restage, online expansion, block.
	t.Run("EncryptedNVMeoF", func(t *testing.T) {
		csiGuest{t, gg}.inGuest("TestInGuestEncryptedNVMeoF", fmt.Sprintf("PLINTH_CSI_GUEST_LUKS_PARAMS=%s/luks-params.yaml PLINTH_CSI_GUEST_KUBECONFIG=%s/kubeconfig", share, share), 15*time.Minute)
	})

	// The tiers' write limits on the guest's kernel: measured ÷ limit for three limits on a thin
	// LV and on its NVMe-oF namespace (the node plugin writing them), within ±10 %.
	t.Run("TierLimits", func(t *testing.T) {
		csiGuest{t, gg}.inGuest("TestInGuestTierLimits", fmt.Sprintf("PLINTH_CSI_GUEST_PARAMS=%s/params.yaml PLINTH_CSI_GUEST_KUBECONFIG=%s/kubeconfig", share, share), 10*time.Minute)
	})

	// The raw backend through the agent and the driver: csi-sanity on the GPT class (its
	// snapshot and clone specs skipped: raw volumes have none, CreateSnapshot refuses them),
	// then TestInGuestRaw in the guest.
	t.Run("RawStores", func(t *testing.T) { guestRawStores(t, gg, c, rawStores) })

	t.Run("RawSanity", func(t *testing.T) { guestRawSanity(t, gg, share) })

	// csi-sanity's snapshot, restore and clone specs on the ZFS class: zfs snapshot, zfs clone
	// and the deferred destruction of a snapshot with clones (the LVM run covers the rest).
	t.Run("ZFSSnapshotSanity", func(t *testing.T) { guestZFSSanity(t, gg, share) })

	// A group snapshot taken while a writer appends records to two volumes on the ZFS class (one
	// atomic zfs snapshot); on the LVM thin class a group of two raw block volumes is refused,
	// one is taken; two thin LVs with filesystems, and a thin LV with a zvol (two Stores), are
	// taken under the node plugin's freeze while a writer appends to both (and the thin pool's
	// transaction id stays lvm2's).
	t.Run("GroupSnapshotInstant", func(t *testing.T) {
		csiGuest{t, gg}.inGuest("TestInGuestGroupSnapshot", fmt.Sprintf("PLINTH_CSI_GUEST_PARAMS=%s/params.yaml PLINTH_CSI_GUEST_ZFS_PARAMS=%s/zfs-params.yaml", share, share), 15*time.Minute)
	})

	t.Run("Raw", func(t *testing.T) {
		csiGuest{t, gg}.inGuest("TestInGuestRaw", fmt.Sprintf("PLINTH_CSI_GUEST_RAW_PARAMS=%s/raw-params.yaml PLINTH_CSI_GUEST_WHOLE_PARAMS=%s/whole-params.yaml PLINTH_CSI_GUEST_RAW_DISKS=%s PLINTH_CSI_GUEST_WHOLE_DISKS=%s",
			share, share, strings.Join(guestRawGPTDisks, ","), strings.Join(guestRawWholeDisks, ",")), 15*time.Minute)
	})

	t.Run("NothingLeftBehind", func(t *testing.T) { guestNothingLeft(t, gg, c, store, zfsStore, rawStores) })
}

// shareGuestFiles puts into the guest's share folder what the guest run needs: a kubeconfig
// for the API server as the guest reaches it, the StorageClass parameters of p's classes, and
// binaries (by base name).
func shareGuestFiles(t *testing.T, cp *controlplane.ControlPlane, gg *guest.Guest, p guestPolicy, binaries ...string) {
	t.Helper()
	kc, err := cp.KubeconfigFor("admin", "https://127.0.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	pdata, _ := yaml.Marshal(p.params)
	gptData, _ := yaml.Marshal(p.rawParams["graw"])
	wholeData, _ := yaml.Marshal(p.rawParams["gwhole"])
	zfsData, _ := yaml.Marshal(p.zfsParams)
	luksData, _ := yaml.Marshal(p.luksParams)
	mutData, _ := yaml.Marshal(sanityMutableParams(p.params[policyv1.ParamPlacement]))
	rawMutData, _ := yaml.Marshal(sanityMutableParams("graw"))
	files := map[string][]byte{"kubeconfig": kc, "params.yaml": pdata, "mutable-params.yaml": mutData, "raw-mutable-params.yaml": rawMutData, "luks-params.yaml": luksData, "raw-params.yaml": gptData, "whole-params.yaml": wholeData, "zfs-params.yaml": zfsData}
	for _, f := range binaries {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(f)] = data
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(gg.ShareDir(), name), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// guestPolicy is the policy of the guest run: the Stores of the LVM thin pool (NVMe-oF), of
// the ZFS pool and of the raw pools (local), and the StorageClass parameters of each class.
type guestPolicy struct {
	store, zfsStore   string
	rawStores         []string
	params, zfsParams map[string]string
	luksParams        map[string]string            // the encrypted class (gthin-luks)
	rawParams         map[string]map[string]string // by pool: graw (GPT), gwhole (whole disks)
}

// createGuestPolicy creates the guest run's Node, pools, protocols, placements, Stores and
// Agent, as Plinth's controller renders them and kubelet registers the Node.
func createGuestPolicy(t *testing.T, c client.Client) guestPolicy {
	t.Helper()
	// The policy as Plinth's controller renders it: an LVM thin pool on the guest's first
	// disk, exported over NVMe-oF/TCP on loopback; the Node as kubelet registers it.
	pool := "gthin"
	vg := policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "plinth-csi", Devices: []string{"/dev/vda"},
		ThinPool: &policyv1.ThinPool{Name: "pool", SizePercent: 80}}}
	create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: csiGuestNode}})
	create(t, c, &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: pool}, Spec: policyv1.StoragePoolSpec{Backend: vg}})
	create(t, c, &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: pool + "-nvme"}, Spec: policyv1.ProtocolSpec{
		NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "127.0.0.0/8"}}})
	create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: pool + "-nvme"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: pool}, ProtocolRef: policyv1.LocalObjectReference{Name: pool + "-nvme"},
		StorageClass:      policyv1.StorageClassTemplate{Name: pool + "-nvme", AllowVolumeExpansion: true},
		Filesystem:        policyv1.Filesystem{FSType: "ext4"},
		AttributesClasses: []policyv1.AttributesClassTemplate{sanityTier(pool + "-nvme")},
	}})
	// The same pool and protocol, encrypted (LUKS2, a key Secret per volume in Plinth's
	// namespace): TestInGuestEncryptedNVMeoF.
	create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: pool + "-luks"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: pool}, ProtocolRef: policyv1.LocalObjectReference{Name: pool + "-nvme"},
		StorageClass: policyv1.StorageClassTemplate{Name: pool + "-luks", AllowVolumeExpansion: true},
		Filesystem:   policyv1.Filesystem{FSType: "ext4"},
		Encryption:   &policyv1.Encryption{},
	}})
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: policyv1.VolumeKeyNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	store := storev1.StoreName(pool, csiGuestNode)
	// Raw pools on their own virtio disks, reached by the local protocol: GPT partitions on
	// /dev/vdb and /dev/vdc, whole disks /dev/vdd (128 MiB) and /dev/vde (192 MiB).
	rawGPT := policyv1.Backend{Raw: &policyv1.RawBackend{Devices: guestRawGPTDisks, Partitioning: policyv1.PartitioningGPT}}
	rawWhole := policyv1.Backend{Raw: &policyv1.RawBackend{Devices: guestRawWholeDisks, Partitioning: policyv1.PartitioningWhole}}
	create(t, c, &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: "graw-local"}, Spec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}})
	rawParams := map[string]map[string]string{}
	var rawStores []string
	for name, b := range map[string]policyv1.Backend{"graw": rawGPT, "gwhole": rawWhole} {
		create(t, c, &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: policyv1.StoragePoolSpec{Backend: b}})
		create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: policyv1.PlacementSpec{
			PoolRef: policyv1.LocalObjectReference{Name: name}, ProtocolRef: policyv1.LocalObjectReference{Name: "graw-local"},
			StorageClass:      policyv1.StorageClassTemplate{Name: name, AllowVolumeExpansion: true, VolumeBindingMode: "WaitForFirstConsumer"},
			Filesystem:        policyv1.Filesystem{FSType: "ext4"},
			AttributesClasses: []policyv1.AttributesClassTemplate{sanityTier(name)},
		}})
		st := storev1.StoreName(name, csiGuestNode)
		rawStores = append(rawStores, st)
		create(t, c, &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: st, Labels: map[string]string{
			policyv1.LabelPool: storev1.NameLabelValue(name), policyv1.LabelNode: storev1.NameLabelValue(csiGuestNode)}},
			Spec: storev1.StoreSpec{Pool: name, NodeName: csiGuestNode, Backend: b}})
		rawParams[name] = map[string]string{policyv1.ParamPlacement: name, policyv1.ParamPool: name, policyv1.ParamProtocol: "graw-local"}
	}
	// A ZFS pool (sparse zvols) on its own disk /dev/vdf, reached by the local protocol: the
	// snapshot, restore and clone specs run on it too (zfs snapshot and clone, not thin LVs).
	zfsPool := "gzfs"
	zfsBackend := policyv1.Backend{ZFS: &policyv1.ZFSBackend{Pool: guestZpool, ParentDataset: "csi"}}
	create(t, c, &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: zfsPool}, Spec: policyv1.StoragePoolSpec{Backend: zfsBackend}})
	create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: zfsPool}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: zfsPool}, ProtocolRef: policyv1.LocalObjectReference{Name: "graw-local"},
		StorageClass: policyv1.StorageClassTemplate{Name: zfsPool, AllowVolumeExpansion: true, VolumeBindingMode: "WaitForFirstConsumer"},
		Filesystem:   policyv1.Filesystem{FSType: "ext4"},
	}})
	zfsStore := storev1.StoreName(zfsPool, csiGuestNode)
	create(t, c, &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: zfsStore, Labels: map[string]string{
		policyv1.LabelPool: storev1.NameLabelValue(zfsPool), policyv1.LabelNode: storev1.NameLabelValue(csiGuestNode)}},
		Spec: storev1.StoreSpec{Pool: zfsPool, NodeName: csiGuestNode, Backend: zfsBackend, OvercommitPercent: 400}})
	zfsParams := map[string]string{policyv1.ParamPlacement: zfsPool, policyv1.ParamPool: zfsPool, policyv1.ParamProtocol: "graw-local"}
	create(t, c, &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: csiGuestNode, Labels: map[string]string{policyv1.LabelNode: storev1.NameLabelValue(csiGuestNode)}},
		Spec: storev1.AgentSpec{NodeName: csiGuestNode, Stores: append([]string{store, zfsStore}, rawStores...), NVMeoF: &storev1.NVMeoFEndpoint{Port: 4420, BindCIDR: "127.0.0.0/8"}}})
	create(t, c, &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: store, Labels: map[string]string{
		policyv1.LabelPool: storev1.NameLabelValue(pool), policyv1.LabelNode: storev1.NameLabelValue(csiGuestNode)}},
		Spec: storev1.StoreSpec{Pool: pool, NodeName: csiGuestNode, Backend: vg, Reserve: "5%", OvercommitPercent: 400}})
	params := map[string]string{policyv1.ParamPlacement: pool + "-nvme", policyv1.ParamPool: pool, policyv1.ParamProtocol: pool + "-nvme"}
	luksParams := map[string]string{policyv1.ParamPlacement: pool + "-luks", policyv1.ParamPool: pool, policyv1.ParamProtocol: pool + "-nvme"}
	return guestPolicy{store: store, zfsStore: zfsStore, rawStores: rawStores, params: params, rawParams: rawParams, zfsParams: zfsParams, luksParams: luksParams}
}

// waitGuestReady waits until the agent in the guest reports its Stores Ready and the node
// plugin has labelled and annotated its Node, and the CSI socket is there.
func waitGuestReady(t *testing.T, g csiGuest, c client.Client, store, zfsStore string, rawStores []string) {
	t.Helper()
	ctx := t.Context()
	// The agent reports the thin pool; the node plugin labels and annotates its Node.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var st storev1.Store
		var n corev1.Node
		errS := c.Get(ctx, client.ObjectKey{Name: store}, &st)
		errN := c.Get(ctx, client.ObjectKey{Name: csiGuestNode}, &n)
		rawReady := true
		for _, name := range append([]string{zfsStore}, rawStores...) {
			var rs storev1.Store
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &rs); err != nil || !apimeta.IsStatusConditionTrue(rs.Status.Conditions, "Ready") {
				rawReady = false
			}
		}
		if errS == nil && errN == nil && rawReady && apimeta.IsStatusConditionTrue(st.Status.Conditions, "Ready") && st.Status.Capacity != nil &&
			n.Annotations[policyv1.AnnotationHostNQN] == csiGuestHostNQN && n.Labels[policyv1.LabelNVMeInitiator] == "true" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest not ready: Store %+v (%v), Node %v %v (%v)", st.Status, errS, n.Labels, n.Annotations, errN)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, code := g.try(time.Minute, "test -S "+guestSocket); code != 0 {
		t.Fatalf("no CSI socket at %s", guestSocket)
	}
}

// guestSanity runs csi-sanity in the guest on the LVM thin + NVMe-oF/TCP class.
func guestSanity(t *testing.T, gg *guest.Guest, share string) {
	g := csiGuest{t, gg}
	start := time.Now()
	out, code := g.try(40*time.Minute, fmt.Sprintf("mkdir -p /tmp/sanity && cd /tmp && /tmp/csi-sanity --csi.endpoint=%s --csi.testvolumeparameters=%s/params.yaml "+
		"--csi.testvolumemutableparameters=%s/mutable-params.yaml "+
		"--csi.mountdir=/tmp/sanity/mount --csi.stagingdir=/tmp/sanity/staging --csi.testvolumesize=%d --csi.testvolumeexpandsize=%d "+
		"--ginkgo.no-color --ginkgo.timeout=35m %s 2>&1", guestSocket, share, share, 64<<20, 128<<20, csisanity.ReportFlag(share+"/sanity-report.json")))
	t.Logf("TIMING csi-sanity in the guest %s", time.Since(start).Round(time.Second))
	m := sanitySummary.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("csi-sanity: exit %d\n%s", code, tailLines(out, 250))
	}
	t.Logf("csi-sanity on LVM + NVMe-oF/TCP in the guest: ran %s of %s specs: %s passed, %s failed, %s pending, %s skipped", m[1], m[2], m[3], m[4], m[5], m[6])
	if m[4] != "0" {
		t.Errorf("csi-sanity failures:\n%s", tailLines(out, 250))
	}
	checkSanityReport(t, filepath.Join(gg.ShareDir(), "sanity-report.json"), guestSanitySkipped...)
	// sanity's node specs staged NVMe-oF namespaces: mount-utils formatted /dev/nvme* devices
	formatted := g.sh(time.Minute, `grep -c 'Disk successfully formatted (mkfs): ext4 - /dev/nvme[0-9]*n[0-9]* ' /tmp/csi.log || true`)
	t.Logf("csi-sanity's NodeStage formatted %s NVMe-oF namespaces", strings.TrimSpace(formatted))
	if strings.TrimSpace(formatted) == "0" {
		t.Error("csi-sanity staged no NVMe-oF namespace (no mkfs of a /dev/nvme* device in the driver's log)")
	}
}

// guestRawStores checks the raw Stores' capacity and the GPT labels the agent put on their disks.
func guestRawStores(t *testing.T, gg *guest.Guest, c client.Client, rawStores []string) {
	ctx := t.Context()
	for _, name := range rawStores {
		var st storev1.Store
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &st); err != nil {
			t.Fatal(err)
		}
		t.Logf("store %s: capacity %+v", name, *st.Status.Capacity)
		// GPT: 1 GiB + 512 MiB disks, 2 MiB each for the GPT and alignment, the larger bounds a
		// volume; Whole: 128 + 192 MiB disks, the larger free one bounds a volume
		want := [2]int64{1532 << 20, 1022 << 20}
		if name == storev1.StoreName("gwhole", csiGuestNode) {
			want = [2]int64{316 << 20, 190 << 20}
		}
		if cp := st.Status.Capacity; cp.Total != want[0] || cp.Available != want[1] || cp.Provisioned != 0 || st.Status.ExtentBytes != 1<<20 {
			t.Errorf("store %s: capacity %+v, extent %d; want total %d, available %d, unit 1 MiB", name, *cp, st.Status.ExtentBytes, want[0], want[1])
		}
	}
	g := csiGuest{t, gg}
	// the disks now carry an empty GPT
	out := g.sh(time.Minute, "for d in "+strings.Join(append(append([]string{}, guestRawGPTDisks...), guestRawWholeDisks...), " ")+"; do sfdisk --json $d | grep -c '\"label\": \"gpt\"'; done")
	if got := strings.Join(strings.Fields(out), " "); got != "1 1 1 1" {
		t.Errorf("GPT labels on the raw disks: %q, want 4", out)
	}
}

// guestRawSanity runs csi-sanity in the guest on the raw GPT class, its snapshot and clone
// specs skipped.
func guestRawSanity(t *testing.T, gg *guest.Guest, share string) {
	g := csiGuest{t, gg}
	start := time.Now()
	out, code := g.try(40*time.Minute, fmt.Sprintf("mkdir -p /tmp/rsanity && cd /tmp && /tmp/csi-sanity --csi.endpoint=%s --csi.testvolumeparameters=%s/raw-params.yaml "+
		"--csi.testvolumemutableparameters=%s/raw-mutable-params.yaml "+
		"--csi.mountdir=/tmp/rsanity/mount --csi.stagingdir=/tmp/rsanity/staging --csi.testvolumesize=%d --csi.testvolumeexpandsize=%d "+
		"--ginkgo.no-color --ginkgo.timeout=35m --ginkgo.skip='%s' %s 2>&1", guestSocket, share, share, 64<<20, 128<<20, rawSanitySkip, csisanity.ReportFlag(share+"/raw-sanity-report.json")))
	t.Logf("TIMING csi-sanity raw in the guest %s", time.Since(start).Round(time.Second))
	m := sanitySummary.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("csi-sanity: exit %d\n%s", code, tailLines(out, 250))
	}
	t.Logf("csi-sanity on raw GPT partitions in the guest: ran %s of %s specs: %s passed, %s failed, %s pending, %s skipped", m[1], m[2], m[3], m[4], m[5], m[6])
	if m[4] != "0" {
		t.Errorf("csi-sanity failures:\n%s", tailLines(out, 250))
	}
	checkRawSanityReport(t, filepath.Join(gg.ShareDir(), "raw-sanity-report.json"))
	formatted := g.sh(time.Minute, `grep -c 'Disk successfully formatted (mkfs): ext4 - /dev/vd[bc][0-9]* ' /tmp/csi.log || true`)
	t.Logf("csi-sanity's NodeStage formatted %s raw partitions", strings.TrimSpace(formatted))
	if strings.TrimSpace(formatted) == "0" {
		t.Error("csi-sanity staged no raw partition (no mkfs of a /dev/vd[bc]N device in the driver's log)")
	}
}

// guestZFSSanity runs csi-sanity's snapshot, restore and clone specs in the guest on the ZFS
// class, then waits for the zfs snapshots to go.
func guestZFSSanity(t *testing.T, gg *guest.Guest, share string) {
	g := csiGuest{t, gg}
	start := time.Now()
	out, code := g.try(30*time.Minute, fmt.Sprintf("mkdir -p /tmp/zsanity && cd /tmp && /tmp/csi-sanity --csi.endpoint=%s --csi.testvolumeparameters=%s/zfs-params.yaml "+
		"--csi.mountdir=/tmp/zsanity/mount --csi.stagingdir=/tmp/zsanity/staging --csi.testvolumesize=%d --csi.testvolumeexpandsize=%d "+
		"--ginkgo.no-color --ginkgo.timeout=25m --ginkgo.focus='%s' %s 2>&1", guestSocket, share, 64<<20, 128<<20, rawSanitySkip, csisanity.ReportFlag(share+"/zfs-sanity-report.json")))
	t.Logf("TIMING csi-sanity ZFS snapshots in the guest %s", time.Since(start).Round(time.Second))
	m := sanitySummary.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("csi-sanity: exit %d\n%s", code, tailLines(out, 250))
	}
	t.Logf("csi-sanity snapshot specs on ZFS in the guest: ran %s of %s specs: %s passed, %s failed, %s pending, %s skipped", m[1], m[2], m[3], m[4], m[5], m[6])
	checkZFSSanityReport(t, filepath.Join(gg.ShareDir(), "zfs-sanity-report.json"))
	// the agent destroys in the background of the finalizers: wait up to 2 minutes
	if n := strings.TrimSpace(g.sh(3*time.Minute, "for i in $(seq 120); do n=$(zfs list -H -t snapshot -o name -r "+guestZpool+" | wc -l); [ \"$n\" = 0 ] && break; sleep 1; done; echo $n")); n != "0" {
		t.Errorf("%s zfs snapshots left 2 minutes after the snapshot specs", n)
	}
}

// guestNothingLeft checks that no VolumeState of the guest's Stores is left, nor LVs, NVMe
// subsystems, nvmet subsystems, stage records, zvols and snapshots, mounts or raw partitions
// in the guest.
func guestNothingLeft(t *testing.T, gg *guest.Guest, c client.Client, store, zfsStore string, rawStores []string) {
	ctx := t.Context()
	g := csiGuest{t, gg}
	var list storev1.VolumeStateList
	if err := c.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	for _, vs := range list.Items {
		if vs.Spec.StoreName == store || vs.Spec.StoreName == zfsStore || slices.Contains(rawStores, vs.Spec.StoreName) {
			t.Errorf("VolumeState %s left behind (phase %s)", vs.Name, vs.Status.Phase)
		}
	}
	// the agent deletes in the background of the VolumeState's finalizer: wait for the LVs
	out, code := g.try(5*time.Minute, `for i in $(seq 120); do n=$(lvs --noheadings -o lv_name plinth-csi | grep -vc '^ *pool$'); [ "$n" = 0 ] && break; sleep 1; done
lvs --noheadings -o lv_name plinth-csi | grep -v '^ *pool$'
for d in /sys/class/nvme-subsystem /sys/kernel/config/nvmet/subsystems `+guestStateDir+`; do ls -A $d 2>/dev/null; done
zfs list -H -t all -o name -r `+guestZpool+` | grep -v '^`+guestZpool+`$\|^`+guestZpool+`/csi$'
grep ' /tmp/sanity\| /tmp/rsanity\| /tmp/zsanity\| /tmp/ig' /proc/self/mountinfo
for d in `+strings.Join(append(append([]string{}, guestRawGPTDisks...), guestRawWholeDisks...), " ")+`; do sfdisk --json $d | grep '"node"'; done; true`)
	if code != 0 || strings.TrimSpace(out) != "" {
		t.Errorf("left in the guest (LVs, NVMe subsystems, nvmet subsystems, stage records, zvols and snapshots, mounts, raw partitions):\n%s", out)
	}
}
