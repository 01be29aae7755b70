package diff_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/diff"
	"github.com/plinth-storage/plinth/controllers/move"
	"github.com/plinth-storage/plinth/controllers/policy"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/crdtest"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

const namespace = "plinth-system"

var ctx = context.Background()

const gi = int64(1) << 30

// TestLive runs the policy controller (controllers/policy, in-process) on the real
// kube-apiserver with the policy tree testdata/live/base applied, Store capacity and volumes
// present (written by the test, standing in for the node agent and the CSI driver), PVCs and
// PVs bound (standing in for kube-controller-manager), then diffs proposed trees against it.
// Finally it applies two proposed trees and checks that the controller did what the diff
// predicted.
func TestLive(t *testing.T) {
	cp := crdtest.ControlPlane(t, controlplane.Options{})
	scheme, err := policy.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}))

	// Nodes, standing in for kubelet.
	for name, labels := range map[string]map[string]string{
		"node-a": {"plinth.dev/storage": "fast"},
		"node-b": {"plinth.dev/storage": "fast", "example.com/rack": "r1"},
		"node-c": {"plinth.dev/storage": "thin"},
	} {
		must(t, c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}))
	}
	// The base policy, standing in for Flux, and the controller.
	applyTree(t, c, "testdata/live/base")
	stop := startController(t, cp)
	defer stop()
	for _, n := range []string{"fast", "scratch", "shared"} {
		waitReady(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}

	// Capacity and volumes, standing in for the agent and the CSI driver.
	setCapacity(t, c, "fast.node-a", 100*gi, 90*gi, 60*gi)
	setCapacity(t, c, "fast.node-b", 100*gi, 90*gi, 40*gi)
	setCapacity(t, c, "thin.node-c", 100*gi, 100*gi, 150*gi)
	volume(t, c, "db-0", "plinth-fast", "fast", "local", "fast.node-a", 40*gi, false)
	volume(t, c, "cache-0", "plinth-scratch", "scratch", "local", "fast.node-a", 20*gi, false)
	volume(t, c, "db-1", "plinth-fast", "fast", "local", "fast.node-b", 40*gi, false)
	volume(t, c, "shared-0", "plinth-shared", "shared", "nvme", "thin.node-c", 150*gi, true)
	// cache-0 on the scratch Placement's tier, as csi-resizer leaves a claim it moved there.
	eventually(t, "VolumeAttributesClass scratch-gold", func() error {
		return c.Get(ctx, types.NamespacedName{Name: "scratch-gold"}, &storagev1.VolumeAttributesClass{})
	})
	var cache0 corev1.PersistentVolumeClaim
	must(t, c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "cache-0"}, &cache0))
	gold := "scratch-gold"
	cache0.Spec.VolumeAttributesClassName = &gold
	must(t, c.Update(ctx, &cache0))

	// db-0's pod runs on node-a (standing in for csi-attacher: the attached VolumeAttachment),
	// and shared-0 has a snapshot (standing in for the CSI controller).
	attach(t, c, "pvc-db-0", "node-a")
	must(t, c.Create(ctx, &storev1.VolumeSnapshotState{ObjectMeta: metav1.ObjectMeta{Name: "snap-shared-0"},
		Spec: storev1.VolumeSnapshotStateSpec{CSIName: "snapshot-shared-0", SourceVolume: storev1.VolumeID("pvc-shared-0"), StoreName: "thin.node-c", Pool: "thin"}}))

	// node-c's agent has reported a kernel without NVMe authentication (bookworm's 6.1)
	var agentC storev1.Agent
	eventually(t, "Agent node-c", func() error { return c.Get(ctx, types.NamespacedName{Name: "node-c"}, &agentC) })
	now := metav1.Now()
	agentC.Status.LastHeartbeatTime = &now
	agentC.Status.Capabilities = storev1.AgentCapabilities{KernelModules: []string{"nvmet", "nvmet_tcp", "nvme_tcp", "dm_thin_pool"}}
	must(t, c.Status().Update(ctx, &agentC))
	refuseVolumeGroup(t, c, "vg-refused")
	// A Pending claim (as created: no volume yet) that sets an override the base policy allows.
	shared := "plinth-shared"
	must(t, c.Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pending-0",
			Annotations: map[string]string{policyv1.OverrideAnnotations[policyv1.OverrideMountOptions]: "noatime"}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &shared, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}))

	opts := diff.LiveOptions{Client: c, Namespace: namespace}
	type want struct {
		exit       int
		objects    []string // "action Kind/name"
		violations []string // "Rule Object field file:line"
		check      func(t *testing.T, r *diff.Report)
	}
	cases := []struct {
		name string
		want want
	}{
		{"base", want{exit: diff.ExitNoChange}},
		{"reserve", want{exit: diff.ExitViolations,
			objects:    []string{"change Store/fast.node-a", "change Store/fast.node-b"},
			violations: []string{"InsufficientRoom StoragePool/fast spec.reserve testdata/live/base/pools.yaml:13"},
			check: func(t *testing.T, r *diff.Report) {
				p := pool(t, r, "fast")
				if p.Before.Allocatable != 180*gi || p.After.Allocatable != 100*gi || p.After.Provisioned != 100*gi {
					t.Errorf("fast capacity %+v", p)
				}
			}}},
		{"narrow", want{exit: diff.ExitViolations,
			objects:    []string{"keep Agent/node-a", "keep Store/fast.node-a"},
			violations: []string{"InsufficientRoom StoragePool/fast spec.nodeSelector testdata/live/narrow/pools.yaml:8"},
			check: func(t *testing.T, r *diff.Report) {
				if len(r.Storage.StoresRemoved) != 1 || !r.Storage.StoresRemoved[0].Drains || len(r.Storage.StoresRemoved[0].Volumes) != 2 {
					t.Fatalf("stores removed: %+v", r.Storage.StoresRemoved)
				}
				if v := r.Storage.StoresRemoved[0].Volumes[0]; v.Claim == "" || v.PV == "" {
					t.Errorf("volume without its PV and claim: %+v", v)
				}
				p := pool(t, r, "fast")
				if p.StoresBefore != 2 || p.StoresAfter != 1 || p.DrainingBytes != 60*gi {
					t.Errorf("fast capacity %+v", p)
				}
			}}},
		{"filesystem", want{exit: diff.ExitViolations,
			violations: []string{"ReplacementNotAllowed Placement/fast spec.filesystem.fsType testdata/live/filesystem/placements.yaml:13"},
			check: func(t *testing.T, r *diff.Report) {
				if len(r.Storage.Classes) != 1 {
					t.Fatalf("classes: %+v", r.Storage.Classes)
				}
				cl := r.Storage.Classes[0]
				if cl.Name != "plinth-fast" || cl.Action != diff.ActionReplace || cl.Allowed || cl.Replacement != "IfUnused" ||
					len(cl.Claims) != 2 || len(cl.Volumes) != 2 || cl.Claims[0].SizeBytes != 40*gi {
					t.Errorf("class impact %+v", cl)
				}
				if len(cl.Changes) != 1 || cl.Changes[0].Field != "parameters."+policyv1.ParamFSType {
					t.Errorf("changes %+v", cl.Changes)
				}
			}}},
		{"replace", want{exit: diff.ExitChanges,
			objects: []string{"replace StorageClass/plinth-fast"},
			check: func(t *testing.T, r *diff.Report) {
				if cl := r.Storage.Classes[0]; !cl.Allowed || cl.Replacement != "Always" || len(cl.Claims) != 2 {
					t.Errorf("class impact %+v", cl)
				}
			}}},
		{"removed", want{exit: diff.ExitViolations,
			objects: []string{"keep StorageClass/plinth-scratch", "keep VolumeAttributesClass/scratch-gold"},
			violations: []string{"PrunedClassInUse Placement/scratch  testdata/live/removed:0",
				"AttributesClassInUse Placement/scratch spec.attributesClasses testdata/live/removed:0"},
			check: func(t *testing.T, r *diff.Report) {
				a := r.Storage.AttributesClasses
				if len(a) != 1 || a[0].Name != "scratch-gold" || a[0].Action != diff.ActionKeep || len(a[0].Claims) != 1 || a[0].Claims[0] != "default/cache-0" {
					t.Errorf("attributes classes %+v, want scratch-gold kept for default/cache-0", a)
				}
			}}},
		{"protocol", want{exit: diff.ExitViolations,
			objects:    []string{"change Agent/node-c"},
			violations: []string{"ProtocolChangeWithExports Protocol/nvme spec.nvmeofTcp.port testdata/live/protocol/protocols.yaml:14"}}},
		// Expected: turning on DH-HMAC-CHAP changes node-c's Agent (spec.nvmeof.auth) and is a
		// violation twice: the protocol of exported volumes changes, and node-c's kernel said
		// it has no target authentication.
		{"auth", want{exit: diff.ExitViolations,
			objects: []string{"change Agent/node-c"},
			violations: []string{"ProtocolChangeWithExports Protocol/nvme spec.nvmeofTcp.auth testdata/live/auth/protocols.yaml:16",
				"AuthUnsupported Protocol/nvme spec.nvmeofTcp.auth testdata/live/auth/protocols.yaml:16"},
			check: func(t *testing.T, r *diff.Report) {
				for _, v := range r.Violations {
					if v.Rule == diff.RuleAuthUnsupported && !strings.Contains(v.Message, "node node-c") {
						t.Errorf("AuthUnsupported does not name the node: %s", v.Message)
					}
				}
			}}},
		// Expected: a pool with a bcache cache on node-c, whose kernel reported no bcache
		// module: its Store would be Stalled, so the diff says so before anything is applied.
		{"cache", want{exit: diff.ExitViolations,
			objects:    []string{"change Agent/node-c", "create Store/tiered.node-c"},
			violations: []string{"CacheUnsupported StoragePool/tiered spec.backend.lvm.cache testdata/live/cache/pools.yaml:44"},
			check: func(t *testing.T, r *diff.Report) {
				for _, v := range r.Violations {
					if v.Rule == diff.RuleCacheUnsupported && !strings.Contains(v.Message, "node node-c") {
						t.Errorf("CacheUnsupported does not name the node: %s", v.Message)
					}
				}
			}}},
		{"rejected", want{exit: diff.ExitViolations,
			violations: []string{"DryRunRejected StoragePool/fast spec.backend.lvm.volumeGroup testdata/live/base/pools.yaml:12",
				"DryRunRejected StoragePool/fast spec.backend.lvm.volumeGroup testdata/live/base/pools.yaml:12"}}},
		{"overrides", want{exit: diff.ExitViolations,
			violations: []string{"OverrideRefused Placement/shared spec.overrides.allowed testdata/live/overrides/placements.yaml:41"},
			check: func(t *testing.T, r *diff.Report) {
				if m := r.Violations[0].Message; !strings.Contains(m, "1 Pending PVCs (default/pending-0)") || !strings.Contains(m, "plinth.dev/mount-options") {
					t.Errorf("message %q does not name the PVC and its annotation", m)
				}
			}}},
		// Expected: node-a's two local volumes leave it for node-b, the only other Store of
		// pool fast: largest first, db-0 (40Gi) takes 40 of node-b's 50Gi available, so
		// cache-0 (20Gi) has no room; node-c carries no Store of the pool.
		{"evacuate", want{exit: diff.ExitViolations,
			objects: []string{"change Store/fast.node-a"},
			violations: []string{"EvacuateNodeNotInPool StoragePool/fast spec.evacuateNodes testdata/live/evacuate/pools.yaml:15",
				"MoveNoRoom StoragePool/fast spec.evacuateNodes testdata/live/evacuate/pools.yaml:15"},
			check: func(t *testing.T, r *diff.Report) {
				m := r.Storage.Moves
				if m == nil || len(m.Moves) != 2 {
					t.Fatalf("moves: %+v", m)
				}
				db, cache := m.Moves[0], m.Moves[1]
				if db.Volume != storev1.VolumeID("pvc-db-0") || db.Claim != "default/db-0" || db.PV != "pvc-db-0" ||
					db.Source != "fast.node-a" || db.Target != "fast.node-b" || db.Bytes != 40*gi ||
					db.Disruption != move.DisruptionPodRestart || db.RateMeasured || db.DurationSeconds != 410 {
					t.Errorf("db-0 move %+v", db)
				}
				if cache.Claim != "default/cache-0" || cache.Disruption != move.DisruptionBlocked || cache.Blocked != move.BlockedNoRoom ||
					!strings.Contains(cache.Reason, "the most room left on an eligible Store of pool fast is 10Gi (fast.node-b") {
					t.Errorf("cache-0 move %+v", cache)
				}
				want := move.PoolCapacity{Pool: "fast", ProvisionedBefore: 100 * gi, ProvisionedAfter: 100 * gi, AvailableBefore: 80 * gi,
					AvailableAfter: 10 * gi, MovesIn: 1, MovesOut: 1, Left: 20 * gi}
				if len(m.Pools) != 1 || m.Pools[0] != want {
					t.Errorf("pools %+v, want %+v", m.Pools, want)
				}
				if m.Bytes != 40*gi || m.Seconds != 410 || m.Blocked != 1 || m.AssumedRate != diff.DefaultMoveRate {
					t.Errorf("totals %+v", m)
				}
			}}},
		// Expected: Placement shared moves to pool fast with existingVolumes: Move, so its
		// NVMe-oF volume would follow, but it has a snapshot: refused.
		{"follow", want{exit: diff.ExitViolations,
			objects:    []string{"replace StorageClass/plinth-shared", "change Agent/node-a", "change Agent/node-b", "change Agent/node-c"},
			violations: []string{"MoveSnapshots Placement/shared spec.existingVolumes testdata/live/follow/placements.yaml:41"},
			check: func(t *testing.T, r *diff.Report) {
				m := r.Storage.Moves
				if m == nil || len(m.Moves) != 1 {
					t.Fatalf("moves: %+v", m)
				}
				if mv := m.Moves[0]; mv.Claim != "default/shared-0" || mv.Pool != "fast" || mv.Protocol != move.ProtocolNVMeoF ||
					mv.Blocked != move.BlockedSnapshots || !strings.Contains(mv.Reason, "snap-shared-0") {
					t.Errorf("shared-0 move %+v", mv)
				}
			}}},
		{"overcommit", want{exit: diff.ExitViolations,
			objects:    []string{"change Store/thin.node-c"},
			violations: []string{"OvercommitExceeded StoragePool/thin spec.overcommitPercent testdata/live/overcommit/pools.yaml:29"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := diff.Live(ctx, []string{"testdata/live/" + tc.name}, opts)
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			must(t, diff.Write(&text, r, diff.FormatText))
			t.Logf("\n%s", text.String())
			if got := r.ExitCode(); got != tc.want.exit {
				t.Errorf("exit %d, want %d", got, tc.want.exit)
			}
			var objs []string
			for _, o := range r.Objects {
				objs = append(objs, o.Action+" "+o.Kind+"/"+o.Name)
			}
			if strings.Join(objs, "\n") != strings.Join(tc.want.objects, "\n") {
				t.Errorf("objects:\n%s\nwant:\n%s", strings.Join(objs, "\n"), strings.Join(tc.want.objects, "\n"))
			}
			var vs []string
			for _, v := range r.Violations {
				vs = append(vs, fmt.Sprintf("%s %s %s %s:%d", v.Rule, v.Object, v.Field, v.File, v.Line))
			}
			if strings.Join(vs, "\n") != strings.Join(tc.want.violations, "\n") {
				t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(vs, "\n"), strings.Join(tc.want.violations, "\n"))
			}
			if tc.want.check != nil {
				tc.want.check(t, r)
			}
			golden(t, r, "live-"+tc.name)
		})
	}

	// A proposed tree with misspelled Placement fields is refused with the positions, as
	// plinth vet refuses it, before anything is compared with the cluster.
	t.Run("typo", func(t *testing.T) {
		r, err := diff.Live(ctx, []string{"testdata/typo"}, opts)
		if err != nil {
			t.Fatal(err)
		}
		checkTypoProblems(t, r)
	})

	// With the explicit override (plinth.dev/prune: force) on the live class, the same removal
	// deletes the class in use: a change (exit 1), no violation, and the report says what will fail.
	t.Run("removed-forced", func(t *testing.T) {
		force := func(on bool) {
			update(t, c, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "plinth-scratch"}}, func(sc *storagev1.StorageClass) {
				if on {
					sc.Annotations = map[string]string{policy.AnnotationPrune: policy.PruneValueForce}
				} else {
					delete(sc.Annotations, policy.AnnotationPrune)
				}
			})
			update(t, c, &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "scratch-gold"}}, func(vac *storagev1.VolumeAttributesClass) {
				if on {
					vac.Annotations = map[string]string{policy.AnnotationPrune: policy.PruneValueForce}
				} else {
					delete(vac.Annotations, policy.AnnotationPrune)
				}
			})
		}
		force(true)
		defer force(false)
		r, err := diff.Live(ctx, []string{"testdata/live/removed"}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.ExitCode(); got != diff.ExitChanges || len(r.Violations) != 0 {
			t.Errorf("exit %d with violations %+v, want %d and none", got, r.Violations, diff.ExitChanges)
		}
		found := false
		for _, ci := range r.Storage.Classes {
			if ci.Name == "plinth-scratch" {
				found = true
				if ci.Action != diff.ActionPrune || !strings.Contains(ci.Outcome, "existing PVs keep working, expansion of its PVCs will fail") {
					t.Errorf("class impact %+v", ci)
				}
			}
		}
		if !found {
			t.Errorf("no impact reported for plinth-scratch: %+v", r.Storage.Classes)
		}
	})

	// --move-rate reaches the plan: 40Gi at 1Gi/s is 40 s, and the report says it is assumed.
	t.Run("evacuate-rate", func(t *testing.T) {
		o := opts
		o.MoveRate = gi
		r, err := diff.Live(ctx, []string{"testdata/live/evacuate"}, o)
		must(t, err)
		m := r.Storage.Moves
		if m == nil || m.Moves[0].DurationSeconds != 40 || m.Moves[0].RateMeasured || m.AssumedRate != gi || m.Seconds != 40 {
			t.Fatalf("moves at 1Gi/s: %+v", m)
		}
		var text bytes.Buffer
		must(t, diff.Write(&text, r, diff.FormatText))
		if !strings.Contains(text.String(), "40s*") || !strings.Contains(text.String(), "assume a copy rate of 1Gi/s") {
			t.Errorf("text does not show the assumed rate:\n%s", text.String())
		}
	})

	// The controller does what the diff predicted for "evacuate", and no more: the Store is
	// marked evacuated (no new volume: IsDraining), the pool reports Evacuating with the
	// moves not carried out, and every volume stays where it is. Undone before "applied".
	t.Run("evacuate-applied", func(t *testing.T) {
		set := func(nodes []string) {
			update(t, c, &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: "fast"}}, func(p *policyv1.StoragePool) {
				p.Spec.EvacuateNodes = nodes
			})
		}
		set([]string{"node-a", "node-c"})
		eventually(t, "Store fast.node-a evacuated and pool fast Evacuating", func() error {
			var s storev1.Store
			if err := c.Get(ctx, types.NamespacedName{Name: "fast.node-a"}, &s); err != nil {
				return err
			}
			if !s.Spec.Evacuate || !s.IsDraining() || s.IsMarkedDraining() {
				return fmt.Errorf("Store spec %+v, annotations %v", s.Spec, s.Annotations)
			}
			var p policyv1.StoragePool
			if err := c.Get(ctx, types.NamespacedName{Name: "fast"}, &p); err != nil {
				return err
			}
			ev := conditions.Get(&p, policy.EvacuatingCondition)
			if ev == nil || ev.Status != metav1.ConditionTrue || ev.Reason != policy.ReasonMovesNotExecuted ||
				!strings.Contains(ev.Message, "fast.node-a") || !strings.Contains(ev.Message, "holding 60Gi") {
				return fmt.Errorf("Evacuating %+v", ev)
			}
			return nil
		})
		// The evacuation merged, diffing the same tree again plans the same moves, the blocked
		// one included, but it is no violation any more: this change does not cause it.
		r, err := diff.Live(ctx, []string{"testdata/live/evacuate"}, opts)
		must(t, err)
		if r.ExitCode() != diff.ExitNoChange || len(r.Violations) != 0 || r.Storage.Moves == nil || r.Storage.Moves.Blocked != 1 {
			t.Errorf("evacuate again after it was applied: exit %d, violations %+v, moves %+v", r.ExitCode(), r.Violations, r.Storage.Moves)
		}
		var vols storev1.VolumeStateList
		must(t, c.List(ctx, &vols))
		if len(vols.Items) != 4 {
			t.Errorf("%d VolumeStates after the evacuation was applied, want the 4 made (nothing moved or deleted)", len(vols.Items))
		}
		for _, v := range vols.Items {
			if !v.DeletionTimestamp.IsZero() {
				t.Errorf("VolumeState %s being deleted", v.Name)
			}
		}
		set(nil)
		eventually(t, "evacuation lifted", func() error {
			var s storev1.Store
			if err := c.Get(ctx, types.NamespacedName{Name: "fast.node-a"}, &s); err != nil {
				return err
			}
			var p policyv1.StoragePool
			if err := c.Get(ctx, types.NamespacedName{Name: "fast"}, &p); err != nil {
				return err
			}
			if s.Spec.Evacuate || conditions.Get(&p, policy.EvacuatingCondition) != nil {
				return fmt.Errorf("Store evacuate %v, pool Evacuating %+v", s.Spec.Evacuate, conditions.Get(&p, policy.EvacuatingCondition))
			}
			return nil
		})
	})

	// The controller does what the diff predicted: apply "narrow" and "removed" together
	// (Flux would), then the Store holding volumes drains, its Agent stays, the StorageClass
	// in use stays and the Placement reports InUse; diffing the applied tree again finds no
	// change.
	t.Run("applied", func(t *testing.T) {
		update(t, c, &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: "fast"}}, func(p *policyv1.StoragePool) {
			p.Spec.NodeSelector.MatchLabels["example.com/rack"] = "r1"
		})
		must(t, c.Delete(ctx, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: "scratch"}}))
		eventually(t, "Store fast.node-a draining", func() error {
			var s storev1.Store
			if err := c.Get(ctx, types.NamespacedName{Name: "fast.node-a"}, &s); err != nil {
				return err
			}
			if !s.IsDraining() {
				return fmt.Errorf("not draining")
			}
			return nil
		})
		eventually(t, "Placement scratch InUse", func() error {
			var pl policyv1.Placement
			if err := c.Get(ctx, types.NamespacedName{Name: "scratch"}, &pl); err != nil {
				return err
			}
			if r := conditions.GetReason(&pl, meta.ReadyCondition); r != policy.ReasonInUse {
				return fmt.Errorf("Ready reason %q", r)
			}
			return nil
		})
		for _, o := range []client.Object{&storev1.Agent{}, &storagev1.StorageClass{}} {
			name := map[bool]string{true: "node-a", false: "plinth-scratch"}[isAgent(o)]
			if err := c.Get(ctx, types.NamespacedName{Name: name}, o); err != nil {
				t.Errorf("%T %s: %v (the diff predicted it kept)", o, name, err)
			}
		}
		// The applied tree: narrow's pools with removed's placements.
		dir := t.TempDir()
		for src, dst := range map[string]string{"narrow/pools.yaml": "pools.yaml", "base/protocols.yaml": "protocols.yaml", "removed/placements.yaml": "placements.yaml"} {
			b, err := os.ReadFile(filepath.Join("testdata/live", src))
			must(t, err)
			must(t, os.WriteFile(filepath.Join(dir, dst), b, 0o600))
		}
		r, err := diff.Live(ctx, []string{dir}, opts)
		must(t, err)
		var text bytes.Buffer
		must(t, diff.Write(&text, r, diff.FormatText))
		if r.ExitCode() != diff.ExitNoChange {
			t.Errorf("after apply: exit %d, want 0:\n%s", r.ExitCode(), text.String())
		}
		for _, o := range r.Objects {
			if o.Action != diff.ActionKeep || !o.Ongoing {
				t.Errorf("after apply: %+v, want only ongoing keeps", o)
			}
		}
	})
}

