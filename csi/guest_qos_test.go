package csi_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/iolimit"
	"github.com/plinth-storage/plinth/csi/node"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// guestTierRates are the three write limits measured on each device, bytes per second: far
// below what the guest's devices move unthrottled (66–188 MiB/s with two O_DIRECT writers
// under TCG in three runs; each run measures it again as its floor), so the rate measured is
// the throttle's.
var guestTierRates = []int64{2 << 20, 4 << 20, 8 << 20}

// guestTierSeconds is how long each measurement writes at its limit.
const guestTierSeconds = 6

// guestTierTolerance is how far above its limit a measured rate may be: the issue's ±10 %.
const guestTierTolerance = 0.10

// guestFloorBytes is what the unthrottled measurement (the floor of each device) writes.
const guestFloorBytes = 64 << 20

// TestInGuestTierLimits runs in the qemu guest of TestGuestCSISanityLVMNVMeoF (subtest
// TierLimits): the enforcement of the tiers' write limits on a thin LV and on the NVMe-oF
// namespace it is exported as, on the guest's own kernel, cgroup v2 (io.max; the harness
// mounts the unified hierarchy before the node plugin starts). The LV: csi/iolimit writes each
// limit into a cgroup standing in for a pod's, and two O_DIRECT writers (dd) in its container
// cgroup write to the LV. The NVMe-oF namespace: the whole node path — a block volume of a
// class with three tiers, published for a pod UID (podInfoOnMount), the node plugin (`plinth
// csi --mode all`) writing the tier into that pod's cgroup, ControllerModifyVolume moving it
// through the three tiers and returning once the node reported each.
//
// Asserted for each limit: the pod cgroup's io.max line for the device is exactly the tier's
// (wbps=limit, the rest max), and the measured rate is at most 10 % above the limit, while the
// same device unthrottled (the same writers in a sibling cgroup without limits, the floor)
// moves more than 10 % above the highest limit — otherwise an upper bound would say nothing
// about the throttle. How close below its limit a rate gets is the guest's CPU share under
// software emulation as much as the throttle's, so it is logged ("BENCH tier", measured ÷
// limit) and recorded in docs/performance.md, not asserted.
func TestInGuestTierLimits(t *testing.T) {
	sock := inGuestSocket(t)
	params := readParams(t, "PLINTH_CSI_GUEST_PARAMS")
	kube := guestKube(t)
	nodeName := os.Getenv("PLINTH_CSI_GUEST_NODE")
	conn := dialUnix(t, sock)
	ctrl, nodeSvc := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn)
	ctx := t.Context()

	w := iolimit.Detect("/sys/fs/cgroup")
	if !w.V2 {
		t.Fatal("/sys/fs/cgroup in the guest is not the unified hierarchy (cgroup v2): the harness mounts it before the node plugin starts")
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err != nil || !slices.Contains(strings.Fields(string(b)), "io") {
		t.Fatalf("the io controller is not enabled for the root cgroup's children (cgroup.subtree_control %q, %v)", b, err)
	}

	// The class's Placement declares one tier per rate, removed again at the end.
	placement := params[policyv1.ParamPlacement]
	tiers := make([]policyv1.AttributesClassTemplate, len(guestTierRates))
	var pl policyv1.Placement
	if err := kube.Get(ctx, client.ObjectKey{Name: placement}, &pl); err != nil {
		t.Fatal(err)
	}
	before := slices.Clone(pl.Spec.AttributesClasses)
	for i, r := range guestTierRates {
		tiers[i] = tierTemplate(fmt.Sprintf("%s-tier-%d", placement, i), r)
		pl.Spec.AttributesClasses = append(pl.Spec.AttributesClasses, tiers[i])
	}
	if err := kube.Update(ctx, &pl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		var pl policyv1.Placement
		if err := kube.Get(ctx, client.ObjectKey{Name: placement}, &pl); err != nil {
			t.Errorf("Placement %s: %v", placement, err)
			return
		}
		pl.Spec.AttributesClasses = before
		if err := kube.Update(ctx, &pl); err != nil {
			t.Errorf("restore the tiers of Placement %s: %v", placement, err)
		}
	})

	capability := blockCap()
	cv, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-tier-in-guest", CapacityRange: &csipb.CapacityRange{RequiredBytes: 256 << 20},
		VolumeCapabilities: []*csipb.VolumeCapability{capability}, Parameters: params, MutableParameters: policyv1.AttributesClassParameters(placement, &tiers[0])})
	if err != nil {
		t.Fatal(err)
	}
	id := cv.GetVolume().GetVolumeId()
	t.Cleanup(func() {
		if _, err := ctrl.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})
	var lv string
	if err := wait.Poll(ctx, time.Minute, 100*time.Millisecond, func() error {
		var vs storev1.VolumeState
		if err := kube.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
			return err
		}
		if lv = vs.Status.DevicePath; lv == "" {
			return fmt.Errorf("VolumeState %s: no status.devicePath (phase %s)", id, vs.Status.Phase)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var bench []string
	record := func(where string, floor float64, i int, got float64) {
		r := guestTierRates[i]
		bench = append(bench, fmt.Sprintf("%s limit %d B/s: %.0f B/s, %.3f of the limit (unthrottled %.0f B/s)", where, r, got, got/float64(r), floor))
		if d := got/float64(r) - 1; d > guestTierTolerance {
			t.Errorf("%s, limit %d B/s: measured %.0f B/s, %.1f %% above it", where, r, got, 100*d)
		}
	}
	// floorOK fails t unless the device unthrottled moves more than the highest limit + 10 %.
	floorOK := func(where string, floor float64) {
		t.Helper()
		if top := float64(guestTierRates[len(guestTierRates)-1]) * (1 + guestTierTolerance); floor <= top {
			t.Fatalf("%s moves %.0f B/s unthrottled, not above %.0f B/s: its rates cannot show the throttle's limits", where, floor, top)
		}
	}

	// The LV, as the storage node holds it (before any export).
	lvUID := fmt.Sprintf("7e570000-0000-4000-8000-%012d", time.Now().UnixNano()%1e12)
	lvPod, lvCtr := guestPodCgroup(t, w, lvUID)
	_, floorCtr := guestPodCgroup(t, w, fmt.Sprintf("7e570000-0000-4000-8002-%012d", time.Now().UnixNano()%1e12))
	dev, err := iolimit.DeviceOf(lv)
	if err != nil {
		t.Fatal(err)
	}
	lvFloor := guestWriteRate(t, floorCtr, lv, guestFloorBytes)
	floorOK("LV "+lv, lvFloor)
	for i, r := range guestTierRates {
		if _, err := w.Apply(lvUID, dev, iolimit.Limits{WriteBPS: uint64(r)}); err != nil {
			t.Fatal(err)
		}
		guestIOMax(t, lvPod, dev, r)
		record("LV "+lv, lvFloor, i, guestWriteRate(t, lvCtr, lv, guestTierSeconds*r))
	}

	// The NVMe-oF namespace, through the node plugin.
	pub, err := ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeName, VolumeCapability: capability})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ctrl.ControllerUnpublishVolume(context.Background(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeName}); err != nil {
			t.Errorf("ControllerUnpublishVolume: %v", err)
		}
	})
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if _, err := nodeSvc.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, PublishContext: pub.GetPublishContext(), StagingTargetPath: staging,
		VolumeCapability: capability, VolumeContext: cv.GetVolume().GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := nodeSvc.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Errorf("NodeUnstageVolume: %v", err)
		}
	})
	podUID := fmt.Sprintf("7e570000-0000-4000-8001-%012d", time.Now().UnixNano()%1e12)
	podDir, podCtr := guestPodCgroup(t, w, podUID)
	vc := map[string]string{node.PodUIDContext: podUID}
	for k, v := range cv.GetVolume().GetVolumeContext() {
		vc[k] = v
	}
	if _, err := nodeSvc.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, PublishContext: pub.GetPublishContext(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: capability, VolumeContext: vc}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := nodeSvc.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Errorf("NodeUnpublishVolume: %v", err)
		}
	})
	ns, err := iolimit.DeviceOf(target)
	if err != nil {
		t.Fatal(err)
	}
	if ns.Major == dev.Major && ns.Minor == dev.Minor {
		t.Fatalf("the published block volume %s is the LV itself (%s), not its NVMe-oF namespace", target, ns)
	}
	nsPath := guestNVMeNamespace(t, ns)
	nsFloor := guestWriteRate(t, floorCtr, target, guestFloorBytes)
	floorOK("NVMe-oF namespace "+nsPath, nsFloor)
	for i, r := range guestTierRates {
		gen := int64(1)
		if i > 0 {
			// returns once the node plugin reported the new generation applied
			if _, err := ctrl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: id,
				MutableParameters: policyv1.AttributesClassParameters(placement, &tiers[i])}); err != nil {
				t.Fatal(err)
			}
			gen = int64(i + 1)
		}
		if err := wait.Poll(ctx, time.Minute, 100*time.Millisecond, func() error {
			var vs storev1.VolumeState
			if err := kube.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
				return err
			}
			for _, ap := range vs.Status.AppliedAttributes {
				if ap.NodeName == nodeName && ap.Generation == gen {
					if ap.Message != "" {
						t.Fatalf("node %s cannot apply tier %s: %s", nodeName, tiers[i].Name, ap.Message)
					}
					return nil
				}
			}
			return fmt.Errorf("appliedAttributes %+v: node %s not at generation %d", vs.Status.AppliedAttributes, nodeName, gen)
		}); err != nil {
			t.Fatal(err)
		}
		// in force as soon as the node reported it
		guestIOMax(t, podDir, ns, r)
		record("NVMe-oF namespace "+nsPath, nsFloor, i, guestWriteRate(t, podCtr, target, guestTierSeconds*r))
	}
	if len(bench) != 2*len(guestTierRates) {
		t.Fatalf("%d rates measured, want %d", len(bench), 2*len(guestTierRates))
	}
	t.Logf("BENCH tier (cgroup v2 io.max), two dd writers oflag=direct bs=1 MiB, %d s at each limit:\n%s", guestTierSeconds, strings.Join(bench, "\n"))
}

