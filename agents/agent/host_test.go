package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/fencing"
	"github.com/plinth-storage/plinth/agents/file"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

const (
	mib  = int64(1) << 20
	node = "node-a"
	pool = "dev"
)

var errCrash = errors.New("agent crashed on purpose (test)")

func devSize(t *testing.T, dev string) int64 {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestHostFileBackend is the host suite: the agent with the file backend on
// real loop devices against the real kube-apiserver.
func TestHostFileBackend(t *testing.T) {
	requireLoop(t)
	e := newEnv(t)
	ctx := t.Context()
	state := t.TempDir()
	dir := filepath.Join(t.TempDir(), "volumes")
	sys := t.TempDir() // a node with nvmet but without nvmet_tcp
	os.MkdirAll(filepath.Join(sys, "module", "nvmet"), 0o755)
	nqnFile := filepath.Join(state, "hostnqn")
	os.WriteFile(nqnFile, []byte(hostNQN+"\n"), 0o644)
	opts := agent.Options{
		NodeName: node, StateDir: state, RefreshInterval: time.Second,
		MetricsAddr: "0", ProbeAddr: "0", Version: "v-test",
		HostNQNFile: nqnFile, SysRoot: sys, NVMetRoot: filepath.Join(state, "no-nvmet"),
	}
	r := &runner{t: t, cfg: e.cfg}
	r.start(opts)
	t.Cleanup(func() {
		// leave no loop device or file behind, whatever failed
		r.stop()
		if fb, err := file.New(file.Config{Directory: dir}); err == nil {
			vols, _ := fb.List(context.Background())
			for _, v := range vols {
				fb.Delete(context.Background(), v.ID)
			}
		}
	})

	backendDecl := policyv1.Backend{File: &policyv1.FileBackend{Directory: dir}}
	local := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	storeName := storev1.StoreName(pool, node)

	t.Run("Agent", func(t *testing.T) {
		a := &storev1.Agent{}
		a.Name = node
		a.Labels = nodeLabels(node, pool)
		a.Spec = storev1.AgentSpec{NodeName: node, Stores: []string{storeName}, NVMeoF: &storev1.NVMeoFEndpoint{Port: 4420, BindCIDR: "127.0.0.0/8"}}
		if err := e.c.Create(ctx, a); err != nil {
			t.Fatal(err)
		}
		// another node's Agent is not this agent's business
		other := &storev1.Agent{}
		other.Name = "node-b"
		other.Spec.NodeName = "node-b"
		if err := e.c.Create(ctx, other); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "Agent status", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
				return err
			}
			rc := apimeta.FindStatusCondition(a.Status.Conditions, agent.CondReady)
			if a.Status.LastHeartbeatTime == nil || rc == nil {
				return errors.New("no status yet")
			}
			return nil
		})
		rc := apimeta.FindStatusCondition(a.Status.Conditions, agent.CondReady)
		if a.Status.Address != "127.0.0.1" || a.Status.HostNQN != hostNQN || a.Status.Version != "v-test" ||
			rc.Status != "False" || rc.Reason != agent.ReasonMissingKernelModules || !strings.Contains(rc.Message, "nvmet_tcp not loaded") {
			t.Errorf("Agent status %+v, Ready %+v", a.Status, rc)
		}
		if !strings.Contains(strings.Join(a.Status.Capabilities.Backends, ","), "file") {
			t.Errorf("backends %v lack file", a.Status.Capabilities.Backends)
		}
		first := a.Status.LastHeartbeatTime.Time
		eventually(t, 30*time.Second, "heartbeat moves", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
				return err
			}
			if !a.Status.LastHeartbeatTime.After(first) {
				return errors.New("same heartbeat")
			}
			return nil
		})
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(other), other); err != nil || other.Status.LastHeartbeatTime != nil {
			t.Errorf("agent of %s wrote node-b's status: %+v %v", node, other.Status, err)
		}
		if len(a.Status.Capabilities.NVMeAuth) != 0 {
			t.Errorf("nvmeAuth %v on a kernel without nvme_auth", a.Status.Capabilities.NVMeAuth)
		}
		// Expected: a Protocol asking for DH-HMAC-CHAP on this node (no nvme_auth in its
		// sysfs, as bookworm's 6.1) stalls the Agent with a message naming the node.
		a.Spec.NVMeoF.Auth = true
		if err := e.c.Update(ctx, a); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "Agent Stalled AuthUnsupported", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
				return err
			}
			sc := apimeta.FindStatusCondition(a.Status.Conditions, agent.CondStalled)
			if sc == nil || sc.Status != "True" || sc.Reason != agent.ReasonAuthUnsupported || !strings.Contains(sc.Message, "node "+node) {
				return fmt.Errorf("Stalled %+v", sc)
			}
			return nil
		})
		if rc := apimeta.FindStatusCondition(a.Status.Conditions, agent.CondReady); rc == nil || rc.Status != "False" || !strings.Contains(rc.Message, "NVMe target authentication") {
			t.Errorf("Ready %+v, want False naming the missing target authentication", rc)
		}
		a.Spec.NVMeoF.Auth = false
		if err := e.c.Update(ctx, a); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "Agent no longer Stalled", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
				return err
			}
			if sc := apimeta.FindStatusCondition(a.Status.Conditions, agent.CondStalled); sc != nil {
				return fmt.Errorf("Stalled %+v", sc)
			}
			return nil
		})
	})

	s := &storev1.Store{}
	t.Run("Store", func(t *testing.T) {
		s.Name = storeName
		s.Labels = nodeLabels(node, pool)
		s.Spec = storev1.StoreSpec{Pool: pool, NodeName: node, Backend: backendDecl, Reserve: "1Mi", DriftPolicy: policyv1.DriftPolicyReport}
		if err := e.c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "Store Ready with capacity", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				return err
			}
			if !apimeta.IsStatusConditionTrue(s.Status.Conditions, agent.CondReady) || s.Status.Capacity == nil {
				return errors.New("not ready")
			}
			return nil
		})
		c := s.Status.Capacity
		if c.Total <= 0 || c.Allocatable != c.Total-mib || c.Provisioned != 0 || c.Available <= 0 || c.Available > c.Allocatable || s.Status.ExtentBytes != file.UnitBytes {
			t.Errorf("capacity %+v, extent %d", c, s.Status.ExtentBytes)
		}
		if txt := s.Status.CapacityText; txt == nil || txt.Total != storev1.HumanBytes(c.Total) || txt.Available != storev1.HumanBytes(c.Available) || txt.Provisioned != "0" {
			t.Errorf("capacityText %+v for capacity %+v (kubectl's Size and Available columns)", txt, c)
		}
	})

	// A pool asking for a bcache cache on this node, whose sysfs has no bcache: the Store is
	// Stalled with reason MissingKernelModules and no command runs (no VG, no plain volume).
	t.Run("CacheWithoutBcache", func(t *testing.T) {
		cs := &storev1.Store{}
		cs.Name = storev1.StoreName("tiered", node)
		cs.Labels = nodeLabels(node, "tiered")
		cs.Spec = storev1.StoreSpec{Pool: "tiered", NodeName: node, DriftPolicy: policyv1.DriftPolicyReport,
			Backend: policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "plinth-hdd", Devices: []string{"/dev/plinth-none"},
				Cache: &policyv1.LVMCache{VolumeGroup: "plinth-ssd", Devices: []string{"/dev/plinth-none-fast"}, Mode: policyv1.CacheModeWriteback, RatioPercent: 20}}}}
		if err := e.c.Create(ctx, cs); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.c.Delete(context.Background(), cs) })
		eventually(t, 60*time.Second, "Store Stalled MissingKernelModules", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(cs), cs); err != nil {
				return err
			}
			if !apimeta.IsStatusConditionTrue(cs.Status.Conditions, agent.CondStalled) {
				return errors.New("not stalled")
			}
			return nil
		})
		rc := apimeta.FindStatusCondition(cs.Status.Conditions, agent.CondReady)
		sc := apimeta.FindStatusCondition(cs.Status.Conditions, agent.CondStalled)
		if rc == nil || rc.Status != "False" || rc.Reason != storev1.ReasonMissingKernelModules || sc.Reason != storev1.ReasonMissingKernelModules ||
			!strings.Contains(rc.Message, "bcache") || cs.Status.Capacity != nil {
			t.Errorf("Ready %+v, Stalled %+v, capacity %+v", rc, sc, cs.Status.Capacity)
		}
		t.Logf("Stalled: %s", sc.Message)
	})

	var vsName string
	t.Run("CreateExpandDelete", func(t *testing.T) {
		vs := newVolumeState("pvc-create", node, pool, storeName, 10*mib+1, local, backendDecl)
		vsName = vs.Name
		start := time.Now()
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		var got *storev1.VolumeState
		eventually(t, 60*time.Second, "VolumeState Ready", func() (err error) { got, err = readyVS(ctx, e.c, vs.Name); return err })
		t.Logf("TIMING host volumestate-create-to-ready %s", time.Since(start).Round(time.Millisecond))
		if want := backend.RoundUp(10*mib+1, file.UnitBytes); got.Status.ActualBytes != want || devSize(t, got.Status.DevicePath) != want {
			t.Errorf("actualBytes %d, device %s; want %d", got.Status.ActualBytes, got.Status.DevicePath, want)
		}
		if !strings.HasPrefix(got.Status.DevicePath, "/dev/loop") || got.Status.Export != nil {
			t.Errorf("device %q export %+v", got.Status.DevicePath, got.Status.Export)
		}
		if !containsFinalizer(got, agent.FinalizerVolume) {
			t.Errorf("finalizers %v", got.Finalizers)
		}
		eventually(t, 30*time.Second, "Store provisioned", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				return err
			}
			if s.Status.Capacity == nil || s.Status.Capacity.Provisioned != got.Status.ActualBytes {
				return errors.New("provisioned not updated")
			}
			return nil
		})

		// expand
		got.Spec.CapacityBytes = 24 * mib
		if err := e.c.Update(ctx, got); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "expanded", func() error {
			v, err := readyVS(ctx, e.c, vs.Name)
			if err == nil && v.Status.ActualBytes != 24*mib {
				return errors.New("not expanded yet")
			}
			got = v
			return err
		})
		if n := devSize(t, got.Status.DevicePath); n != 24*mib {
			t.Errorf("loop device %s is %d bytes after expand, want %d", got.Status.DevicePath, n, 24*mib)
		}

		// delete: the finalizer goes only after the file and loop device are gone
		if err := e.c.Delete(ctx, got); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "VolumeState deleted", func() error { return gone(ctx, e.c, got) })
		if _, err := os.Stat(filepath.Join(dir, vs.Name+".img")); !os.IsNotExist(err) {
			t.Errorf("volume file still there after the finalizer was released: %v", err)
		}
		marks, _ := fencing.Open(filepath.Join(state, "agent", "marks"))
		if m, found, err := marks.Load(vs.Name); err != nil || !found || !m.Released || m.UID != string(got.UID) {
			t.Errorf("mark after delete: %+v found=%v err=%v", m, found, err)
		}
	})

	t.Run("RecreatedIsNewLifecycle", func(t *testing.T) {
		vs := newVolumeState("pvc-create", node, pool, storeName, 4*mib, local, backendDecl)
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		var got *storev1.VolumeState
		eventually(t, 60*time.Second, "recreated VolumeState Ready", func() (err error) { got, err = readyVS(ctx, e.c, vsName); return err })
		marks, _ := fencing.Open(filepath.Join(state, "agent", "marks"))
		m, _, err := marks.Load(vsName)
		if err != nil || m.UID != string(got.UID) || m.Released || len(m.Retired) != 1 {
			t.Errorf("mark of the new lifecycle: %+v %v", m, err)
		}
		if got.Status.ActualBytes != 4*mib {
			t.Errorf("new lifecycle got %d bytes: the old volume was reused", got.Status.ActualBytes)
		}
		if err := e.c.Delete(ctx, got); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "deleted", func() error { return gone(ctx, e.c, got) })
	})

	// The CSI controller creates VolumeStates with the agent's finalizer already set: one the
	// agent never acted on (its Store gone, or deleted before the agent got to it) is released
	// when deleted, with nothing made on the node and no fencing mark left.
	t.Run("UntouchedVolumeReleased", func(t *testing.T) {
		vs := newVolumeState("pvc-untouched", node, pool, storev1.StoreName("no-such-pool", node), 4*mib, local, backendDecl)
		vs.Finalizers = []string{agent.FinalizerVolume}
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		if err := e.c.Delete(ctx, vs); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "untouched VolumeState deleted", func() error { return gone(ctx, e.c, vs) })
		marks, _ := fencing.Open(filepath.Join(state, "agent", "marks"))
		if m, found, err := marks.Load(vs.Name); found || err != nil {
			t.Errorf("mark of a volume never acted on: %+v found=%v err=%v", m, found, err)
		}
		if _, err := os.Stat(filepath.Join(dir, vs.Name+".img")); !os.IsNotExist(err) {
			t.Errorf("volume file of a volume never acted on: %v", err)
		}
	})

	t.Run("CrashAfterCreateIsAdopted", func(t *testing.T) {
		r.stop()
		crashOpts := opts
		crashed := make(chan string, 1)
		crashOpts.AfterVolumeCreate = func(id string) error {
			crashed <- id
			r.crash()
			return errCrash
		}
		r.start(crashOpts)
		vs := newVolumeState("pvc-crash", node, pool, storeName, 8*mib, local, backendDecl)
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		select {
		case <-crashed:
		case <-time.After(60 * time.Second):
			t.Fatal("the agent never created the volume")
		}
		r.wait()
		path := filepath.Join(dir, vs.Name+".img")
		ino := inode(t, path)
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
			t.Fatal(err)
		}
		if vs.Status.Phase == storev1.VolumeReady || vs.Status.ActualBytes != 0 {
			t.Fatalf("status written despite the crash: %+v", vs.Status)
		}
		r.start(opts)
		var got *storev1.VolumeState
		eventually(t, 60*time.Second, "adopted after restart", func() (err error) { got, err = readyVS(ctx, e.c, vs.Name); return err })
		if inode(t, path) != ino || got.Status.ActualBytes != 8*mib {
			t.Errorf("volume recreated instead of adopted (inode %d → %d), %d bytes", ino, inode(t, path), got.Status.ActualBytes)
		}
		if err := e.c.Delete(ctx, got); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "deleted", func() error { return gone(ctx, e.c, got) })
	})

	t.Run("StaleGenerationRefused", func(t *testing.T) {
		// The node already acted on generation 5 of this lifecycle (its mark
		// says so); the VolumeState the agent now reads is generation 1: stale.
		r.stop()
		vs := newVolumeState("pvc-stale", node, pool, storeName, 4*mib, local, backendDecl)
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		marks, _ := fencing.Open(filepath.Join(state, "agent", "marks"))
		if err := marks.Save(vs.Name, fencing.Mark{UID: string(vs.UID), Generation: vs.Generation + 4}); err != nil {
			t.Fatal(err)
		}
		before := counter(agent.FencingRejections, fencing.ReasonStaleGeneration)
		// The agent's first Fenced write conflicts: the test labels the VolumeState between
		// the refusal and the write. The refusal is still counted once, by the reconcile of
		// the labelled version, not once per attempt.
		// The hook runs on the agent's goroutine while this one decodes into vs: it
		// compares against a copy of the name, never vs itself.
		staleName := vs.Name
		staleOpts := opts
		var conflicts atomic.Int32
		staleOpts.BeforeFencedStatus = func(id string) {
			if id != staleName || !conflicts.CompareAndSwap(0, 1) {
				return
			}
			patch := []byte(`{"metadata":{"labels":{"plinth-test/conflict":"1"}}}`)
			if err := e.c.Patch(ctx, &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: id}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
				t.Errorf("label the VolumeState before the agent's status write: %v", err)
			}
		}
		r.start(staleOpts)
		eventually(t, 60*time.Second, "Fenced condition", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			c := apimeta.FindStatusCondition(vs.Status.Conditions, agent.CondFenced)
			if c == nil || c.Status != "True" || c.Reason != fencing.ReasonStaleGeneration {
				return errors.New("not fenced yet")
			}
			return nil
		})
		// Counted after the status write, before the event: read once the event is there.
		eventually(t, 30*time.Second, "Warning event StaleGeneration on the VolumeState", func() error {
			return warningEvent(ctx, e.c, staleName, fencing.ReasonStaleGeneration)
		})
		if after := counter(agent.FencingRejections, fencing.ReasonStaleGeneration); after != before+1 {
			t.Errorf("plinth_agent_fencing_rejections_total{reason=StaleGeneration} %v → %v, want +1 (one refusal, its first status write conflicted)", before, after)
		}
		if n := conflicts.Load(); n != 1 {
			t.Errorf("%d conflicting writes made before the Fenced status, want 1", n)
		}
		if _, err := os.Stat(filepath.Join(dir, vs.Name+".img")); !os.IsNotExist(err) {
			t.Errorf("stale work created a volume: %v", err)
		}
		if containsFinalizer(vs, agent.FinalizerVolume) {
			t.Error("stale work added the finalizer")
		}
		if err := e.c.Delete(ctx, vs); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "deleted", func() error { return gone(ctx, e.c, vs) })
	})

	t.Run("OrphanReported", func(t *testing.T) {
		fb, err := file.New(file.Config{Directory: dir})
		if err != nil {
			t.Fatal(err)
		}
		id := storev1.VolumeID("made-by-hand")
		if _, err := fb.Create(ctx, id, mib); err != nil {
			t.Fatal(err)
		}
		defer fb.Delete(context.Background(), id)
		eventually(t, 30*time.Second, "orphan in Store drift", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				return err
			}
			for _, d := range s.Status.Drift {
				if d.Kind == agent.KindLogicalVolume && d.Name == id && d.Reason == agent.DriftOrphan {
					if !apimeta.IsStatusConditionTrue(s.Status.Conditions, agent.CondDrifted) {
						return errors.New("Drifted not True")
					}
					return nil
				}
			}
			return errors.New("no orphan item")
		})
		if _, err := fb.Get(ctx, id); err != nil {
			t.Errorf("orphan deleted by the agent: %v", err)
		}
	})

	t.Run("VolumeWorkers", func(t *testing.T) { testVolumeWorkers(t, e) })
	t.Run("ProgressMark", func(t *testing.T) { testProgressMark(t, e) })
	t.Run("WritesPerVolume", func(t *testing.T) { testWritesPerVolume(t, e) })
}

func containsFinalizer(o client.Object, f string) bool {
	for _, x := range o.GetFinalizers() {
		if x == f {
			return true
		}
	}
	return false
}