// refuseVolumeGroup adds a validation rule to the Store CRD, standing in for a cluster that
// refuses what the policy's own checks let through (a stricter CRD of a newer Plinth, a site's
// admission): Stores on volume group vg are invalid at spec.backend.lvm.volumeGroup. It waits
// until the API server enforces it (a dry-run create is refused).
func refuseVolumeGroup(t *testing.T, c client.Client, vg string) {
	t.Helper()
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
	crd.SetName("stores." + storev1.GroupVersion.Group)
	patch := `[{"op": "add", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/backend/properties/lvm/x-kubernetes-validations",
		"value": [{"rule": "self.volumeGroup != '` + vg + `'", "message": "volume group ` + vg + ` is reserved", "fieldPath": ".volumeGroup"}]}]`
	must(t, c.Patch(ctx, crd, client.RawPatch(types.JSONPatchType, []byte(patch))))
	probe := &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: "probe." + vg},
		Spec: storev1.StoreSpec{Pool: "probe", NodeName: "node-a",
			Backend: policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: vg}}}}
	eventually(t, "Store CRD refuses volume group "+vg, func() error {
		err := c.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if err == nil {
			return fmt.Errorf("dry-run create of a Store on %s allowed", vg)
		}
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "is reserved") {
			return fmt.Errorf("not refused by the rule yet: %w", err)
		}
		return nil
	})
}

