package agent_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/agents/file"
	"github.com/plinth-storage/plinth/controllers/diff"
	"github.com/plinth-storage/plinth/controllers/move"
	"github.com/plinth-storage/plinth/controllers/moveexec"
	policyctl "github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestHostMovePlanned carries out a policy change end to end on one node with two Stores
// (two file-backend folders: real loop devices; the agent a real process; the move executor
// as plinth csi --mode=controller runs it, moveexec.NewManager; the real API server). The
// change, as the policy controller applies it: Placement "apps" (existingVolumes: Move) moves
// from pool slow to pool fast, and pool slow evacuates the node (its Store spec.evacuate).
// Nothing sets spec.move by hand: the executor starts the planned moves, never more than
// maxParallelMovesPerStore (2) per Store at once — the maximum observed over a watch of every
// VolumeState write is asserted —, the agent crashes once at move.copied in the middle of the
// plan, and every volume of "apps" ends on the fast Store with the bytes written on the slow
// one. The volume of Placement "pinned" (Stay) has no Store to go to in pool slow: it stays,
// and the pool's Evacuating condition says so, with the count of the moved.
func TestHostMovePlanned(t *testing.T) {
	requireLoop(t)
	e := newEnv(t)
	ctx := t.Context()
	pc, err := client.NewWithWatch(e.cfg, client.Options{Scheme: moveexec.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	dirA := filepath.Join(t.TempDir(), "slow")
	dirB := filepath.Join(t.TempDir(), "fast")
	spec := hostProcessSpec(t, e, state)
	t.Cleanup(func() {
		for _, d := range []string{dirA, dirB} {
			if fb, err := file.New(file.Config{Directory: d}); err == nil {
				vols, _ := fb.List(context.Background())
				for _, v := range vols {
					fb.Delete(context.Background(), v.ID)
				}
			}
		}
	})
	const n, perStore = 5, 2
	local := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	declA := policyv1.Backend{File: &policyv1.FileBackend{Directory: dirA}}
	declB := policyv1.Backend{File: &policyv1.FileBackend{Directory: dirB}}
	src, dst := storev1.StoreName("slow", node), storev1.StoreName("fast", node)
	a := &storev1.Agent{}
	a.Name, a.Labels = node, nodeLabels(node, "slow")
	a.Spec = storev1.AgentSpec{NodeName: node, Stores: []string{src, dst}}
	objs := []client.Object{a}
	for _, s := range []struct {
		name, pool string
		decl       policyv1.Backend
	}{{src, "slow", declA}, {dst, "fast", declB}} {
		st := &storev1.Store{}
		st.Name, st.Labels = s.name, nodeLabels(node, s.pool)
		st.Spec = storev1.StoreSpec{Pool: s.pool, NodeName: node, Backend: s.decl, Reserve: "1Mi", DriftPolicy: policyv1.DriftPolicyReport}
		objs = append(objs, st)
		p := &policyv1.StoragePool{}
		p.Name = s.pool
		p.Spec = policyv1.StoragePoolSpec{Backend: s.decl, MaxParallelMovesPerStore: perStore}
		objs = append(objs, p)
	}
	for _, name := range []string{"apps", "pinned"} {
		pl := &policyv1.Placement{}
		pl.Name = name
		pl.Spec = policyv1.PlacementSpec{PoolRef: policyv1.LocalObjectReference{Name: "slow"}, ProtocolRef: policyv1.LocalObjectReference{Name: "proto"},
			StorageClass: policyv1.StorageClassTemplate{Name: "plinth-" + name}, ExistingVolumes: policyv1.ExistingVolumesStay}
		if name == "apps" {
			pl.Spec.ExistingVolumes = policyv1.ExistingVolumesMove
		}
		objs = append(objs, pl)
	}
	for _, o := range objs {
		if err := pc.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}

	// the volumes, Ready on the slow Store and filled with random bytes
	p := startProcess(t, spec, "")
	var vols []*storev1.VolumeState
	sums := map[string]string{}
	for i := range n + 1 {
		vs := newVolumeState(fmt.Sprintf("pvc-planned-%d", i), node, "slow", src, 8*mib, local, declA)
		vs.Spec.Policy.Placement = "apps"
		if i == n {
			vs.Spec.Policy.Placement = "pinned"
		}
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		vols = append(vols, vs)
	}
	for _, vs := range vols {
		eventually(t, 60*time.Second, vs.Name+" Ready on the source", func() error {
			got, err := readyVS(ctx, e.c, vs.Name)
			if err == nil {
				*vs = *got
			}
			return err
		})
		f, err := os.OpenFile(vs.Status.DevicePath, os.O_WRONLY|os.O_SYNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(f, rand.Reader, vs.Status.ActualBytes); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		sums[vs.Name] = deviceSum(t, vs.Status.DevicePath, vs.Status.ActualBytes)
	}
	p.stop()

	// plinth diff of the change, before it is applied: the plan the executor must carry out
	predicted := diffPlan(t, e.cfg, pc, dirA, dirB, perStore)

	// moves in flight per Store, over every VolumeState write the API server sends
	w, err := pc.Watch(ctx, &storev1.VolumeStateList{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	moving := map[string]*storev1.VolumeMove{}
	maxSeen := map[string]int{}
	started := map[string]int{}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			vs, ok := ev.Object.(*storev1.VolumeState)
			if !ok {
				continue
			}
			mu.Lock()
			m := vs.Spec.Move
			if ev.Type == watch.Deleted {
				m = nil
			}
			if m != nil && (moving[vs.Name] == nil || moving[vs.Name].ID != m.ID) {
				started[vs.Name]++
			}
			moving[vs.Name] = m
			per := map[string]int{}
			for _, mv := range moving {
				if mv != nil {
					per[mv.SourceStore]++
					per[mv.TargetStore]++
				}
			}
			for s, c := range per {
				maxSeen[s] = max(maxSeen[s], c)
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); <-watched })

	opts := agent.Options{NodeName: node, StateDir: state}
	if err := os.RemoveAll(opts.FailpointsDir()); err != nil {
		t.Fatal(err)
	}
	armed := failpoint.MoveCopied + "=once"
	p = startProcess(t, spec, armed)
	succeeded0 := counter(moveexec.Moves, moveexec.ResultSucceeded)
	mgr, err := moveexec.NewManager(moveexec.ManagerOptions{Config: e.cfg, SkipNameValidation: true, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(context.Background())
	mdone := make(chan error, 1)
	go func() { mdone <- mgr.Start(mctx) }()
	t.Cleanup(func() { cancel(); <-mdone })

	// the Git change, as the policy controller applies it
	update := func(obj client.Object, f func()) {
		t.Helper()
		eventually(t, 30*time.Second, "update "+obj.GetName(), func() error {
			if err := pc.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return err
			}
			f()
			return pc.Update(ctx, obj)
		})
	}
	apps, slow, srcStore := &policyv1.Placement{}, &policyv1.StoragePool{}, &storev1.Store{}
	apps.Name, slow.Name, srcStore.Name = "apps", "slow", src
	update(apps, func() { apps.Spec.PoolRef.Name = "fast" })
	update(slow, func() { slow.Spec.EvacuateNodes = []string{node} })
	update(srcStore, func() { srcStore.Spec.Evacuate = true })

	if code := p.waitExit(90 * time.Second); code != failpoint.ExitCode {
		t.Fatalf("agent exited with code %d, want %d (crash point %s)", code, failpoint.ExitCode, failpoint.MoveCopied)
	}
	p = startProcess(t, spec, armed)
	for _, vs := range vols[:n] {
		eventually(t, 3*time.Minute, vs.Name+" moved: Done, spec.move cleared, Ready on "+dst, func() error {
			got, err := readyVS(ctx, e.c, vs.Name)
			if err != nil {
				return err
			}
			*vs = *got
			if st := vs.Status.Move; vs.Spec.Move != nil || st == nil || st.Phase != storev1.MoveDone || vs.Spec.StoreName != dst {
				return fmt.Errorf("storeName %s, spec.move %+v, status.move %+v", vs.Spec.StoreName, vs.Spec.Move, vs.Status.Move)
			}
			return nil
		})
		if got := deviceSum(t, vs.Status.DevicePath, vs.Status.ActualBytes); got != sums[vs.Name] || vs.Status.Move.Checksum != sums[vs.Name] {
			t.Errorf("%s: target holds %s, status.move.checksum %s; the source held %s", vs.Name, got, vs.Status.Move.Checksum, sums[vs.Name])
		}
		if _, err := os.Stat(filepath.Join(dirA, vs.Name+".img")); !os.IsNotExist(err) {
			t.Errorf("%s: the source's copy is still there: %v", vs.Name, err)
		}
	}
	var pinned storev1.VolumeState
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(vols[n]), &pinned); err != nil {
		t.Fatal(err)
	}
	if pinned.Spec.StoreName != src || pinned.Spec.Move != nil || deviceSum(t, pinned.Status.DevicePath, pinned.Status.ActualBytes) != sums[pinned.Name] {
		t.Errorf("the pinned volume: storeName %s, spec.move %+v; want it on %s untouched", pinned.Spec.StoreName, pinned.Spec.Move, src)
	}
	eventually(t, 60*time.Second, "pool slow Evacuating: moves blocked, the pinned volume named", func() error {
		if err := pc.Get(ctx, client.ObjectKeyFromObject(slow), slow); err != nil {
			return err
		}
		c := meta.FindStatusCondition(slow.Status.Conditions, moveexec.EvacuatingCondition)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != moveexec.ReasonMovesBlocked ||
			!strings.Contains(c.Message, fmt.Sprintf("%d of %d volumes moved, 0 in flight", n, n+1)) ||
			!strings.Contains(c.Message, "1 blocked: "+pinned.Name+" (NoRoom") {
			return fmt.Errorf("Evacuating %+v", c)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, s := range []string{src, dst} {
		if maxSeen[s] != perStore {
			t.Errorf("Store %s took part in at most %d moves at once, want exactly maxParallelMovesPerStore %d", s, maxSeen[s], perStore)
		}
	}
	for _, vs := range vols[:n] {
		if started[vs.Name] != 1 {
			t.Errorf("%s: %d moves started, want 1", vs.Name, started[vs.Name])
		}
	}
	if started[pinned.Name] != 0 {
		t.Errorf("the pinned volume was moved %d times", started[pinned.Name])
	}
	executed := map[string]string{pinned.Name: "blocked:" + move.BlockedNoRoom}
	for _, vs := range vols[:n] {
		executed[vs.Name] = vs.Status.Move.TargetStore
	}
	if fmt.Sprint(predicted) != fmt.Sprint(executed) {
		t.Errorf("plinth diff predicted %v, the executor carried out %v", predicted, executed)
	}
	if got := counter(moveexec.Moves, moveexec.ResultSucceeded) - succeeded0; got != n {
		t.Errorf("plinth_volume_moves_total{result=succeeded} rose by %v, want %d", got, n)
	}
	p.stop()
}

// diffPlan runs plinth diff (diff.Live) of the policy change TestHostMovePlanned applies
// against the cluster as it stands, and returns its move plan: volume → target Store, or
// "blocked:<rule>". The Node stands in for kubelet, labelled for both pools.
func diffPlan(t *testing.T, cfg *rest.Config, c client.Client, dirA, dirB string, perStore int) map[string]string {
	t.Helper()
	ctx := t.Context()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: diff.DefaultNamespace}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"plinth.dev/slow": "true", "plinth.dev/fast": "true"}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	tree := t.TempDir()
	policy := fmt.Sprintf(`apiVersion: policy.plinth.dev/v1alpha1
kind: StoragePool
metadata: {name: slow}
spec:
  nodeSelector: {matchLabels: {plinth.dev/slow: "true"}}
  backend: {file: {directory: %[1]s}}
  evacuateNodes: [%[3]s]
  maxParallelMovesPerStore: %[4]d
---
apiVersion: policy.plinth.dev/v1alpha1
kind: StoragePool
metadata: {name: fast}
spec:
  nodeSelector: {matchLabels: {plinth.dev/fast: "true"}}
  backend: {file: {directory: %[2]s}}
  maxParallelMovesPerStore: %[4]d
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Protocol
metadata: {name: proto}
spec: {local: {}}
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata: {name: apps}
spec:
  poolRef: {name: fast}
  protocolRef: {name: proto}
  storageClass: {name: plinth-apps}
  existingVolumes: Move
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata: {name: pinned}
spec:
  poolRef: {name: slow}
  protocolRef: {name: proto}
  storageClass: {name: plinth-pinned}
`, dirA, dirB, node, perStore)
	if err := os.WriteFile(filepath.Join(tree, "policy.yaml"), []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	scheme, err := policyctl.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	dc, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	r, err := diff.Live(ctx, []string{tree}, diff.LiveOptions{Client: dc})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Problems) != 0 || r.Storage.Moves == nil {
		t.Fatalf("plinth diff: problems %+v, moves %+v", r.Problems, r.Storage.Moves)
	}
	out := map[string]string{}
	for _, m := range r.Storage.Moves.Moves {
		if m.Disruption == move.DisruptionBlocked {
			out[m.Volume] = "blocked:" + m.Blocked
		} else {
			out[m.Volume] = m.Target
		}
	}
	return out
}