// guestPodCgroup makes the cgroup kubelet would give pod uid on cgroup v2 (cgroupfs naming,
// "pod<uid>" below the root, the io controller enabled for its children) with one container
// cgroup, and returns both; both are removed at the end.
func guestPodCgroup(t *testing.T, w iolimit.Writer, uid string) (pod, ctr string) {
	t.Helper()
	pod = filepath.Join(w.Root, "pod"+uid)
	ctr = filepath.Join(pod, "writer")
	if err := os.Mkdir(pod, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range []string{ctr, pod} {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("remove cgroup %s: %v", d, err)
			}
		}
	})
	if err := os.WriteFile(filepath.Join(pod, "cgroup.subtree_control"), []byte("+io"), 0o644); err != nil {
		t.Fatalf("enable the io controller below %s: %v", pod, err)
	}
	if err := os.Mkdir(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	return pod, ctr
}

// guestIOMax fails t unless io.max of cgroup dir holds exactly the write limit rate for dev,
// and nothing else for it.
func guestIOMax(t *testing.T, dir string, dev iolimit.Device, rate int64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "io.max"))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s rbps=max wbps=%d riops=max wiops=max", dev, rate)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, dev.String()+" ") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || lines[0] != want {
		t.Fatalf("%s/io.max: %q, want the line %q", dir, b, want)
	}
}