func isAgent(o client.Object) bool { _, ok := o.(*storev1.Agent); return ok }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func pool(t *testing.T, r *diff.Report, name string) diff.PoolCapacity {
	t.Helper()
	for _, p := range r.Storage.Pools {
		if p.Pool == name {
			return p
		}
	}
	t.Fatalf("no pool %s in %+v", name, r.Storage.Pools)
	return diff.PoolCapacity{}
}

// golden compares the three formats of r with testdata/golden/<name>.{txt,json,md}.
func golden(t *testing.T, r *diff.Report, name string) {
	t.Helper()
	for format, ext := range map[string]string{diff.FormatText: "txt", diff.FormatJSON: "json", diff.FormatMarkdown: "md"} {
		var b bytes.Buffer
		must(t, diff.Write(&b, r, format))
		path := filepath.Join("testdata", "golden", name+"."+ext)
		if *updateGolden {
			must(t, os.MkdirAll(filepath.Dir(path), 0o755))
			must(t, os.WriteFile(path, b.Bytes(), 0o644))
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -update to write it)", err)
		}
		if !bytes.Equal(b.Bytes(), want) {
			t.Errorf("%s differs from the golden file (go test -update rewrites it):\n%s", path, b.String())
		}
	}
}

// applyTree creates the policy objects of a tree, as Flux would.
func applyTree(t *testing.T, c client.Client, path string) {
	t.Helper()
	set, err := vet.Load(path)
	must(t, err)
	v, err := vet.NewVetter()
	must(t, err)
	pol, problems := v.Vet(set)
	if len(problems) > 0 {
		t.Fatalf("%s: %v", path, problems)
	}
	for i := range pol.Pools {
		must(t, c.Create(ctx, &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: pol.Pools[i].Name}, Spec: pol.Pools[i].Spec}))
	}
	for i := range pol.Protocols {
		must(t, c.Create(ctx, &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: pol.Protocols[i].Name}, Spec: pol.Protocols[i].Spec}))
	}
	for i := range pol.Placements {
		must(t, c.Create(ctx, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: pol.Placements[i].Name}, Spec: pol.Placements[i].Spec}))
	}
}

