package policy

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/runtime/conditions"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func store(name, pool string, capacity *storev1.Capacity, ready bool) storev1.Store {
	s := storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storev1.StoreSpec{Pool: pool}}
	s.Status.Capacity = capacity
	if ready {
		conditions.MarkTrue(&s, "Ready", "Ok", "ok")
	}
	return s
}

func TestSetPoolStatus(t *testing.T) {
	pool := &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 2}}
	out := &render.Output{Stores: []storev1.Store{store("p.a", "p", nil, false), store("p.b", "p", nil, false), store("q.a", "q", nil, false)}}

	setPoolStatus(pool, indexPoolStores(out, nil))
	if *pool.Status.MatchedNodes != 2 || conditions.GetReason(pool, StoresReadyCondition) != ReasonStoresUnknown {
		t.Fatalf("before agents: %+v", pool.Status)
	}
	live := []storev1.Store{
		store("p.a", "p", &storev1.Capacity{Total: 100, Allocatable: 90, Provisioned: 10, Available: 80}, true),
		store("p.b", "p", &storev1.Capacity{Total: 50, Allocatable: 50, Available: 50}, false),
		store("q.a", "q", &storev1.Capacity{Total: 1000, Available: 1000}, true), // another pool's
	}
	setPoolStatus(pool, indexPoolStores(out, live))
	c := pool.Status.Capacity
	if c.Total != 150 || c.Allocatable != 140 || c.Provisioned != 10 || c.Available != 130 || c.ReportingStores != 2 {
		t.Fatalf("capacity %+v", c)
	}
	if conditions.GetReason(pool, StoresReadyCondition) != ReasonStoresNotReady || !strings.Contains(conditions.GetMessage(pool, StoresReadyCondition), "1 of 2 Stores ready; not ready: p.b") {
		t.Fatalf("StoresReady: %+v", conditions.Get(pool, StoresReadyCondition))
	}
	live[1] = store("p.b", "p", live[1].Status.Capacity, true)
	setPoolStatus(pool, indexPoolStores(out, live))
	if !conditions.IsTrue(pool, StoresReadyCondition) {
		t.Fatalf("StoresReady: %+v", conditions.Get(pool, StoresReadyCondition))
	}
}

func TestSetPoolStatusEvacuating(t *testing.T) {
	pool := &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	evac := store("p.a", "p", nil, true)
	evac.Spec.Evacuate = true
	out := &render.Output{Stores: []storev1.Store{evac, store("p.b", "p", nil, true)}}
	live := []storev1.Store{store("p.a", "p", &storev1.Capacity{Total: 100 << 30, Provisioned: 40 << 30}, true),
		store("p.b", "p", &storev1.Capacity{Total: 100 << 30, Provisioned: 1 << 30}, true)}

	setPoolStatus(pool, indexPoolStores(out, live))
	c := conditions.Get(pool, EvacuatingCondition)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonMovesNotExecuted ||
		!strings.Contains(c.Message, "1 Stores evacuated (p.a), holding 40Gi (1 of them reported)") ||
		!strings.Contains(c.Message, "not carried out yet") || !strings.Contains(c.Message, "nothing is moved or deleted") {
		t.Fatalf("Evacuating: %+v", c)
	}
	// once the move executor reported progress, the condition is its own
	conditions.MarkTrue(pool, EvacuatingCondition, "MovesInProgress", "1 of 3 volumes moved")
	setPoolStatus(pool, indexPoolStores(out, live))
	if c := conditions.Get(pool, EvacuatingCondition); c == nil || c.Reason != "MovesInProgress" || c.Message != "1 of 3 volumes moved" {
		t.Fatalf("the executor's Evacuating was overwritten: %+v", c)
	}
	out.Stores[0].Spec.Evacuate = false
	setPoolStatus(pool, indexPoolStores(out, live))
	if c := conditions.Get(pool, EvacuatingCondition); c != nil {
		t.Fatalf("Evacuating kept after the evacuation left the policy: %+v", c)
	}
}

func TestSetDriftedKeepsLastCorrection(t *testing.T) {
	pl := &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: "x", Generation: 1}}
	p := &policyObject{obj: pl, kind: "Placement", status: &pl.Status, setter: pl}
	setDrifted(p, []drift.Item{{Kind: "StorageClass", Name: "x", Fields: []string{"allowVolumeExpansion"}}}, nil)
	if !conditions.IsTrue(pl, DriftedCondition) || !strings.Contains(conditions.GetMessage(pl, DriftedCondition), "StorageClass/x: allowVolumeExpansion") {
		t.Fatalf("%+v", conditions.Get(pl, DriftedCondition))
	}
	setDrifted(p, nil, []drift.Item{{Kind: "StorageClass", Name: "x", Deleted: true}})
	setDrifted(p, nil, nil) // the reconcile after a correction finds nothing: keep saying what was corrected
	if c := conditions.Get(pl, DriftedCondition); c.Reason != ReasonDriftCorrected || c.Message != "corrected StorageClass/x deleted" {
		t.Fatalf("%+v", c)
	}
	pl.Generation = 2 // a new policy generation clears it
	setDrifted(p, nil, nil)
	if conditions.GetReason(pl, DriftedCondition) != ReasonNoDrift {
		t.Fatalf("%+v", conditions.Get(pl, DriftedCondition))
	}
}

func TestHeartbeatCollector(t *testing.T) {
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	beat := metav1.NewTime(now.Add(-42 * time.Second))
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		&storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: storev1.AgentSpec{NodeName: "n1"}, Status: storev1.AgentStatus{LastHeartbeatTime: &beat}},
		&storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "n2"}, Spec: storev1.AgentSpec{NodeName: "n2"}},
	).Build()
	col := &HeartbeatCollector{Reader: c, Now: func() time.Time { return now }}
	ch := make(chan prometheus.Metric, 10)
	col.Collect(ch)
	close(ch)
	var got []string
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		got = append(got, d.GetLabel()[0].GetValue()+"="+strconv.FormatFloat(d.GetGauge().GetValue(), 'f', -1, 64))
	}
	if strings.Join(got, ",") != "n1=42" {
		t.Fatalf("heartbeat ages %v (an agent that never reported is left out)", got)
	}
}
