package csi_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/controlplane"
	"github.com/plinth-storage/plinth/test/csisanity"
	"github.com/plinth-storage/plinth/test/kernel/apimux"
	"github.com/plinth-storage/plinth/test/kernel/guest"
)

// The CSI guest suite: `plinth agent` (LVM thin pool, NVMe-oF/TCP export through nvmet) and
// `plinth csi --mode all` run as root in the qemu guest of test/kernel (Debian's kernel, real
// LVM, real nvmet configfs, the real nvme-tcp initiator), against this host's kube-apiserver
// (reached through test/kernel/apimux and guestfwd). csi-sanity runs in the guest
// next to the driver's socket; then this package's test binary runs in the guest
// (TestInGuestNVMeoFNode) for the node path's field cases on the real kernel. The guest's
// node connects to its own nvmet target over loopback TCP: the same kernel code as between
// two machines.
//
// It boots one guest (several minutes under software emulation), so it runs only with
// PLINTH_GUEST_CSI=1, after make testbin and make kernel-assets (make test-kernel does both).

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
		StorageClass: policyv1.StorageClassTemplate{Name: pool + "-nvme", AllowVolumeExpansion: true},
		Filesystem:   policyv1.Filesystem{FSType: "ext4"},
	}})
	store := storev1.StoreName(pool, csiGuestNode)
	create(t, c, &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: csiGuestNode, Labels: map[string]string{policyv1.LabelNode: storev1.NameLabelValue(csiGuestNode)}},
		Spec: storev1.AgentSpec{NodeName: csiGuestNode, Stores: []string{store}, NVMeoF: &storev1.NVMeoFEndpoint{Port: 4420, BindCIDR: "127.0.0.0/8"}}})
	create(t, c, &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: store, Labels: map[string]string{
		policyv1.LabelPool: storev1.NameLabelValue(pool), policyv1.LabelNode: storev1.NameLabelValue(csiGuestNode)}},
		Spec: storev1.StoreSpec{Pool: pool, NodeName: csiGuestNode, Backend: vg, Reserve: "5%", OvercommitPercent: 400}})
	params := map[string]string{policyv1.ParamPlacement: pool + "-nvme", policyv1.ParamPool: pool, policyv1.ParamProtocol: pool + "-nvme"}

	bootStart := time.Now()
	gg, err := guest.Boot(ctx, guest.Options{
		DiskBytes:     []int64{3 << 30}, // /dev/vda: the VG
		GuestForwards: []guest.Forward{{HostPort: demux.Port(), GuestPort: 6443}},
		Timeout:       40 * time.Minute,
	})
	if err != nil {
		t.Fatalf("boot guest: %v", err)
	}
	t.Cleanup(func() { gg.Stop() }) //nolint:errcheck
	g := csiGuest{t, gg}
	t.Logf("TIMING guest-boot %s", time.Since(bootStart).Round(time.Millisecond))

	kc, err := cp.KubeconfigFor("admin", "https://127.0.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	pdata, _ := yaml.Marshal(params)
	files := map[string][]byte{"kubeconfig": kc, "params.yaml": pdata}
	for _, f := range []string{filepath.Join(work, "plinth"), filepath.Join(work, "apimux"), filepath.Join(work, "csi.test"), sanity} {
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
	share := guest.SharePath
	g.sh(time.Minute, fmt.Sprintf("cp %s/apimux %s/plinth %s/csi-sanity %s/csi.test /tmp/ && (/tmp/apimux -listen 127.0.0.1:6443 -upstream %s:6443 >/tmp/apimux.log 2>&1 &)",
		share, share, share, share, guest.GuestForwardAddr))
	g.sh(time.Minute, fmt.Sprintf("/tmp/plinth agent --node %s --kubeconfig %s/kubeconfig --state-dir /tmp/agent-state --refresh-interval 10s "+
		"--metrics-bind-address 0 --health-probe-bind-address 0 --v 1 >/tmp/agent.log 2>&1 &", csiGuestNode, share))
	g.sh(time.Minute, fmt.Sprintf("mkdir -p /tmp/csi && /tmp/plinth csi --mode all --endpoint unix://%s --node-name %s --kubeconfig %s/kubeconfig "+
		"--state-dir %s --wait-timeout 3m --registration-dir= -v 2 >/tmp/csi.log 2>&1 &", guestSocket, csiGuestNode, share, guestStateDir))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := g.try(time.Minute, "tail -n 60 /tmp/agent.log; echo ---- csi; tail -n 120 /tmp/csi.log; echo ----; cat /tmp/apimux.log; lvs -a; "+
				"ls /sys/class/nvme-subsystem/; ls /sys/kernel/config/nvmet/subsystems; grep -v ' /sys\\| /proc\\| /dev' /proc/self/mountinfo")
			t.Logf("guest logs and kernel state:\n%s", out)
		}
	})

	// The agent reports the thin pool; the node plugin labels and annotates its Node.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var st storev1.Store
		var n corev1.Node
		errS := c.Get(ctx, client.ObjectKey{Name: store}, &st)
		errN := c.Get(ctx, client.ObjectKey{Name: csiGuestNode}, &n)
		if errS == nil && errN == nil && apimeta.IsStatusConditionTrue(st.Status.Conditions, "Ready") && st.Status.Capacity != nil &&
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

	t.Run("Sanity", func(t *testing.T) {
		g := csiGuest{t, gg}
		start := time.Now()
		out, code := g.try(40*time.Minute, fmt.Sprintf("mkdir -p /tmp/sanity && cd /tmp && /tmp/csi-sanity --csi.endpoint=%s --csi.testvolumeparameters=%s/params.yaml "+
			"--csi.mountdir=/tmp/sanity/mount --csi.stagingdir=/tmp/sanity/staging --csi.testvolumesize=%d --csi.testvolumeexpandsize=%d "+
			"--ginkgo.no-color --ginkgo.timeout=35m %s 2>&1", guestSocket, share, 64<<20, 128<<20, csisanity.ReportFlag(share+"/sanity-report.json")))
		t.Logf("TIMING csi-sanity in the guest %s", time.Since(start).Round(time.Second))
		m := sanitySummary.FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("csi-sanity: exit %d\n%s", code, tailLines(out, 250))
		}
		t.Logf("csi-sanity on LVM + NVMe-oF/TCP in the guest: ran %s of %s specs: %s passed, %s failed, %s pending, %s skipped", m[1], m[2], m[3], m[4], m[5], m[6])
		if m[4] != "0" {
			t.Errorf("csi-sanity failures:\n%s", tailLines(out, 250))
		}
		checkSanityReport(t, filepath.Join(gg.ShareDir(), "sanity-report.json"))
		// sanity's node specs staged NVMe-oF namespaces: mount-utils formatted /dev/nvme* devices
		formatted := g.sh(time.Minute, `grep -c 'Disk successfully formatted (mkfs): ext4 - /dev/nvme[0-9]*n[0-9]* ' /tmp/csi.log || true`)
		t.Logf("csi-sanity's NodeStage formatted %s NVMe-oF namespaces", strings.TrimSpace(formatted))
		if strings.TrimSpace(formatted) == "0" {
			t.Error("csi-sanity staged no NVMe-oF namespace (no mkfs of a /dev/nvme* device in the driver's log)")
		}
	})

	t.Run("NodeNVMeoF", func(t *testing.T) {
		g := csiGuest{t, gg}
		out, code := g.try(15*time.Minute, fmt.Sprintf("cd /tmp && PLINTH_CSI_GUEST_SOCKET=%s PLINTH_CSI_GUEST_PARAMS=%s/params.yaml PLINTH_CSI_GUEST_STATE=%s "+
			"PLINTH_CSI_GUEST_NODE=%s /tmp/csi.test -test.run '^TestInGuestNVMeoFNode$' -test.v -test.count=1 -test.timeout=14m 2>&1",
			guestSocket, share, guestStateDir, csiGuestNode))
		t.Logf("in the guest:\n%s", out)
		if code != 0 || !strings.Contains(out, "--- PASS: TestInGuestNVMeoFNode") {
			t.Fatalf("TestInGuestNVMeoFNode in the guest: exit %d", code)
		}
		// A subtest that skipped in the guest would pass its parent: no skip counts as run.
		if strings.Contains(out, "--- SKIP") {
			t.Errorf("TestInGuestNVMeoFNode skipped subtests in the guest (see its output above)")
		}
	})

	t.Run("NothingLeftBehind", func(t *testing.T) {
		g := csiGuest{t, gg}
		var list storev1.VolumeStateList
		if err := c.List(ctx, &list); err != nil {
			t.Fatal(err)
		}
		for _, vs := range list.Items {
			if vs.Spec.StoreName == store {
				t.Errorf("VolumeState %s left behind (phase %s)", vs.Name, vs.Status.Phase)
			}
		}
		// the agent deletes in the background of the VolumeState's finalizer: wait for the LVs
		out, code := g.try(5*time.Minute, `for i in $(seq 120); do n=$(lvs --noheadings -o lv_name plinth-csi | grep -vc '^ *pool$'); [ "$n" = 0 ] && break; sleep 1; done
lvs --noheadings -o lv_name plinth-csi | grep -v '^ *pool$'
for d in /sys/class/nvme-subsystem /sys/kernel/config/nvmet/subsystems `+guestStateDir+`; do ls -A $d 2>/dev/null; done
grep ' /tmp/sanity\| /tmp/ig' /proc/self/mountinfo; true`)
		if code != 0 || strings.TrimSpace(out) != "" {
			t.Errorf("left in the guest (LVs, NVMe subsystems, nvmet subsystems, mounts, stage records):\n%s", out)
		}
	})
}
