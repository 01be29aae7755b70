package policy_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/policy"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestApplyStatusAndNodeSelector: create → objects appear, conditions Ready with
// observedGeneration, inventory recorded; edit a pool's nodeSelector → Stores follow, the
// Store and Agent of the node that left are pruned; a restarted controller makes no write.
func TestApplyStatusAndNodeSelector(t *testing.T) {
	c := env(t)
	node(t, c, "a1", map[string]string{"plinth.dev/storage": "a"})
	node(t, c, "a2", map[string]string{"plinth.dev/storage": "a-other"})
	p, proto, pl := pool("apool", "a", ""), localProtocol("alocal"), placement("afast", "apool", "alocal", "a-fast")
	create(t, c, p, proto, pl)
	ctl := startController(t)

	waitReady(t, c, pl)
	waitReady(t, c, p)
	waitReady(t, c, proto)
	var sc storagev1.StorageClass
	exists(t, c, &sc, "a-fast")
	if sc.Provisioner != policyv1.DriverName || sc.Parameters[policyv1.ParamPool] != "apool" || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Errorf("StorageClass %+v", sc)
	}
	var st storev1.Store
	exists(t, c, &st, "apool.a1")
	var ag storev1.Agent
	exists(t, c, &ag, "a1")
	if p.Status.ObservedGeneration != p.Generation || *p.Status.MatchedNodes != 1 {
		t.Errorf("pool status %+v", p.Status)
	}
	if pl.Status.StorageClass != "a-fast" || pl.Status.InUseBy == nil || *pl.Status.InUseBy != 0 || len(pl.Finalizers) != 1 {
		t.Errorf("placement status %+v finalizers %v", pl.Status, pl.Finalizers)
	}
	waitInventory(t, c, "lists the class, Store and Agent", func(inv string) error {
		return contains(inv, "storage.k8s.io v1 StorageClass a-fast ", "storage.plinth.dev v1alpha1 Store apool.a1 ", "storage.plinth.dev v1alpha1 Agent a1 ")
	})
	if got := conditions.Get(p, policy.StoresReadyCondition); got == nil || got.Status != metav1.ConditionUnknown {
		t.Errorf("StoresReady before any agent reported: %+v", got)
	}

	// The pool moves to the other node: its Store and Agent follow, a1's are pruned.
	update(t, c, p, func(p *policyv1.StoragePool) { p.Spec.NodeSelector.MatchLabels["plinth.dev/storage"] = "a-other" })
	exists(t, c, &st, "apool.a2")
	gone(t, c, &storev1.Store{}, "apool.a1")
	gone(t, c, &storev1.Agent{}, "a1")
	waitReady(t, c, p)

	// A no-op reconcile writes nothing; neither does a restarted controller's first one.
	if n, log := reconcileNow(t, ctl); n != 0 {
		t.Errorf("no-op reconcile made %d writes: %v", n, log)
	}
	ctl.stop()
	before := reconciles(t)
	ctl2 := startController(t)
	eventually(t, 30*time.Second, "restarted controller's first reconcile", func() error {
		if reconciles(t) == before {
			return fmt.Errorf("no reconcile yet")
		}
		return nil
	})
	if n, log := ctl2.writes.writes(); n != 0 {
		t.Errorf("restarted controller made %d writes with nothing changed: %v", n, log)
	}
	if n, log := reconcileNow(t, ctl2); n != 0 {
		t.Errorf("no-op reconcile after restart made %d writes: %v", n, log)
	}
	deleteAll(t, c, pl, p, proto)
	gone(t, c, &storagev1.StorageClass{}, "a-fast")
	gone(t, c, &policyv1.Placement{}, "afast")
}

