package csi_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/csisanity"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/prereq"
)

var built struct {
	once sync.Once
	path string
	err  error
}

// buildPlinth builds cmd/plinth once per test binary (into a folder TestMain removes), or
// returns $PLINTH_BINARY when set.
func buildPlinth(t testing.TB, _ string) string {
	t.Helper()
	if p := os.Getenv("PLINTH_BINARY"); p != "" {
		return p
	}
	built.once.Do(func() {
		root, err := controlplane.ModuleRoot()
		if err != nil {
			built.err = err
			return
		}
		dir, err := os.MkdirTemp("", "plinth-bin-")
		if err != nil {
			built.err = err
			return
		}
		built.path = filepath.Join(dir, "plinth")
		args := []string{"build", "-o", built.path}
		if raceEnabled {
			// the race lane: the plugin processes run with the race detector too, and their
			// packages come from the build cache the race-built tests filled
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/plinth")...)
		cmd.Dir = root // same environment as the test: the build cache serves it
		if b, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build ./cmd/plinth: %v\n%s", err, b)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// fileBackendNode sets up, on the shared control plane, one node with a file-backend pool as
// Plinth's controller would render it (StoragePool, Protocol local, Placement, Agent, Store),
// plus the Node object that kubelet would register, then runs the REAL agent
// (`plinth agent`, agents/agent) for that node on this host and waits for its capacity report.
// It returns the StorageClass parameters. The agent refreshes every 2 s, so that tests see
// capacity and drift soon; fileBackendNodeRefresh takes the interval.
func fileBackendNode(t testing.TB, cp *controlplane.ControlPlane, plinth, name string) map[string]string {
	t.Helper()
	return fileBackendNodeRefresh(t, cp, plinth, name, 2*time.Second)
}

// fileBackendNodeRefresh is fileBackendNode with the agent's --refresh-interval given.
func fileBackendNodeRefresh(t testing.TB, cp *controlplane.ControlPlane, plinth, name string, refresh time.Duration, extra ...string) map[string]string {
	t.Helper()
	return fileBackendNodeIn(t, cp, plinth, name, refresh, t.TempDir(), extra...)
}

// fileBackendNodeIn is fileBackendNodeRefresh with the pool's volumes in dir/volumes and the
// agent's state in dir/agent; extra are more `plinth agent` flags.
func fileBackendNodeIn(t testing.TB, cp *controlplane.ControlPlane, plinth, name string, refresh time.Duration, dir string, extra ...string) map[string]string {
	t.Helper()
	ctx := t.Context()
	c := kubeClient(t, cp.Admin.Config)
	pool := name
	node := name + "-node"
	create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}) // stands in for kubelet's registration
	create(t, c, &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: pool}, Spec: policyv1.StoragePoolSpec{
		Backend: policyv1.Backend{File: &policyv1.FileBackend{Directory: filepath.Join(dir, "volumes")}}}})
	create(t, c, &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: pool + "-local"}, Spec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}})
	create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: pool + "-local"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: pool}, ProtocolRef: policyv1.LocalObjectReference{Name: pool + "-local"},
		StorageClass: policyv1.StorageClassTemplate{Name: pool + "-local", AllowVolumeExpansion: true},
		// xfs: ext4 online growth needs CAP_SYS_RESOURCE, which this host's sandbox withholds.
		Filesystem:        policyv1.Filesystem{FSType: "xfs"},
		AttributesClasses: []policyv1.AttributesClassTemplate{sanityTier(pool + "-local")},
	}})
	store := storev1.StoreName(pool, node)
	labels := map[string]string{policyv1.LabelPool: storev1.NameLabelValue(pool), policyv1.LabelNode: storev1.NameLabelValue(node)}
	create(t, c, &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{policyv1.LabelNode: storev1.NameLabelValue(node)}},
		Spec: storev1.AgentSpec{NodeName: node, Stores: []string{store}}})
	create(t, c, &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: store, Labels: labels},
		Spec: storev1.StoreSpec{Pool: pool, NodeName: node, Backend: policyv1.Backend{File: &policyv1.FileBackend{Directory: filepath.Join(dir, "volumes")}}}})

	agent, err := cp.StartProcess(ctx, controlplane.ProcessSpec{
		Name:   "plinth-agent-" + name,
		Binary: plinth,
		Args: append([]string{"agent", "--node", node, "--kubeconfig", cp.Admin.Kubeconfig, "--state-dir", filepath.Join(dir, "agent"),
			"--refresh-interval", refresh.String(), "--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--host-nqn-file", filepath.Join(dir, "no-hostnqn")}, extra...),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- agent log, last lines:\n%s", agent.Tail(40))
		}
		agent.Stop() //nolint:errcheck
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var st storev1.Store
		if err := c.Get(ctx, client.ObjectKey{Name: store}, &st); err == nil && st.Status.Capacity != nil && st.Status.Capacity.Available > 0 {
			break
		}
		if agent.Exited() || time.Now().After(deadline) {
			t.Fatalf("the agent did not report capacity of %s:\n%s", store, agent.Tail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return map[string]string{policyv1.ParamPlacement: pool + "-local", policyv1.ParamPool: pool, policyv1.ParamProtocol: pool + "-local"}
}

// startCSIProcess runs `plinth csi` as its own process (the binary the DaemonSet runs).
func startCSIProcess(t testing.TB, cp *controlplane.ControlPlane, plinth, mode, node string, extra ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "plinth-csi-") // short unix socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "csi.sock")
	args := []string{"csi", "--mode", mode, "--endpoint", "unix://" + sock, "--kubeconfig", cp.Admin.Kubeconfig,
		"--state-dir", filepath.Join(dir, "state"), "--host-nqn-file", filepath.Join(dir, "no-hostnqn"), "--wait-timeout", "60s", "-v", "2",
		// no kubelet here, and two processes would share the default health port
		"--registration-dir=", "--health-address="}
	if node != "" {
		args = append(args, "--node-name", node)
	}
	args = append(args, extra...)
	p, err := cp.StartProcess(t.Context(), controlplane.ProcessSpec{Name: "plinth-csi-" + mode, Binary: plinth, Args: args,
		Ready: controlplane.SocketReady(sock), ReadyTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- plinth csi log, last lines:\n%s", p.Tail(60))
		}
		p.Stop() //nolint:errcheck
	})
	return sock
}

