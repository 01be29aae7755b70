package moveexec

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/plinth-storage/plinth/controllers/move"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/crdtest"
)

const gi = int64(1) << 30

// Admit starts planned moves in plan order while both Stores have a free slot (moves in
// flight count), holds a move between nodes and one without a slot, and never starts a
// blocked move or a volume already moving.
func TestAdmit(t *testing.T) {
	mv := func(vol, src, srcNode, dst, dstNode string) move.Move {
		return move.Move{Volume: vol, Source: src, SourceNode: srcNode, Target: dst, TargetNode: dstNode, Disruption: move.DisruptionNone}
	}
	blocked := move.Move{Volume: "v-snap", Source: "slow.a", SourceNode: "a", Disruption: move.DisruptionBlocked, Blocked: move.BlockedSnapshots}
	plan := &move.Result{Moves: []move.Move{
		mv("v1", "slow.a", "a", "fast.a", "a"),
		mv("v2", "slow.a", "a", "fast.a", "a"),
		mv("v3", "slow.a", "a", "fast.a", "a"),
		mv("v4", "slow.a", "a", "slow.b", "b"),
		mv("v5", "slow.c", "c", "fast.c", "c"),
		blocked,
	}}
	limits := map[string]int{"slow.a": 2, "fast.a": 2, "fast.c": 0}
	limit := func(s string) int { return limits[s] }
	for _, tc := range []struct {
		name      string
		inFlight  map[string]bool
		busy      map[string]int
		start     string
		held      map[string]string
		nBlocked  int
		inflightV []string
	}{
		{"nothing in flight: two per Store, a limit below 1 counts as 1", nil, nil, "v1 v2 v5",
			map[string]string{"v3": HeldNoSlot, "v4": HeldCrossNode}, 1, nil},
		{"one in flight takes a slot of both its Stores", map[string]bool{"v1": true}, map[string]int{"slow.a": 1, "fast.a": 1}, "v2 v5",
			map[string]string{"v3": HeldNoSlot, "v4": HeldCrossNode}, 1, nil},
		{"a busy target holds the move", nil, map[string]int{"fast.c": 1, "fast.a": 2}, "",
			map[string]string{"v1": HeldNoSlot, "v2": HeldNoSlot, "v3": HeldNoSlot, "v4": HeldCrossNode, "v5": HeldNoSlot}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := Admit(plan, tc.inFlight, tc.busy, limit)
			var got []string
			for _, m := range a.Start {
				got = append(got, m.Volume)
			}
			if strings.Join(got, " ") != tc.start {
				t.Errorf("started %v, want %s", got, tc.start)
			}
			if fmt.Sprint(a.Held) != fmt.Sprint(tc.held) || len(a.Blocked) != tc.nBlocked {
				t.Errorf("held %v, blocked %d; want %v and %d", a.Held, len(a.Blocked), tc.held, tc.nBlocked)
			}
		})
	}
}