// TestPruneInventoryOnlyAndInUse: an object carrying Plinth's labels but absent from the
// inventory is never pruned; a StorageClass used by PVCs is kept and reported on its Placement,
// which keeps its finalizer until the PVCs are gone; a class with pruning disabled is never
// deleted.
func TestPruneInventoryOnlyAndInUse(t *testing.T) {
	c := env(t)
	node(t, c, "b1", map[string]string{"plinth.dev/storage": "b"})
	p, proto := pool("bpool", "b", ""), localProtocol("blocal")
	used, optout := placement("bused", "bpool", "blocal", "b-used"), placement("bkeep", "bpool", "blocal", "b-keep")
	create(t, c, p, proto, used, optout)
	// An operator's object with Plinth's labels, never applied by Plinth: labels never make an
	// object prunable, only the inventory does.
	foreign := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "b-foreign", Labels: map[string]string{policyv1.LabelManagedBy: "plinth", policyv1.LabelPlacement: "bused", policyv1.LabelPool: "bpool"}},
		Provisioner: policyv1.DriverName,
	}
	create(t, c, foreign)
	startController(t)
	waitReady(t, c, used)
	waitReady(t, c, optout)
	claims := []*corev1.PersistentVolumeClaim{pvc(t, c, "b-claim-1", "b-used"), pvc(t, c, "b-claim-2", "b-used")}
	// Opt-out by hand on the live class (as with Flux's kustomize.toolkit.fluxcd.io/prune).
	keep := storageClass(t, c, "b-keep")
	keep.Annotations = map[string]string{"plinth.dev/prune": "disabled"}
	if err := c.Update(ctx, keep); err != nil {
		t.Fatal(err)
	}

	deleteAll(t, c, used, optout)
	eventually(t, 30*time.Second, "in-use Placement reported", func() error {
		var cur policyv1.Placement
		if err := c.Get(ctx, types.NamespacedName{Name: "bused"}, &cur); err != nil {
			return err
		}
		r := conditions.Get(&cur, meta.ReadyCondition)
		if r == nil || r.Reason != policy.ReasonInUse || cur.Status.InUseBy == nil || *cur.Status.InUseBy != 2 {
			return fmt.Errorf("status %+v", cur.Status)
		}
		return contains(r.Message, "in use by 2 PVCs")
	})
	gone(t, c, &policyv1.Placement{}, "bkeep")
	storageClass(t, c, "b-used")
	storageClass(t, c, "b-keep")
	storageClass(t, c, "b-foreign")
	waitInventory(t, c, "the kept class stays listed, the opted-out class leaves", func(inv string) error {
		if err := contains(inv, "StorageClass b-used "); err != nil {
			return err
		}
		return lacks(inv, "b-keep")
	})

	for _, cl := range claims {
		deletePVC(t, c, cl)
	}
	gone(t, c, &storagev1.StorageClass{}, "b-used")
	gone(t, c, &policyv1.Placement{}, "bused")
	storageClass(t, c, "b-keep")
	storageClass(t, c, "b-foreign")
	deleteAll(t, c, p, proto, foreign, keep)
	gone(t, c, &storev1.Store{}, "bpool.b1")
}

// TestInvalidPolicyStalls: a placement naming a missing pool stalls with the CUE message and
// position; the valid objects report that nothing is applied; the applied objects survive
// untouched; the controller does not retry in a loop.
func TestInvalidPolicyStalls(t *testing.T) {
	c := env(t)
	node(t, c, "c1", map[string]string{"plinth.dev/storage": "c"})
	p, proto, pl := pool("cpool", "c", ""), localProtocol("clocal"), placement("cfast", "cpool", "clocal", "c-fast")
	create(t, c, p, proto, pl)
	ctl := startController(t)
	waitReady(t, c, pl)
	before := storageClass(t, c, "c-fast")

	bad := placement("cbad", "cmissing", "clocal", "c-bad")
	create(t, c, bad)
	waitCondition(t, c, bad, meta.StalledCondition, "True", policy.ReasonInvalidPolicy)
	if err := contains(conditions.GetMessage(bad, meta.ReadyCondition), `placement/cbad:`, `Placement/cbad: spec.poolRef.name: StoragePool "cmissing" not found`); err != nil {
		t.Error(err)
	}
	waitCondition(t, c, pl, meta.ReadyCondition, "False", policy.ReasonPolicySetInvalid)
	// Meanwhile a policy edit is not applied.
	update(t, c, pl, func(pl *policyv1.Placement) { pl.Spec.StorageClass.AllowVolumeExpansion = true })
	waitCondition(t, c, pl, meta.ReadyCondition, "False", policy.ReasonPolicySetInvalid)
	after := storageClass(t, c, "c-fast")
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("StorageClass changed while the set was invalid")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "c-bad"}, &storagev1.StorageClass{}); !apierrors.IsNotFound(err) {
		t.Errorf("invalid placement rendered: %v", err)
	}
	// No retry storm: a reconcile of the stalled set writes nothing (a write would wake the
	// controller's own watches) and asks for no requeue (an error or a RequeueAfter would run
	// it again and again). The reconcile is run here, so the check cannot pass on one that
	// never happened.
	res, n, log := reconcileResult(t, ctl)
	if n != 0 || !res.IsZero() {
		t.Errorf("a reconcile of the stalled set wrote %d times (%v) and returned %+v; want no write and no requeue", n, log, res)
	}

	deleteAll(t, c, bad)
	waitReady(t, c, pl)
	if sc := storageClass(t, c, "c-fast"); sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
		t.Errorf("edit not applied once the set was valid again")
	}
	deleteAll(t, c, pl, p, proto)
	gone(t, c, &policyv1.Placement{}, "cfast")
}