// sanityAttachLimitFlag gives the node plugin of the host's csi-sanity run a limit of 3 published
// volumes, so that the attach limit spec (--csi.testnodevolumeattachlimit) publishes 3 and
// sees the 4th refused; no other spec publishes more than one volume at a time.
const sanityAttachLimitFlag = "--max-volumes-per-node=3"

var sanitySummary = regexp.MustCompile(`Ran (\d+) of (\d+) Specs.*\n(?:.*\n)?.*(?:SUCCESS|FAIL)!? -- (\d+) Passed \| (\d+) Failed \| (\d+) Pending \| (\d+) Skipped`)

// TestSanityAllMode runs csi-sanity in full against `plinth csi --mode all` with the real agent
// and the file backend on this host's loop devices (mkfs, mount), on the real API server.
func TestSanityAllMode(t *testing.T) {
	prereq.Root(t, "csi-sanity with the file backend uses loop devices and mount")
	noLeftovers(t)
	controlplane.RequireBinaries(t, controlplane.BinCSISanity)
	cp := sharedControlPlane(t)
	bin := t.TempDir()
	plinth := buildPlinth(t, bin)
	params := fileBackendNode(t, cp, plinth, "sanity")
	sock := startCSIProcess(t, cp, plinth, "all", "sanity-node", sanityAttachLimitFlag)
	paramFile := filepath.Join(bin, "params.yaml")
	data, _ := yaml.Marshal(params)
	if err := os.WriteFile(paramFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	mutableFile := filepath.Join(bin, "mutable-params.yaml")
	data, _ = yaml.Marshal(sanityMutableParams(params[policyv1.ParamPlacement]))
	if err := os.WriteFile(mutableFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sanity, _ := controlplane.BinaryPath("", controlplane.BinCSISanity)
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sanity,
		"--csi.endpoint="+sock,
		"--csi.testvolumeparameters="+paramFile,
		"--csi.testvolumemutableparameters="+mutableFile,
		"--csi.testnodevolumeattachlimit",
		"--csi.mountdir="+filepath.Join(work, "mount"),
		"--csi.stagingdir="+filepath.Join(work, "staging"),
		fmt.Sprintf("--csi.testvolumesize=%d", 320<<20), // xfs needs 300 MiB
		fmt.Sprintf("--csi.testvolumeexpandsize=%d", 640<<20),
		"--ginkgo.no-color",
		"--ginkgo.timeout=14m",
		csisanity.ReportFlag(filepath.Join(work, "report.json")),
	)
	out, err := cmd.CombinedOutput()
	m := sanitySummary.FindStringSubmatch(string(out))
	if err != nil || m == nil {
		t.Fatalf("csi-sanity: %v\n%s", err, tailLines(string(out), 200))
	}
	t.Logf("csi-sanity: ran %s of %s specs: %s passed, %s failed, %s pending, %s skipped", m[1], m[2], m[3], m[4], m[5], m[6])
	if m[4] != "0" {
		t.Errorf("csi-sanity failures:\n%s", tailLines(string(out), 200))
	}
	checkSanityReport(t, filepath.Join(work, "report.json"))
}

// sanitySkipped are the csi-sanity specs (csisanity.Name) that skip against this driver, by
// design. One is left: SNAPSHOT_ACCESSIBILITY_CONSTRAINTS. CreateSnapshot returns a local
// snapshot's node as its accessible topology, which csi-sanity v5.6.0 compares with the
// topology it sent using reflect.DeepEqual, failing on protobuf's internal size cache of the
// marshalled request — a driver that returns snapshot topology cannot pass that spec, so the
// capability is not advertised (Kubernetes does not read it yet). Everything else runs:
// snapshots, restores and clones (CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, GET_SNAPSHOT,
// CLONE_VOLUME), group snapshots (the GroupController's CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT),
// volume attribute classes and ModifyVolume (MODIFY_VOLUME, with the parameters of a tier of
// the class's Placement: sanityMutableParams), controller volume health (GET_VOLUME_HEALTH,
// LIST_VOLUME_HEALTH), read-only publish (PUBLISH_READONLY), the node's attach limit
// (sanityAttachLimitFlag with --csi.testnodevolumeattachlimit) and NodeGetStorageHealth
// (GET_STORAGE_HEALTH). All others must pass, so a capability that stops being advertised (its
// specs turn into skips) or a spec that starts skipping fails the test. The driver's
// capabilities are the same for every backend and protocol, so the host run (file backend)
// and the guest run (LVM thin + NVMe-oF) expect the same, but for the attach limit spec, which
// the guest runs skip (guestSanitySkipped). Observed with csi-sanity v5.6.0, on the host: 101
// passed, 1 skipped, 1 pending (before: 95 passed, 7 skipped).
var sanitySkipped = []string{
	"CreateSnapshot [Controller Server] should succeed when creating a snapshot with accessibility requirements",
}

// checkSanityReport compares the Ginkgo JSON report of a csi-sanity run with sanitySkipped:
// exactly those skipped, every other spec of the pinned csi-sanity (csisanity.Specs) passed.
func checkSanityReport(t *testing.T, path string, alsoSkipped ...string) {
	t.Helper()
	res, err := csisanity.ReadReport(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("csi-sanity report: %d passed, %d skipped, %d failed, %d pending", res.Passed, res.Skipped, res.Failed, res.Pending)
	skipped := append(slices.Clone(sanitySkipped), alsoSkipped...)
	if err := res.Check(csisanity.Specs-len(skipped), csisanity.Pending, skipped); err != nil {
		t.Errorf("csi-sanity did not run as this driver must (skipped now: %q):\n%v", res.SkippedSpecs, err)
	}
}

func tailLines(s string, n int) string {
	lines := regexp.MustCompile("\n").Split(s, -1)
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := ""
	for _, l := range lines {
		out += l + "\n"
	}
	return out
}

// sanityTier is the tier of Placement placement that csi-sanity's volume attribute class and
// ModifyVolume specs name: a write limit of 1 GiB/s, far above what the specs write.
func sanityTier(placement string) policyv1.AttributesClassTemplate {
	limit := int64(1 << 30)
	return policyv1.AttributesClassTemplate{Name: placement + "-sanity", Limits: policyv1.IOLimits{WriteBytesPerSecond: &limit}}
}

// sanityMutableParams are the parameters of sanityTier's VolumeAttributesClass, as the controller
// renders it (--csi.testvolumemutableparameters).
func sanityMutableParams(placement string) map[string]string {
	t := sanityTier(placement)
	return policyv1.AttributesClassParameters(placement, &t)
}