// The Starter against the real API server: a Placement that follows its pool change to
// another pool on the same node has its volumes moved one at a time (maxParallelMovesPerStore
// 1), the next one started when the first ends; an evacuated Store's volume whose only target
// is on another node is held and one with a snapshot blocked, both named on the pool's
// Evacuating condition with the count of the moved. The agent's part (copy, Done) is written
// here as the agent writes it; TestHostMovePlanned (agents/agent) runs the real agent.
func TestStarterAgainstAPIServer(t *testing.T) {
	cp := crdtest.ControlPlane(t, controlplane.Options{})
	ctx := t.Context()
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	file := func(dir string) policyv1.Backend {
		return policyv1.Backend{File: &policyv1.FileBackend{Directory: dir}}
	}
	var objs []client.Object
	for _, s := range []struct{ pool, node string }{{"slow", "a"}, {"fast", "a"}, {"slow", "b"}} {
		st := &storev1.Store{}
		st.Name = storev1.StoreName(s.pool, s.node)
		st.Spec = storev1.StoreSpec{Pool: s.pool, NodeName: s.node, Backend: file("/var/lib/" + s.pool), DriftPolicy: policyv1.DriftPolicyReport}
		objs = append(objs, st)
	}
	for _, name := range []string{"slow", "fast"} {
		p := &policyv1.StoragePool{}
		p.Name, p.Spec.Backend = name, file("/var/lib/"+name)
		objs = append(objs, p)
	}
	for _, name := range []string{"apps", "pinned"} {
		pl := &policyv1.Placement{}
		pl.Name = name
		pl.Spec = policyv1.PlacementSpec{PoolRef: policyv1.LocalObjectReference{Name: "slow"}, ProtocolRef: policyv1.LocalObjectReference{Name: "local"},
			StorageClass: policyv1.StorageClassTemplate{Name: "plinth-" + name}, ExistingVolumes: policyv1.ExistingVolumesStay}
		if name == "apps" {
			pl.Spec.ExistingVolumes = policyv1.ExistingVolumesMove
		}
		objs = append(objs, pl)
	}
	vol := func(name, placement string) *storev1.VolumeState {
		vs := &storev1.VolumeState{}
		vs.Name = name
		vs.Spec = storev1.VolumeStateSpec{CSIName: name, StoreName: "slow.a", CapacityBytes: gi, VolumeMode: "Filesystem",
			Policy: storev1.FrozenPolicy{Placement: placement, Pool: "slow", Protocol: "local", Backend: file("/var/lib/slow"),
				ProtocolSpec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}}
		return vs
	}
	snap := &storev1.VolumeSnapshotState{}
	snap.Name, snap.Spec = "snap-1", storev1.VolumeSnapshotStateSpec{CSIName: "snap-1", SourceVolume: "v-snap"}
	objs = append(objs, vol("v-apps-1", "apps"), vol("v-apps-2", "apps"), vol("v-pinned", "pinned"), vol("v-snap", "pinned"), snap)
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	// every Store reports room; no Agent reports: capabilities are not judged
	for _, n := range []string{"slow.a", "fast.a", "slow.b"} {
		st := &storev1.Store{}
		if err := c.Get(ctx, client.ObjectKey{Name: n}, st); err != nil {
			t.Fatal(err)
		}
		st.Status.Capacity = &storev1.Capacity{Total: 100 * gi, Allocatable: 100 * gi, Available: 50 * gi}
		if err := c.Status().Update(ctx, st); err != nil {
			t.Fatal(err)
		}
	}

	mgr, err := ctrl.NewManager(cp.Admin.Config, ctrl.Options{Scheme: Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&Starter{Client: mgr.GetClient(), Events: mgr.GetEventRecorder("test"), SkipNameValidation: true}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() { cancel(); <-done })

	update := func(obj client.Object, f func()) {
		t.Helper()
		controlplane.Eventually(t, 30*time.Second, 50*time.Millisecond, "update "+obj.GetName(), func() error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return err
			}
			f()
			return c.Update(ctx, obj)
		})
	}
	moving := func() map[string]*storev1.VolumeMove {
		t.Helper()
		var l storev1.VolumeStateList
		if err := c.List(ctx, &l); err != nil {
			t.Fatal(err)
		}
		out := map[string]*storev1.VolumeMove{}
		for _, v := range l.Items {
			if v.Spec.Move != nil {
				out[v.Name] = v.Spec.Move
			}
		}
		return out
	}
	// the change: apps follows to pool fast, pool slow evacuates node a
	apps, slowA := &policyv1.Placement{}, &storev1.Store{}
	apps.Name, slowA.Name = "apps", "slow.a"
	update(apps, func() { apps.Spec.PoolRef.Name = "fast" })
	update(slowA, func() { slowA.Spec.Evacuate = true })

	var first string
	controlplane.Eventually(t, 30*time.Second, 50*time.Millisecond, "one move started", func() error {
		m := moving()
		if len(m) != 1 {
			return fmt.Errorf("moves %v", m)
		}
		for v, mv := range m {
			if !strings.HasPrefix(v, "v-apps-") || mv.SourceStore != "slow.a" || mv.TargetStore != "fast.a" || !strings.HasPrefix(mv.ID, "move-") {
				return fmt.Errorf("move of %s: %+v", v, mv)
			}
			first = v
		}
		return nil
	})
	slow := &policyv1.StoragePool{}
	slow.Name = "slow"
	condition := func(reason string, parts ...string) {
		t.Helper()
		controlplane.Eventually(t, 30*time.Second, 50*time.Millisecond, "Evacuating "+reason, func() error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(slow), slow); err != nil {
				return err
			}
			cond := meta.FindStatusCondition(slow.Status.Conditions, EvacuatingCondition)
			if cond == nil || cond.Reason != reason {
				return fmt.Errorf("Evacuating %+v", cond)
			}
			for _, p := range parts {
				if !strings.Contains(cond.Message, p) {
					return fmt.Errorf("Evacuating message lacks %q: %s", p, cond.Message)
				}
			}
			return nil
		})
	}
	condition(ReasonMovesInProgress, "0 of 4 volumes moved, 1 in flight (at most 1 per Store), 1 waiting for a free slot",
		"1 not carried out, their target is on another node", "v-pinned → slow.b on node b", "1 blocked: v-snap (Snapshots")
	for state, want := range map[string]float64{StateInFlight: 1, StateWaiting: 1, StateCrossNode: 1, StateBlocked: 1} {
		m := &dto.Metric{}
		if err := MovesPlanned.WithLabelValues(state).Write(m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetGauge().GetValue(); got != want {
			t.Errorf("plinth_volume_moves_planned{state=%q} = %v, want %v", state, got, want)
		}
	}
	// still one: the slot of slow.a and fast.a is taken
	if m := moving(); len(m) != 1 {
		t.Fatalf("moves %v: more than maxParallelMovesPerStore", m)
	}

	// the agent and the switch finish the first move
	vs := &storev1.VolumeState{}
	vs.Name = first
	update(vs, func() { vs.Spec.StoreName = "fast.a" })
	id := vs.Spec.Move.ID
	now := metav1.Now()
	vs.Status.Move = &storev1.MoveStatus{ID: id, Phase: storev1.MoveDone, SourceStore: "slow.a", TargetStore: "fast.a", BytesTotal: gi, BytesCopied: gi, StartedAt: &now}
	if err := c.Status().Update(ctx, vs); err != nil {
		t.Fatal(err)
	}
	update(vs, func() { vs.Spec.Move = nil })

	controlplane.Eventually(t, 30*time.Second, 50*time.Millisecond, "the second move started", func() error {
		m := moving()
		if len(m) != 1 || m[first] != nil {
			return fmt.Errorf("moves %v", m)
		}
		return nil
	})
	condition(ReasonMovesInProgress, "1 of 4 volumes moved, 1 in flight", "0 waiting for a free slot")

	// each started move is an event on its VolumeState
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, 30*time.Second, 100*time.Millisecond, "two MoveStarted events", func() error {
		evs, err := cs.EventsV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var on []string
		for _, ev := range evs.Items {
			if ev.Reason == ReasonMoveStarted && ev.Regarding.Kind == "VolumeState" && strings.Contains(ev.Note, "slow.a → fast.a") {
				on = append(on, ev.Regarding.Name)
			}
		}
		if len(on) != 2 || !slices.Contains(on, first) {
			return fmt.Errorf("MoveStarted on %v", on)
		}
		return nil
	})
}