// TestDrift: hand edits and deletes of a StorageClass and a Store are reported as Drifted
// under Report and corrected under Correct; another writer's annotation and server defaults
// are no drift.
func TestDrift(t *testing.T) {
	c := env(t)
	node(t, c, "d1", map[string]string{"plinth.dev/storage": "d"})
	p, proto, pl := pool("dpool", "d", policyv1.DriftPolicyReport), localProtocol("dlocal"), placement("dfast", "dpool", "dlocal", "d-fast")
	create(t, c, p, proto, pl)
	ctl := startController(t)
	waitReady(t, c, pl)
	waitCondition(t, c, pl, policy.DriftedCondition, "False", policy.ReasonNoDrift)
	var st storev1.Store
	exists(t, c, &st, "dpool.d1")

	// Another controller annotates the class, the agent writes Store status: no drift.
	sc := storageClass(t, c, "d-fast")
	sc.Annotations = map[string]string{"other.example.com/seen": "yes"}
	if err := c.Update(ctx, sc, client.FieldOwner("other-controller")); err != nil {
		t.Fatal(err)
	}
	st.Status.Capacity = &storev1.Capacity{Total: 100, Allocatable: 90, Available: 90}
	if err := c.Status().Update(ctx, &st); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "pool capacity from Store status", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		if p.Status.Capacity == nil || p.Status.Capacity.Available != 90 {
			return fmt.Errorf("capacity %+v", p.Status.Capacity)
		}
		return nil
	})
	if n, log := reconcileNow(t, ctl); n != 0 {
		t.Errorf("foreign annotation/status caused %d writes: %v", n, log)
	}
	waitCondition(t, c, pl, policy.DriftedCondition, "False", policy.ReasonNoDrift)

	// Hand edit of a field Plinth owns, and hand delete of the Store, under Report.
	sc = storageClass(t, c, "d-fast")
	yes := true
	sc.AllowVolumeExpansion = &yes
	if err := c.Update(ctx, sc, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, c, pl, policy.DriftedCondition, "True", policy.ReasonDriftDetected)
	if err := contains(conditions.GetMessage(pl, policy.DriftedCondition), "StorageClass/d-fast: allowVolumeExpansion"); err != nil {
		t.Error(err)
	}
	if err := c.Delete(ctx, &st); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, c, p, policy.DriftedCondition, "True", policy.ReasonDriftDetected)
	if err := contains(conditions.GetMessage(p, policy.DriftedCondition), "Store/dpool.d1 deleted"); err != nil {
		t.Error(err)
	}
	if sc := storageClass(t, c, "d-fast"); !*sc.AllowVolumeExpansion {
		t.Error("drift corrected under driftPolicy Report")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "dpool.d1"}, &storev1.Store{}); !apierrors.IsNotFound(err) {
		t.Errorf("deleted Store recreated under Report: %v", err)
	}

	// Correct: both are restored.
	update(t, c, p, func(p *policyv1.StoragePool) { p.Spec.DriftPolicy = policyv1.DriftPolicyCorrect })
	exists(t, c, &st, "dpool.d1")
	eventually(t, 30*time.Second, "StorageClass restored", func() error {
		if sc := storageClass(t, c, "d-fast"); *sc.AllowVolumeExpansion {
			return fmt.Errorf("allowVolumeExpansion still true")
		}
		return nil
	})
	waitCondition(t, c, pl, policy.DriftedCondition, "False", "")
	sc = storageClass(t, c, "d-fast")
	sc.Labels[policyv1.LabelPool] = "hand-edited"
	if err := c.Update(ctx, sc, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "label restored", func() error {
		if sc := storageClass(t, c, "d-fast"); sc.Labels[policyv1.LabelPool] != "dpool" {
			return fmt.Errorf("label %q", sc.Labels[policyv1.LabelPool])
		}
		return nil
	})
	waitCondition(t, c, pl, policy.DriftedCondition, "False", policy.ReasonDriftCorrected)
	if sc := storageClass(t, c, "d-fast"); sc.Annotations["other.example.com/seen"] != "yes" {
		t.Error("another writer's annotation was removed")
	}
	deleteAll(t, c, pl, p, proto)
	gone(t, c, &policyv1.Placement{}, "dfast")
}

