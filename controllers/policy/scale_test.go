package policy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestScaleThousandObjects renders 1,001 objects (500 nodes: 500 Stores, 500 Agents, one
// StorageClass) and proves that the first apply writes each of them once (one server-side
// apply per object: no create-then-update, no status write of the rendered kinds) and that a
// no-op reconcile makes zero writes; it logs (SCALE lines) the time to apply them all, the
// no-op reconcile's duration, and the time to apply 1,000 changed objects (every Store and
// every Agent). Durations are reported, never asserted.
func TestScaleThousandObjects(t *testing.T) {
	c := env(t)
	if testing.Short() {
		t.Skip("-short: the 1,000-object run takes a minute on a loaded machine")
	}
	const nodes = 500
	for i := 0; i < nodes; i++ {
		node(t, c, fmt.Sprintf("s%03d", i), map[string]string{"plinth.dev/storage": "scale"})
	}
	p := pool("spool", "scale", "")
	proto := &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: "snvme"},
		Spec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "10.20.0.0/16"}}}
	pl := placement("sfast", "spool", "snvme", "s-fast")
	start := time.Now()
	create(t, c, p, proto, pl)
	// Started once the three exist, so its first reconcile renders the whole set and the
	// counts below are those of one apply of it (a set reconciled while it arrives one object
	// at a time is applied in parts).
	ctl := startController(t)
	waitReadyLong(t, c, p, 5*time.Minute)
	t.Logf("SCALE: applied %d new objects in %s", 2*nodes+1, time.Since(start).Round(time.Millisecond))

	settle(t)
	w0, log := ctl.writes.writes()
	applies := writesByKind(log, "patch")
	if applies["Store"] != nodes || applies["Agent"] != nodes || applies["StorageClass"] != 1 {
		t.Errorf("first apply: %d Store, %d Agent, %d StorageClass writes; want %d, %d, 1 (one per object)",
			applies["Store"], applies["Agent"], applies["StorageClass"], nodes, nodes)
	}
	for _, verb := range []string{"create", "update", "status-update", "status-patch"} {
		for _, kind := range []string{"Store", "Agent", "StorageClass"} {
			if n := writesByKind(log, verb)[kind]; n > 0 {
				t.Errorf("first apply: %d %s writes of %s objects; want none (one apply each)", n, verb, kind)
			}
		}
	}
	start = time.Now()
	if _, err := ctl.r.Reconcile(ctx, ctrl.Request{}); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	w1, log := ctl.writes.writes()
	n, log := w1-w0, log[w0:]
	t.Logf("SCALE: no-op reconcile of %d objects: %s, %d writes", 2*nodes+1, elapsed.Round(time.Millisecond), n)
	if n != 0 {
		t.Errorf("no-op reconcile made %d writes: %v", n, log[:min(len(log), 10)])
	}

	// Every Store (reserve) and every Agent (NVMe-oF port) changes.
	before, _ := ctl.writes.writes()
	start = time.Now()
	update(t, c, p, func(p *policyv1.StoragePool) { p.Spec.Reserve = "1Gi" })
	update(t, c, proto, func(p *policyv1.Protocol) { p.Spec.NVMeoFTCP.Port = 4421 })
	eventually(t, 5*time.Minute, "all Stores and Agents updated", func() error {
		var stores storev1.StoreList
		var agents storev1.AgentList
		if err := c.List(ctx, &stores, client.MatchingLabels{policyv1.LabelPool: "spool"}); err != nil {
			return err
		}
		if err := c.List(ctx, &agents); err != nil {
			return err
		}
		for _, s := range stores.Items {
			if s.Spec.Reserve != "1Gi" {
				return fmt.Errorf("Store %s reserve %q", s.Name, s.Spec.Reserve)
			}
		}
		for _, a := range agents.Items {
			if a.Spec.NVMeoF != nil && a.Spec.NVMeoF.Port != 4421 {
				return fmt.Errorf("Agent %s port %d", a.Name, a.Spec.NVMeoF.Port)
			}
		}
		return nil
	})
	waitReadyLong(t, c, p, time.Minute)
	after, _ := ctl.writes.writes()
	t.Logf("SCALE: applied %d changed objects in %s (%d writes including status and inventory)", 2*nodes, time.Since(start).Round(time.Millisecond), after-before)

	start = time.Now()
	deleteAll(t, c, pl, p, proto)
	// Every Store and every Agent: the Agents go after the Stores, and a test that returned
	// with Agents left would hand their pruning (client-side throttled) to the next test's
	// controller, whose first reconcile then waits behind it.
	eventually(t, 5*time.Minute, "all Stores and Agents pruned", func() error {
		var stores storev1.StoreList
		if err := c.List(ctx, &stores, client.MatchingLabels{policyv1.LabelPool: "spool"}); err != nil {
			return err
		}
		var agents storev1.AgentList
		if err := c.List(ctx, &agents); err != nil {
			return err
		}
		left := 0
		for _, a := range agents.Items {
			var i int
			if n, err := fmt.Sscanf(a.Name, "s%03d", &i); err == nil && n == 1 && a.Name == fmt.Sprintf("s%03d", i) && i < nodes {
				left++
			}
		}
		if len(stores.Items) > 0 || left > 0 {
			return fmt.Errorf("%d Stores and %d Agents left", len(stores.Items), left)
		}
		return nil
	})
	t.Logf("SCALE: pruned %d objects in %s", 2*nodes+1, time.Since(start).Round(time.Millisecond))
}

func waitReadyLong(t *testing.T, c client.Client, obj client.Object, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, obj.GetName()+" Ready", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		p := obj.(*policyv1.StoragePool)
		for _, cond := range p.Status.Conditions {
			if cond.Type == meta.ReadyCondition && cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == p.Generation {
				return nil
			}
		}
		return fmt.Errorf("not ready: %+v", p.Status.Conditions)
	})
}
