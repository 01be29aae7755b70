package policy

import (
	"context"
	"testing"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/plinth-storage/plinth/controllers/plan"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestRecordEvents: the handler SetupWithManager puts on the rendered kinds records every event
// in the plan's Events — also an update its predicates keep out of the queue (an Agent's
// labels edited by hand: no new generation) — and enqueues only what the predicates pass.
func TestRecordEvents(t *testing.T) {
	r := &Reconciler{}
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{}}
	})
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	agent := func(gen int64, labels map[string]string) *storev1.Agent {
		a := &storev1.Agent{}
		a.Name, a.Generation, a.Labels = "n1", gen, labels
		return a
	}
	ours := map[string]string{policyv1.LabelManagedBy: "plinth"}
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		old, new *storev1.Agent
		queued   int
	}{
		{"labels edited by hand", agent(1, ours), agent(1, map[string]string{policyv1.LabelManagedBy: "plinth", "x": "y"}), 0},
		{"spec changed", agent(1, ours), agent(2, ours), 1},
		{"not Plinth's", agent(1, nil), agent(2, nil), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.kept.Events = plan.NewEvents("Agent")
			h := r.recordEvents("Agent", one, managedByPlinth{}, predicate.GenerationChangedPredicate{})
			before := q.Len()
			h.Update(ctx, event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}, q)
			if n := r.kept.Events.Len(); n != 1 {
				t.Errorf("Events holds %d objects, want the Agent", n)
			}
			if got := q.Len() - before; got != tc.queued {
				t.Errorf("enqueued %d, want %d", got, tc.queued)
			}
			for q.Len() > 0 {
				item, _ := q.Get()
				q.Done(item)
				q.Forget(item)
			}
		})
	}
}