// TestImmutableReplacement: an fsType change needs a new
// StorageClass: under Never it is reported (ReplacementRequired, Stalled) while
// allowVolumeExpansion is patched in place; under IfUnused it waits while a PVC uses the
// class and replaces it once unused, keeping the default-class annotation.
func TestImmutableReplacement(t *testing.T) {
	c := env(t)
	node(t, c, "e1", map[string]string{"plinth.dev/storage": "e"})
	p, proto, pl := pool("epool", "e", ""), localProtocol("elocal"), placement("efast", "epool", "elocal", "e-fast")
	pl.Spec.Filesystem.FSType = "xfs"
	create(t, c, p, proto, pl)
	startController(t)
	waitReady(t, c, pl)
	old := storageClass(t, c, "e-fast")
	old.Annotations = map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}
	if err := c.Update(ctx, old, client.FieldOwner("cluster-admin")); err != nil {
		t.Fatal(err)
	}

	update(t, c, pl, func(pl *policyv1.Placement) {
		pl.Spec.Filesystem.FSType = "ext4"
		pl.Spec.StorageClass.AllowVolumeExpansion = true
	})
	waitCondition(t, c, pl, meta.StalledCondition, "True", policy.ReasonReplacementRequired)
	if err := contains(conditions.GetMessage(pl, meta.ReadyCondition), `parameters.csi.storage.k8s.io/fstype: "xfs" → "ext4"`, "replacement is Never"); err != nil {
		t.Error(err)
	}
	eventually(t, 10*time.Second, "allowVolumeExpansion patched in place", func() error {
		sc := storageClass(t, c, "e-fast")
		if sc.UID != old.UID || sc.Parameters[policyv1.ParamFSType] != "xfs" || !*sc.AllowVolumeExpansion {
			return fmt.Errorf("class %s uid %s fsType %s expand %v", sc.Name, sc.UID, sc.Parameters[policyv1.ParamFSType], *sc.AllowVolumeExpansion)
		}
		return nil
	})

	claim := pvc(t, c, "e-claim", "e-fast")
	update(t, c, pl, func(pl *policyv1.Placement) { pl.Spec.StorageClass.Replacement = policyv1.ReplacementIfUnused })
	eventually(t, 30*time.Second, "ReplacementRequired while in use under IfUnused", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pl), pl); err != nil {
			return err
		}
		if r := conditions.GetReason(pl, meta.ReadyCondition); r != policy.ReasonReplacementRequired {
			return fmt.Errorf("reason %s", r)
		}
		return contains(conditions.GetMessage(pl, meta.ReadyCondition), "IfUnused", "in use by 1 PVCs")
	})
	if sc := storageClass(t, c, "e-fast"); sc.UID != old.UID {
		t.Fatal("class replaced while in use under IfUnused")
	}

	deletePVC(t, c, claim)
	waitReady(t, c, pl)
	sc := storageClass(t, c, "e-fast")
	if sc.UID == old.UID || sc.Parameters[policyv1.ParamFSType] != "ext4" || sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
		t.Errorf("replacement: uid %s (old %s) params %v annotations %v", sc.UID, old.UID, sc.Parameters, sc.Annotations)
	}
	// The next reconciles keep it: no drift, no removal of the preserved annotation.
	waitCondition(t, c, pl, policy.DriftedCondition, "False", policy.ReasonNoDrift)
	if sc := storageClass(t, c, "e-fast"); sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
		t.Errorf("default-class annotation lost after the replacement: %v", sc.Annotations)
	}
	deleteAll(t, c, pl, p, proto)
	gone(t, c, &policyv1.Placement{}, "efast")
}