// guestNVMeNamespace returns the /dev path of the block device dev and fails t unless it is an
// NVMe namespace (nvme<ctrl>n<ns>).
func guestNVMeNamespace(t *testing.T, dev iolimit.Device) string {
	t.Helper()
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%s", dev))
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(link)
	if !regexp.MustCompile(`^nvme\d+n\d+$`).MatchString(name) {
		t.Fatalf("block device %s is %s, not an NVMe namespace", dev, name)
	}
	return "/dev/" + name
}

// guestTimes reads the two /proc/uptime readings guestWriteRate's script prints.
var guestTimes = regexp.MustCompile(`(?m)^TIMES ([0-9.]+) ([0-9.]+)$`)

// guestWriteRate writes n bytes (a multiple of 2 MiB) to the block device dev with two
// O_DIRECT writers at once (dd, 1 MiB blocks, each its half of the first n bytes), both in
// cgroup cg, and returns the rate in bytes per second, timed in the guest by /proc/uptime
// (10 ms). Two writers keep a write queued in the throttle at all times: with one synchronous
// writer each write's device time is time the throttle's budget goes unused, and the rate
// measures the emulated CPU as much as the limit.
func guestWriteRate(t *testing.T, cg, dev string, n int64) float64 {
	t.Helper()
	half := n >> 21
	out, err := exec.CommandContext(t.Context(), "sh", "-c", `echo $$ > "$1/cgroup.procs" || exit 1
a=$(cut -d' ' -f1 /proc/uptime)
dd if=/dev/zero of="$2" bs=1048576 count="$3" oflag=direct conv=notrunc 2>/tmp/tier-dd1.err & p=$!
dd if=/dev/zero of="$2" bs=1048576 count="$3" seek="$3" oflag=direct conv=notrunc 2>/tmp/tier-dd2.err || { cat /tmp/tier-dd2.err; exit 1; }
wait $p || { cat /tmp/tier-dd1.err; exit 1; }
b=$(cut -d' ' -f1 /proc/uptime)
echo "TIMES $a $b"`, "writer", cg, dev, strconv.FormatInt(half, 10)).CombinedOutput()
	if err != nil {
		t.Fatalf("two writers to %s in %s: %v\n%s", dev, cg, err, out)
	}
	m := guestTimes.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("two writers to %s: no times in %q", dev, out)
	}
	a, _ := strconv.ParseFloat(m[1], 64)
	b, _ := strconv.ParseFloat(m[2], 64)
	if b <= a {
		t.Fatalf("two writers to %s: times %q", dev, out)
	}
	return float64(2*half<<20) / (b - a)
}
