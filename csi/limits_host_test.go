package csi_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/stage"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// A tier's write limit holds on the host's kernel, and a modification changes it live: the
// node plugin writes blkio.throttle (cgroup v1) into a pod cgroup on the real cgroupfs, for a
// loop device staged on the node, and a writer in that cgroup (dd oflag=direct, a fixed size)
// is throttled to the tier; ControllerModifyVolume to another tier returns once the node
// plugin reported it, and the same writer, not restarted, is held to the new one. Each rate
// must stay within its limit (+10 %); measured ÷ limit and the ratio of the two are logged.
func TestTierLimitsOnTheHostKernel(t *testing.T) {
	dev, _ := loopDevice(t, 256<<20)
	blkio := "/sys/fs/cgroup/blkio"
	if _, err := os.Stat(filepath.Join(blkio, "blkio.throttle.write_bps_device")); err != nil {
		t.Fatalf("cgroup v1 blkio hierarchy at %s: %v", blkio, err)
	}
	e := controllerEnv(t, "tier", map[string]int64{"tier-node": 10 * gib})
	ctx := t.Context()
	const aRate, bRate = 4 << 20, 1 << 20
	n := func(v int64) *int64 { return &v }
	a := policyv1.AttributesClassTemplate{Name: "tier-a", Limits: policyv1.IOLimits{WriteBytesPerSecond: n(aRate)}}
	b := policyv1.AttributesClassTemplate{Name: "tier-b", Limits: policyv1.IOLimits{WriteBytesPerSecond: n(bRate)}}
	var pl policyv1.Placement
	if err := e.c.Get(ctx, client.ObjectKey{Name: "tier-local"}, &pl); err != nil {
		t.Fatal(err)
	}
	pl.Spec.AttributesClasses = []policyv1.AttributesClassTemplate{a, b}
	if err := e.c.Update(ctx, &pl); err != nil {
		t.Fatal(err)
	}
	resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "tier-vol", CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local, MutableParameters: policyv1.AttributesClassParameters("tier-local", &a)})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()

	// The pod, standing in for kubelet's: its cgroup (cgroupfs driver naming) with one
	// container cgroup, and the stage record NodeStage and NodePublish leave for it.
	uid := fmt.Sprintf("5a1e0000-0000-4000-8000-%012d", time.Now().UnixNano()%1e12)
	root := filepath.Join(blkio, "plinth-tier-test-"+strconv.Itoa(os.Getpid()))
	ctr := filepath.Join(root, "kubepods", "besteffort", "pod"+uid, "writer")
	if err := os.MkdirAll(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range []string{ctr, filepath.Dir(ctr), filepath.Dir(filepath.Dir(ctr)), filepath.Join(root, "kubepods"), root} {
			os.Remove(d) //nolint:errcheck // cgroup directories are removed with rmdir, emptied first
		}
	})
	state := t.TempDir()
	target := "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/pv-tier/mount"
	if err := (stage.Dir{Path: state}).Save(stage.Record{VolumeID: id, StagingPath: t.TempDir(), Kind: stage.KindLocal, Device: dev,
		Targets: []string{target}, PodUIDs: map[string]string{target: uid}}); err != nil {
		t.Fatal(err)
	}
	cp := sharedControlPlane(t)
	// the Node of the store exists already (setup stands in for kubelet)
	startDriver(t, csi.Options{Mode: csi.ModeNode, Config: cp.Admin.Config, NodeName: "tier-node", StateDir: state,
		HostNQNFile: filepath.Join(state, "no-hostnqn"), LimitsInterval: 200 * time.Millisecond})

	applied := func(gen int64) {
		t.Helper()
		if err := wait.Poll(ctx, time.Minute, 100*time.Millisecond, func() error {
			vs := &storev1.VolumeState{}
			if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil {
				return err
			}
			for _, ap := range vs.Status.AppliedAttributes {
				if ap.NodeName == "tier-node" && ap.Generation == gen && ap.Message == "" {
					return nil
				}
			}
			return fmt.Errorf("appliedAttributes %+v, want tier-node at generation %d", vs.Status.AppliedAttributes, gen)
		}); err != nil {
			t.Fatal(err)
		}
	}
	applied(1)
	maj, min := deviceNumbers(t, dev)
	throttle := func(want int) {
		t.Helper()
		for _, d := range []string{filepath.Dir(ctr), ctr} {
			b, err := os.ReadFile(filepath.Join(d, "blkio.throttle.write_bps_device"))
			if err != nil {
				t.Fatal(err)
			}
			if w := fmt.Sprintf("%d:%d %d\n", maj, min, want); string(b) != w {
				t.Errorf("%s write_bps_device %q, want %q", d, b, w)
			}
		}
	}
	throttle(aRate)

	// One writer process for both tiers: it writes, waits for its input, writes again.
	cmd := exec.CommandContext(ctx, "sh", "-c", `echo $$ > "$1/cgroup.procs" && dd if=/dev/zero of="$2" bs=1M count=12 oflag=direct && read x && dd if=/dev/zero of="$2" bs=1M count=3 oflag=direct`,
		"writer", ctr, dev)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &lockedBuffer{}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rate := func(nth int) float64 {
		t.Helper()
		var got float64
		if err := wait.Poll(ctx, 2*time.Minute, 100*time.Millisecond, func() error {
			m := ddRate.FindAllStringSubmatch(out.String(), -1)
			if len(m) < nth {
				return fmt.Errorf("dd reports %d writes, want %d: %s", len(m), nth, out.String())
			}
			bytes, _ := strconv.ParseFloat(m[nth-1][1], 64)
			secs, _ := strconv.ParseFloat(m[nth-1][2], 64)
			got = bytes / secs
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	ra := rate(1)
	if _, err := e.ctrl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: id,
		MutableParameters: policyv1.AttributesClassParameters("tier-local", &b)}); err != nil {
		t.Fatal(err)
	}
	applied(2)
	throttle(bRate)
	fmt.Fprintln(stdin) // the same process writes again, under tier B
	rb := rate(2)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("writer: %v: %s", err, out.String())
	}
	ratio, want := ra/rb, float64(aRate)/float64(bRate)
	t.Logf("tier A %.0f B/s (%.2f of its limit), tier B %.0f B/s (%.2f of its limit); ratio %.2f, limits' ratio %.2f",
		ra, ra/aRate, rb, rb/bRate, ratio, want)
	// Throttling bounds each rate from above whatever the host's load; a loaded host (this
	// suite shares its cores) only lowers it, so the ratio is reported, not asserted: on an
	// idle host it was 0.97 and 0.99 of the limits.
	if ra > aRate*1.1 || rb > bRate*1.1 {
		t.Errorf("a rate above its limit: A %.0f > %d or B %.0f > %d B/s (+10%%)", ra, aRate, rb, bRate)
	}
}

// ddRate reads dd's summary: "N bytes (...) copied, S s, ...".
var ddRate = regexp.MustCompile(`(\d+) bytes .*copied, ([0-9.]+) s`)

// lockedBuffer collects a child's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// deviceNumbers is dev's major and minor.
func deviceNumbers(t *testing.T, dev string) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	return unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))
}