// TestFluxRevision: a policy object applied by Flux (kustomize-controller's labels) records
// its Kustomization's revision in status.lastAppliedRevision.
func TestFluxRevision(t *testing.T) {
	c := env(t)
	ks := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
		"metadata": map[string]any{"name": "storage", "namespace": namespace},
		"spec":     map[string]any{"path": "./policies"},
		"status":   map[string]any{"lastAppliedRevision": "main@sha1:0123456789abcdef0123456789abcdef01234567"},
	}}
	create(t, c, ks)
	node(t, c, "f1", map[string]string{"plinth.dev/storage": "f"})
	p, proto, pl := pool("fpool", "f", ""), localProtocol("flocal"), placement("ffast", "fpool", "flocal", "f-fast")
	pl.Labels = map[string]string{"kustomize.toolkit.fluxcd.io/name": "storage", "kustomize.toolkit.fluxcd.io/namespace": namespace}
	create(t, c, p, proto, pl)
	startController(t)
	waitReady(t, c, pl)
	if pl.Status.LastAppliedRevision != "main@sha1:0123456789abcdef0123456789abcdef01234567" {
		t.Errorf("lastAppliedRevision = %q (Ready: %s)", pl.Status.LastAppliedRevision, conditions.GetMessage(pl, meta.ReadyCondition))
	}
	if p.Status.LastAppliedRevision != "" {
		t.Errorf("pool without sync labels has revision %q", p.Status.LastAppliedRevision)
	}
	deleteAll(t, c, pl, p, proto, ks)
	gone(t, c, &policyv1.Placement{}, "ffast")
}

// TestFluxRefusedRevision: when Flux refused a newer revision (its dry-run failed), the policy
// objects it applied say the revision actually applied, never the refused one, and Synced=False
// names both; once Flux applies the newer revision, they follow it.
func TestFluxRefusedRevision(t *testing.T) {
	c := env(t)
	const r1, r2 = "main@sha1:1111111111111111111111111111111111111111", "main@sha1:2222222222222222222222222222222222222222"
	ks := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
		"metadata": map[string]any{"name": "refusing", "namespace": namespace},
		"spec":     map[string]any{"path": "./policies"},
		"status": map[string]any{"lastAppliedRevision": r1, "lastAttemptedRevision": r2, "conditions": []any{map[string]any{
			"type": "Ready", "status": "False", "reason": "ReconciliationFailed", "lastTransitionTime": "2026-01-01T00:00:00Z",
			"message": `Placement/rfast dry-run failed: .spec.storageClass.reclaimPolcy: field not declared in schema`,
		}}},
	}}
	create(t, c, ks)
	node(t, c, "r1", map[string]string{"plinth.dev/storage": "r"})
	p, proto, pl := pool("rpool", "r", ""), localProtocol("rlocal"), placement("rfast", "rpool", "rlocal", "r-fast")
	flux := map[string]string{"kustomize.toolkit.fluxcd.io/name": "refusing", "kustomize.toolkit.fluxcd.io/namespace": namespace}
	pl.Labels, p.Labels = flux, flux
	create(t, c, p, proto, pl)
	startController(t)
	for _, obj := range []client.Object{pl, p} {
		waitReady(t, c, obj)
		waitCondition(t, c, obj, policy.SyncedCondition, "False", policy.ReasonRevisionRefused)
	}
	if pl.Status.LastAppliedRevision != r1 || p.Status.LastAppliedRevision != r1 {
		t.Errorf("lastAppliedRevision %q and %q, want the applied %s (not the refused %s)", pl.Status.LastAppliedRevision, p.Status.LastAppliedRevision, r1, r2)
	}
	if err := contains(conditions.GetMessage(pl, meta.ReadyCondition), "revision "+r1); err != nil {
		t.Error(err)
	}
	if strings.Contains(conditions.GetMessage(pl, meta.ReadyCondition), r2) {
		t.Errorf("Ready cites the refused revision: %s", conditions.GetMessage(pl, meta.ReadyCondition))
	}
	if err := contains(conditions.GetMessage(pl, policy.SyncedCondition), "revision "+r1+" is applied", "newer revision "+r2+" was not",
		"Flux Kustomization "+namespace+"/refusing", "reclaimPolcy"); err != nil {
		t.Error(err)
	}
	var m dto.Metric
	if err := policy.PolicyCondition.WithLabelValues("Placement", "rfast", policy.SyncedCondition, "False").Write(&m); err != nil || m.GetGauge().GetValue() != 1 {
		t.Errorf("plinth_policy_condition{type=Synced,status=False} of Placement rfast: %v %v, want 1 (what alerts read)", m.GetGauge().GetValue(), err)
	}
	for _, other := range []string{"True", "Unknown"} {
		if err := policy.PolicyCondition.WithLabelValues("Placement", "rfast", policy.SyncedCondition, other).Write(&m); err != nil || m.GetGauge().GetValue() != 0 {
			t.Errorf("plinth_policy_condition{type=Synced,status=%s} of Placement rfast: %v %v, want 0 (a series, as kube-state-metrics exports the statuses not held)", other, m.GetGauge().GetValue(), err)
		}
	}
	if conditions.Get(proto, policy.SyncedCondition) != nil {
		t.Errorf("Protocol applied by no sync tool has Synced: %+v", conditions.Get(proto, policy.SyncedCondition))
	}

	// Flux applies r2: a status write on the Kustomization, then any event on the set.
	update(t, c, ks, func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, r2, "status", "lastAppliedRevision")
		_ = unstructured.SetNestedSlice(u.Object, []any{map[string]any{"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded",
			"lastTransitionTime": "2026-01-01T00:01:00Z", "message": "Applied revision: " + r2}}, "status", "conditions")
	})
	update(t, c, pl, func(pl *policyv1.Placement) { pl.Annotations = map[string]string{"touched": "1"} })
	waitCondition(t, c, pl, policy.SyncedCondition, "True", policy.ReasonRevisionApplied)
	if pl.Status.LastAppliedRevision != r2 {
		t.Errorf("lastAppliedRevision %q after Flux applied %s", pl.Status.LastAppliedRevision, r2)
	}
	deleteAll(t, c, pl, p, proto, ks)
	gone(t, c, &policyv1.Placement{}, "rfast")
}