func startController(t *testing.T, cp *controlplane.ControlPlane) func() {
	t.Helper()
	cctx, cancel := context.WithCancel(context.Background())
	mgr, _, err := policy.NewManager(cctx, policy.Options{
		Config: cp.Admin.Config, MetricsAddr: "0", HealthAddr: "0", Namespace: namespace,
		Logger: logr.Discard(), SkipNameValidation: true,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(cctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	controlplane.Eventually(t, 60*time.Second, 200*time.Millisecond, what, f)
}

func waitReady(t *testing.T, c client.Client, pl *policyv1.Placement) {
	t.Helper()
	eventually(t, "Placement "+pl.Name+" Ready", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pl), pl); err != nil {
			return err
		}
		if !conditions.IsReady(pl) {
			return fmt.Errorf("not Ready: %s", conditions.GetMessage(pl, meta.ReadyCondition))
		}
		return nil
	})
}

func update[T client.Object](t *testing.T, c client.Client, obj T, mutate func(T)) {
	t.Helper()
	for i := 0; ; i++ {
		must(t, c.Get(ctx, client.ObjectKeyFromObject(obj), obj))
		mutate(obj)
		err := c.Update(ctx, obj)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 10 {
			t.Fatalf("update %s: %v", obj.GetName(), err)
		}
	}
}

