package agent_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// testProgressMark (TestHostFileBackend/ProgressMark): the phases Creating and Deleting are
// written only for work that outlasts Options.ProgressAfter. A fast create goes from no phase
// straight to Ready, and a fast delete from Ready to gone, with no progress write between; a
// create held (in AfterVolumeCreate) past ProgressAfter shows Creating while it is held, then
// Ready.
func testProgressMark(t *testing.T, e *env) {
	ctx := context.Background()
	const nodeName = "node-progress"
	s, decl, state := fileStore(t, e, nodeName)
	local := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	fast := newVolumeState("progress-fast", nodeName, pool, s.Name, mib, local, decl)
	slow := newVolumeState("progress-slow", nodeName, pool, s.Name, mib, local, decl)

	release := make(chan struct{})
	// The hook runs in the agent's workers while this goroutine's Create decodes the API
	// server's answer into slow: it reads a copy of the name, never the object.
	slowName := slow.Name
	hook := func(id string) error {
		if id != slowName {
			return nil
		}
		select {
		case <-release:
			return nil
		case <-time.After(2 * time.Minute):
			return errors.New("not released")
		}
	}
	wc, err := client.NewWithWatch(e.cfg, client.Options{Scheme: agent.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &storev1.VolumeStateList{}, client.MatchingFields{"metadata.name": fast.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	r := &runner{t: t, cfg: e.cfg}
	r.start(agent.Options{
		NodeName: nodeName, StateDir: state, RefreshInterval: time.Hour, MetricsAddr: "0", ProbeAddr: "0",
		HostNQNFile: filepath.Join(state, "hostnqn"), NVMetRoot: filepath.Join(state, "nvmet"),
		// far above a file create on a loop device (milliseconds), far below the hold
		ProgressAfter: 5 * time.Second, AfterVolumeCreate: hook,
	})
	defer r.stop()

	// fast: every phase the API server ever held, from the create to the object's end
	for _, vs := range []*storev1.VolumeState{fast, slow} {
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
	}
	var phases []storev1.VolumePhase
	timeout := time.After(2 * time.Minute)
	deleted := false
	for !deleted {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch ended; phases so far %q", phases)
			}
			vs, isVS := ev.Object.(*storev1.VolumeState)
			if !isVS {
				continue
			}
			if len(phases) == 0 || phases[len(phases)-1] != vs.Status.Phase {
				phases = append(phases, vs.Status.Phase)
			}
			if ev.Type == watch.Deleted {
				deleted = true
				break
			}
			if vs.Status.Phase == storev1.VolumeReady && vs.DeletionTimestamp.IsZero() {
				if err := e.c.Delete(ctx, vs); err != nil {
					t.Fatal(err)
				}
			}
		case <-timeout:
			t.Fatalf("%s not created and deleted within 2 minutes; phases %q", fast.Name, phases)
		}
	}
	if want := []storev1.VolumePhase{"", storev1.VolumeReady}; !equalPhases(phases, want) {
		t.Errorf("phases of the fast volume %q, want %q (no Creating, no Deleting)", phases, want)
	}

	// slow: Creating while held past ProgressAfter, Ready after
	eventually(t, 60*time.Second, "slow volume Creating", func() error {
		var vs storev1.VolumeState
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(slow), &vs); err != nil {
			return err
		}
		if vs.Status.Phase != storev1.VolumeCreating || vs.Status.ActualBytes != 0 {
			return errors.New("phase " + string(vs.Status.Phase))
		}
		return nil
	})
	close(release)
	eventually(t, 60*time.Second, "slow volume Ready", func() error { _, err := readyVS(ctx, e.c, slow.Name); return err })
	if err := e.c.Delete(ctx, slow); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "slow volume deleted", func() error { return gone(ctx, e.c, slow) })
}

func equalPhases(a, b []storev1.VolumePhase) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