// TestStoreWithVolumesDrains: a node losing its pool label does not delete a Store that still
// holds volumes: the Store and its Agent are kept and the Store is marked draining; once the
// last VolumeState is gone, both are pruned.
func TestStoreWithVolumesDrains(t *testing.T) {
	c := env(t)
	node(t, c, "g1", map[string]string{"plinth.dev/storage": "g"})
	p, proto, pl := pool("gpool", "g", ""), localProtocol("glocal"), placement("gfast", "gpool", "glocal", "g-fast")
	create(t, c, p, proto, pl)
	startController(t)
	waitReady(t, c, p)
	var st storev1.Store
	exists(t, c, &st, "gpool.g1")
	vol := &storev1.VolumeState{
		ObjectMeta: metav1.ObjectMeta{Name: storev1.VolumeID("pvc-g"), Labels: map[string]string{policyv1.LabelPool: "gpool", policyv1.LabelNode: "g1"}},
		Spec: storev1.VolumeStateSpec{CSIName: "pvc-g", StoreName: "gpool.g1", CapacityBytes: 1 << 30, VolumeMode: "Filesystem",
			Policy: storev1.FrozenPolicy{Placement: "gfast", Pool: "gpool", Protocol: "glocal", Backend: p.Spec.Backend, ProtocolSpec: proto.Spec}},
	}
	create(t, c, vol)

	update(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "g1"}}, func(n *corev1.Node) { n.Labels["plinth.dev/storage"] = "none" })
	eventually(t, 30*time.Second, "Store marked draining", func() error {
		if err := c.Get(ctx, types.NamespacedName{Name: "gpool.g1"}, &st); err != nil {
			return err
		}
		if st.Annotations[policy.AnnotationDraining] != "true" {
			return fmt.Errorf("annotations %v", st.Annotations)
		}
		return nil
	})
	waitReady(t, c, p)
	if *p.Status.MatchedNodes != 0 {
		t.Errorf("matchedNodes %d", *p.Status.MatchedNodes)
	}
	storageClass(t, c, "g-fast")
	if err := c.Get(ctx, types.NamespacedName{Name: "g1"}, &storev1.Agent{}); err != nil {
		t.Errorf("Agent of a draining Store pruned: %v", err)
	}

	deleteAll(t, c, vol)
	gone(t, c, &storev1.Store{}, "gpool.g1")
	gone(t, c, &storev1.Agent{}, "g1")
	deleteAll(t, c, pl, p, proto)
	gone(t, c, &policyv1.Placement{}, "gfast")
}

