package agent_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/plinth-storage/plinth/agents/agent"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// queueAdds is controller-runtime's workqueue_adds_total of the volumestate controller: how
// many times a VolumeState name was put on its queue, summed over this process's agents.
func queueAdds(t *testing.T) float64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "workqueue_adds_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelIs(m, "name", "volumestate") {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func labelIs(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// testVolumeWorkers (TestHostFileBackend/VolumeWorkers, on that test's control plane): the agent acts on several volumes at once, and never on one volume
// from two workers at once. Two new volumes are held inside their reconcile (right after the
// backend created them) until both are there — with one worker the second never arrives and
// the test fails. While the first is held, its spec changes (a new generation, queued again);
// the change is applied only after the held reconcile ends: no reconcile of a volume starts
// while another of the same volume runs (the queue hands a name to one worker at a time, and
// the volume's fencing lock is held throughout).
func testVolumeWorkers(t *testing.T, e *env) {
	ctx := context.Background()
	const nodeName = "node-workers"
	s, decl, state := fileStore(t, e, nodeName)

	var mu sync.Mutex
	inside := map[string]int{} // reconciles of each volume between create and return of the hook
	overlaps := []string{}
	entered := make(chan string, 16)
	release := make(chan struct{})
	held := map[string]bool{}
	hook := func(id string) error {
		mu.Lock()
		inside[id]++
		if inside[id] > 1 {
			overlaps = append(overlaps, id)
		}
		first := !held[id]
		held[id] = true
		mu.Unlock()
		defer func() {
			mu.Lock()
			inside[id]--
			mu.Unlock()
		}()
		if first {
			entered <- id
			select {
			case <-release:
			case <-time.After(2 * time.Minute):
				return errors.New("not released")
			}
		}
		return nil
	}
	r := &runner{t: t, cfg: e.cfg}
	r.start(agent.Options{
		NodeName: nodeName, StateDir: state, RefreshInterval: time.Hour, MetricsAddr: "0", ProbeAddr: "0",
		HostNQNFile: filepath.Join(state, "hostnqn"), NVMetRoot: filepath.Join(state, "nvmet"),
		VolumeWorkers: 4, AfterVolumeCreate: hook,
	})
	defer r.stop()
	local := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	a := newVolumeState("workers-a", nodeName, pool, s.Name, mib, local, decl)
	b := newVolumeState("workers-b", nodeName, pool, s.Name, mib, local, decl)
	for _, vs := range []*storev1.VolumeState{a, b} {
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = e.c.Delete(ctx, vs)
			eventually(t, 60*time.Second, "volume deleted", func() error { return gone(ctx, e.c, vs) })
		}()
	}
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-entered:
			got[id] = true
		case <-time.After(2 * time.Minute):
			close(release)
			t.Fatalf("volumes held at once: %v; want both %s and %s (one worker?)", got, a.Name, b.Name)
		}
	}

	// a new generation of a while its first reconcile is held: queued, not started
	adds := queueAdds(t)
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
		t.Fatal(err)
	}
	a.Spec.CapacityBytes = 2 * mib
	if err := e.c.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the new generation queued", func() error {
		if n := queueAdds(t); n <= adds {
			return fmt.Errorf("workqueue_adds_total %v, was %v", n, adds)
		}
		return nil
	})
	mu.Lock()
	during := inside[a.Name]
	mu.Unlock()
	close(release)

	eventually(t, 60*time.Second, "a Ready at its new size", func() error {
		vs, err := readyVS(ctx, e.c, a.Name)
		if err != nil {
			return err
		}
		if vs.Status.ActualBytes < 2*mib {
			return fmt.Errorf("%d bytes", vs.Status.ActualBytes)
		}
		return nil
	})
	if _, err := readyVS(ctx, e.c, b.Name); err != nil {
		eventually(t, 60*time.Second, "b Ready", func() error { _, err := readyVS(ctx, e.c, b.Name); return err })
	}
	mu.Lock()
	defer mu.Unlock()
	if during != 1 || len(overlaps) > 0 {
		t.Errorf("volume reconciled by two workers at once: %d inside while held, overlaps %v", during, overlaps)
	}
}
