package agent_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/agents/file"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func writeDev(t *testing.T, dev string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func devSum(t *testing.T, dev string, n int) [32]byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestHostSnapshots: the agent with the file backend on real loop devices takes a snapshot of
// a volume with data (VolumeSnapshotState ready with the source's size), restores it into a
// larger volume and clones the volume (VolumeStates with spec.contentSource): each holds the
// data of its moment (checksums). Deleting the snapshot releases its finalizer and leaves the
// restore intact; at the end no volume or snapshot file is left.
func TestHostSnapshots(t *testing.T) {
	requireLoop(t)
	e := newEnv(t)
	ctx := t.Context()
	const node, pool = "node-snap", "snap"
	state := t.TempDir()
	dir := filepath.Join(t.TempDir(), "volumes")
	r := &runner{t: t, cfg: e.cfg}
	r.start(agent.Options{NodeName: node, StateDir: state, RefreshInterval: time.Second, MetricsAddr: "0", ProbeAddr: "0",
		HostNQNFile: filepath.Join(state, "no-hostnqn"), SysRoot: t.TempDir(), NVMetRoot: filepath.Join(state, "no-nvmet")})
	t.Cleanup(func() {
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
	a := &storev1.Agent{}
	a.Name, a.Labels = node, nodeLabels(node, pool)
	a.Spec = storev1.AgentSpec{NodeName: node, Stores: []string{storeName}}
	s := &storev1.Store{}
	s.Name, s.Labels = storeName, nodeLabels(node, pool)
	s.Spec = storev1.StoreSpec{Pool: pool, NodeName: node, Backend: backendDecl, Reserve: "0", DriftPolicy: policyv1.DriftPolicyReport}
	for _, o := range []client.Object{a, s} {
		if err := e.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "Store Ready", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return err
		}
		if !apimeta.IsStatusConditionTrue(s.Status.Conditions, agent.CondReady) {
			return errors.New("not ready")
		}
		return nil
	})

	const size = 16 * mib
	src := newVolumeState("snapshot source", node, pool, storeName, size, local, backendDecl)
	if err := e.c.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	var cur *storev1.VolumeState
	eventually(t, 60*time.Second, "source Ready", func() (err error) { cur, err = readyVS(ctx, e.c, src.Name); return err })
	before := make([]byte, 2*mib)
	rand.Read(before)
	writeDev(t, cur.Status.DevicePath, before)

	snap := &storev1.VolumeSnapshotState{}
	snap.Name, snap.Labels = storev1.SnapshotID("snapshot one"), nodeLabels(node, pool)
	snap.Spec = storev1.VolumeSnapshotStateSpec{CSIName: "snapshot one", SourceVolume: src.Name, StoreName: storeName, Pool: pool, AccessibleNode: node}
	if err := e.c.Create(ctx, snap); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "snapshot ready to use", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(snap), snap); err != nil {
			return err
		}
		if !snap.Status.ReadyToUse {
			return fmt.Errorf("status %+v", snap.Status)
		}
		return nil
	})
	if snap.Status.SizeBytes != size || snap.Status.CreationTime == nil || snap.Status.Phase != storev1.SnapshotReady ||
		!containsFinalizer(snap, agent.FinalizerSnapshot) {
		t.Errorf("snapshot status %+v, finalizers %v", snap.Status, snap.Finalizers)
	}
	// The Store reports the space the snapshot holds (at least the 2 MiB written), apart from
	// provisioned (the source alone).
	eventually(t, 60*time.Second, "Store status.capacity.snapshots", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return err
		}
		if c := s.Status.Capacity; c == nil || c.Snapshots < 2*mib || c.Provisioned != size {
			return fmt.Errorf("capacity %+v", c)
		}
		return nil
	})
	after := make([]byte, 2*mib)
	rand.Read(after)
	writeDev(t, cur.Status.DevicePath, after)

	restored := newVolumeState("restored", node, pool, storeName, size+8*mib, local, backendDecl)
	restored.Spec.ContentSource = &storev1.ContentSource{Snapshot: snap.Name}
	clone := newVolumeState("clone", node, pool, storeName, size, local, backendDecl)
	clone.Spec.ContentSource = &storev1.ContentSource{Volume: src.Name}
	for _, o := range []client.Object{restored, clone} {
		if err := e.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	var rvs, cvs *storev1.VolumeState
	eventually(t, 60*time.Second, "restore Ready", func() (err error) { rvs, err = readyVS(ctx, e.c, restored.Name); return err })
	eventually(t, 60*time.Second, "clone Ready", func() (err error) { cvs, err = readyVS(ctx, e.c, clone.Name); return err })
	if rvs.Status.ActualBytes != size+8*mib || devSize(t, rvs.Status.DevicePath) != size+8*mib {
		t.Errorf("restore: %d bytes, device %d; want %d", rvs.Status.ActualBytes, devSize(t, rvs.Status.DevicePath), size+8*mib)
	}
	if devSum(t, rvs.Status.DevicePath, len(before)) != sha256.Sum256(before) {
		t.Error("the restore does not hold the data of the snapshot's moment")
	}
	if devSum(t, cvs.Status.DevicePath, len(after)) != sha256.Sum256(after) {
		t.Error("the clone does not hold the source's data")
	}

	if err := e.c.Delete(ctx, snap); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "snapshot gone", func() error { return gone(ctx, e.c, snap) })
	eventually(t, 60*time.Second, "Store status.capacity.snapshots back to 0", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return err
		}
		if c := s.Status.Capacity; c == nil || c.Snapshots != 0 {
			return fmt.Errorf("capacity %+v", c)
		}
		return nil
	})
	if devSum(t, rvs.Status.DevicePath, len(before)) != sha256.Sum256(before) {
		t.Error("the restore lost its data when the snapshot was deleted")
	}
	for _, vs := range []*storev1.VolumeState{src, restored, clone} {
		if err := e.c.Delete(ctx, vs); err != nil {
			t.Fatal(err)
		}
	}
	for _, vs := range []*storev1.VolumeState{src, restored, clone} {
		eventually(t, 60*time.Second, vs.Spec.CSIName+" gone", func() error { return gone(ctx, e.c, vs) })
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.img"))
	snaps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*"))
	if len(left)+len(snaps) > 0 {
		t.Errorf("left behind: %v %v", left, snaps)
	}
}