// TestReplacementWaitsForOldObject: the old StorageClass is still present after its
// delete (a finalizer holds it terminating — the real API server's way of "the first Get after
// Delete still returns the object"). The replacement is then a retryable wait reported as
// ReplacementInProgress, not an error and not a second object; once the old class goes, the
// new one is created with the new parameters.
func TestReplacementWaitsForOldObject(t *testing.T) {
	c := env(t)
	const hold = "test.plinth.dev/hold"
	node(t, c, "h1", map[string]string{"plinth.dev/storage": "h"})
	p, proto, pl := pool("hpool", "h", ""), localProtocol("hlocal"), placement("hfast", "hpool", "hlocal", "h-fast")
	pl.Spec.Filesystem.FSType = "xfs"
	pl.Spec.StorageClass.Replacement = policyv1.ReplacementAlways
	create(t, c, p, proto, pl)
	startController(t)
	waitReady(t, c, pl)
	old := storageClass(t, c, "h-fast")
	old.Finalizers = append(old.Finalizers, hold)
	if err := c.Update(ctx, old, client.FieldOwner("test")); err != nil {
		t.Fatal(err)
	}

	update(t, c, pl, func(pl *policyv1.Placement) { pl.Spec.Filesystem.FSType = "ext4" })
	waitCondition(t, c, pl, meta.ReadyCondition, "False", policy.ReasonReplacementInProgress)
	if err := contains(conditions.GetMessage(pl, meta.ReadyCondition), "waiting for the old object to go"); err != nil {
		t.Error(err)
	}
	if conditions.IsTrue(pl, meta.StalledCondition) {
		t.Errorf("Stalled while waiting for the old class: %s", conditions.GetMessage(pl, meta.StalledCondition))
	}
	sc := storageClass(t, c, "h-fast")
	if sc.UID != old.UID || sc.DeletionTimestamp == nil || sc.Parameters[policyv1.ParamFSType] != "xfs" {
		t.Fatalf("while held: uid %s (old %s) deleting %v fsType %s", sc.UID, old.UID, sc.DeletionTimestamp, sc.Parameters[policyv1.ParamFSType])
	}

	sc.Finalizers = nil
	if err := c.Update(ctx, sc, client.FieldOwner("test")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, c, pl)
	sc = storageClass(t, c, "h-fast")
	if sc.UID == old.UID || sc.Parameters[policyv1.ParamFSType] != "ext4" {
		t.Errorf("after the old class went: uid %s (old %s) fsType %s", sc.UID, old.UID, sc.Parameters[policyv1.ParamFSType])
	}
	deleteAll(t, c, pl, p, proto)
	gone(t, c, &policyv1.Placement{}, "hfast")
}

// TestPruneInUseForced (the explicit override): an operator sets plinth.dev/prune: force
// on a StorageClass PVCs use; when its Placement leaves Git the class is deleted anyway, the
// Placement's finalizer is released, and a PrunedInUse warning says that existing PVs keep
// working while expansion and the Pending PVCs will fail.
func TestPruneInUseForced(t *testing.T) {
	c := env(t)
	node(t, c, "k1", map[string]string{"plinth.dev/storage": "k"})
	p, proto, pl := pool("kpool", "k", ""), localProtocol("klocal"), placement("kforce", "kpool", "klocal", "k-force")
	create(t, c, p, proto, pl)
	startController(t)
	waitReady(t, c, pl)
	claims := []*corev1.PersistentVolumeClaim{pvc(t, c, "k-claim-1", "k-force"), pvc(t, c, "k-claim-2", "k-force")}
	sc := storageClass(t, c, "k-force")
	sc.Annotations = map[string]string{policy.AnnotationPrune: policy.PruneValueForce}
	if err := c.Update(ctx, sc); err != nil {
		t.Fatal(err)
	}

	deleteAll(t, c, pl)
	gone(t, c, &storagev1.StorageClass{}, "k-force")
	gone(t, c, &policyv1.Placement{}, "kforce")
	eventually(t, 30*time.Second, "PrunedInUse event on the StorageClass", func() error {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Regarding.Kind == "StorageClass" && ev.Regarding.Name == "k-force" && ev.Reason == policy.ReasonPrunedInUse {
				return contains(ev.Note, "in use by 2 PVCs", "existing PVs keep working", "expansion of its PVCs will fail", "2 Pending PVCs")
			}
		}
		return fmt.Errorf("no %s event among %d", policy.ReasonPrunedInUse, len(evs.Items))
	})
	waitInventory(t, c, "drops the force-pruned class", func(inv string) error { return lacks(inv, "k-force") })
	for _, cl := range claims {
		deletePVC(t, c, cl)
	}
	deleteAll(t, c, p, proto)
	gone(t, c, &storev1.Store{}, "kpool.k1")
}
