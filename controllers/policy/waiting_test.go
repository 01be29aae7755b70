package policy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/policy"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestReferenceArrivingLaterWaitsQuietly: a Placement committed together with its pool and
// protocol can reach the API server before them. While they are missing nothing is applied and
// the status says why, but the wait is announced as a normal DependencyNotReady event, never
// a warning; once they arrive the set is applied.
func TestReferenceArrivingLaterWaitsQuietly(t *testing.T) {
	c := env(t)
	node(t, c, "w1", map[string]string{"plinth.dev/storage": "w"})
	startController(t)
	pl := placement("wfast", "wpool", "wlocal", "w-fast")
	create(t, c, pl)
	waitCondition(t, c, pl, meta.ReadyCondition, "False", policy.ReasonInvalidPolicy)
	placementEvents := func() ([]eventsv1.Event, error) {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
			return nil, err
		}
		var out []eventsv1.Event
		for _, ev := range evs.Items {
			if ev.Regarding.Kind == "Placement" && ev.Regarding.Name == "wfast" {
				out = append(out, ev)
			}
		}
		return out, nil
	}
	eventually(t, 30*time.Second, "a DependencyNotReady event on Placement wfast", func() error {
		evs, err := placementEvents()
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if ev.Reason == meta.DependencyNotReadyReason {
				return contains(ev.Note, "StoragePool/wpool", "Protocol/wlocal")
			}
		}
		return fmt.Errorf("no %s event among %d", meta.DependencyNotReadyReason, len(evs))
	})

	p, proto := pool("wpool", "w", ""), localProtocol("wlocal")
	create(t, c, p, proto)
	waitReady(t, c, pl)
	evs, err := placementEvents()
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == corev1.EventTypeWarning {
			t.Errorf("warning while the references arrived: %s: %s", ev.Reason, ev.Note)
		}
	}
	deleteAll(t, c, pl, p, proto)
	gone(t, c, &policyv1.Placement{}, "wfast")
	gone(t, c, &storev1.Store{}, "wpool.w1")
}