// setCapacity writes a Store's status.capacity, standing in for the node agent.
func setCapacity(t *testing.T, c client.Client, store string, total, allocatable, provisioned int64) {
	t.Helper()
	var s storev1.Store
	eventually(t, "Store "+store, func() error { return c.Get(ctx, types.NamespacedName{Name: store}, &s) })
	s.Status.Capacity = &storev1.Capacity{Total: total, Allocatable: allocatable, Provisioned: provisioned, Available: max(allocatable-provisioned, 0)}
	must(t, c.Status().Update(ctx, &s))
}

// attach creates the attached VolumeAttachment of pv on node, standing in for csi-attacher.
func attach(t *testing.T, c client.Client, pv, node string) {
	t.Helper()
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-" + pv},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: policyv1.DriverName, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}}}
	must(t, c.Create(ctx, va))
	va.Status.Attached = true
	must(t, c.Status().Update(ctx, va))
}

// volume creates a VolumeState on store (standing in for the CSI controller and the agent),
// a PV with its CSI volume handle and a PVC bound to it (standing in for external-provisioner
// and kube-controller-manager's binder).
func volume(t *testing.T, c client.Client, claim, class, placement, protocol, store string, size int64, exported bool) {
	t.Helper()
	var s storev1.Store
	must(t, c.Get(ctx, types.NamespacedName{Name: store}, &s))
	csiName := "pvc-" + claim
	id := storev1.VolumeID(csiName)
	ps := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	if protocol == "nvme" {
		ps = policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "10.0.0.0/24"}}
	}
	vs := &storev1.VolumeState{
		ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{policyv1.LabelPool: s.Spec.Pool, policyv1.LabelNode: s.Spec.NodeName}},
		Spec: storev1.VolumeStateSpec{CSIName: csiName, StoreName: store, CapacityBytes: size, VolumeMode: "Filesystem",
			Policy: storev1.FrozenPolicy{Placement: placement, Pool: s.Spec.Pool, Protocol: protocol, Backend: s.Spec.Backend, ProtocolSpec: ps}},
	}
	must(t, c.Create(ctx, vs))
	vs.Status.Phase = storev1.VolumeReady
	if exported {
		vs.Status.Export = &storev1.Export{NQN: "nqn.2024-01.dev.plinth:" + id, Address: "10.0.0.3", Port: 4420}
	}
	must(t, c.Status().Update(ctx, vs))
	q := *resource.NewQuantity(size, resource.BinarySI)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: csiName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: q},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:       class,
			ClaimRef:               &corev1.ObjectReference{Namespace: "default", Name: claim},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: policyv1.DriverName, VolumeHandle: id}},
		},
	}
	must(t, c.Create(ctx, pv))
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: claim},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class, VolumeName: pv.Name,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: q}},
		},
	}
	must(t, c.Create(ctx, pvc))
	pvc.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, Capacity: corev1.ResourceList{corev1.ResourceStorage: q},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}}
	must(t, c.Status().Update(ctx, pvc))
}
