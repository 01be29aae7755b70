package liveness_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/plinth-storage/plinth/controllers/liveness"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/crdtest"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) *metav1.Time { m := metav1.NewTime(now.Add(-ago)); return &m }
	for _, tc := range []struct {
		name      string
		exists    bool
		heartbeat *metav1.Time
		reason    string
		recheck   time.Duration
	}{
		{"node deleted", false, at(time.Second), storev1.ReasonNodeDeleted, 0},
		{"never reported", true, nil, "", 0},
		{"fresh", true, at(30 * time.Second), "", 91 * time.Second},
		{"at the threshold", true, at(2 * time.Minute), "", time.Second},
		{"silent", true, at(2*time.Minute + time.Second), storev1.ReasonAgentSilent, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := liveness.Decide("n", tc.exists, tc.heartbeat, now, liveness.DefaultSilentAfter)
			if v.Reason != tc.reason || v.RecheckAfter != tc.recheck {
				t.Errorf("%+v, want reason %q recheck %s", v, tc.reason, tc.recheck)
			}
		})
	}
}

func scheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, storev1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// On the real API server: the Agent and Store of a node whose agent is an hour silent, and of
// a node whose Node object is deleted, are marked Ready=False with the reason; a live node's
// are left alone; a mark is written once (a second reconcile changes nothing), and the agent's
// next report replaces it.
func TestMarksOnTheAPIServer(t *testing.T) {
	cp := crdtest.ControlPlane(t, controlplane.Options{})
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: scheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ready := metav1.Condition{Type: storev1.ConditionReady, Status: metav1.ConditionTrue, Reason: storev1.ReasonSucceeded, Message: "reported", LastTransitionTime: metav1.Now()}
	// report writes what an agent writes: a heartbeat ago in the past and Ready=True
	report := func(name string, ago time.Duration) {
		t.Helper()
		hb := metav1.NewTime(time.Now().Add(-ago))
		var a storev1.Agent
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &a); err != nil {
			t.Fatal(err)
		}
		a.Status.LastHeartbeatTime, a.Status.Conditions = &hb, []metav1.Condition{ready}
		if err := c.Status().Update(ctx, &a); err != nil {
			t.Fatal(err)
		}
		var s storev1.Store
		if err := c.Get(ctx, client.ObjectKey{Name: storev1.StoreName("p", name)}, &s); err != nil {
			t.Fatal(err)
		}
		s.Status.LastHeartbeatTime, s.Status.Conditions = &hb, []metav1.Condition{ready}
		if err := c.Status().Update(ctx, &s); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"live", "quiet", "gone"} {
		if n != "gone" {
			if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
				t.Fatal(err)
			}
		}
		a := &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: storev1.AgentSpec{NodeName: n, Stores: []string{storev1.StoreName("p", n)}}}
		s := &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: storev1.StoreName("p", n), Labels: map[string]string{policyv1.LabelNode: storev1.NameLabelValue(n)}},
			Spec: storev1.StoreSpec{Pool: "p", NodeName: n, Backend: policyv1.Backend{File: &policyv1.FileBackend{Directory: "/x"}}}}
		for _, o := range []client.Object{a, s} {
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	report("live", time.Second)
	report("quiet", time.Hour)
	report("gone", time.Second)

	r := &liveness.Reconciler{Client: c}
	reconcile := func(name string) ctrl.Result {
		t.Helper()
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: name}})
		if err != nil {
			t.Fatalf("reconcile %s: %v", name, err)
		}
		return res
	}
	readyOf := func(name string) (agentC, storeC *metav1.Condition, agentRV, storeRV string) {
		t.Helper()
		var a storev1.Agent
		var s storev1.Store
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &a); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKey{Name: storev1.StoreName("p", name)}, &s); err != nil {
			t.Fatal(err)
		}
		return apimeta.FindStatusCondition(a.Status.Conditions, storev1.ConditionReady), apimeta.FindStatusCondition(s.Status.Conditions, storev1.ConditionReady),
			a.ResourceVersion, s.ResourceVersion
	}

	if res := reconcile("live"); res.RequeueAfter <= 0 || res.RequeueAfter > liveness.DefaultSilentAfter+time.Second {
		t.Errorf("live node: requeue after %s, want a recheck before it would turn silent", res.RequeueAfter)
	}
	if a, s, _, _ := readyOf("live"); a.Status != metav1.ConditionTrue || s.Status != metav1.ConditionTrue {
		t.Errorf("live node marked: %+v %+v", a, s)
	}
	for name, reason := range map[string]string{"quiet": storev1.ReasonAgentSilent, "gone": storev1.ReasonNodeDeleted} {
		if res := reconcile(name); res.RequeueAfter != 0 {
			t.Errorf("%s: requeue after %s, want none (events bring the change)", name, res.RequeueAfter)
		}
		a, s, arv, srv := readyOf(name)
		for _, cond := range []*metav1.Condition{a, s} {
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != reason {
				t.Errorf("%s: Ready %+v, want False %s", name, cond, reason)
			}
		}
		reconcile(name)
		if _, _, arv2, srv2 := readyOf(name); arv2 != arv || srv2 != srv {
			t.Errorf("%s: a second reconcile wrote again (resourceVersions %s→%s, %s→%s)", name, arv, arv2, srv, srv2)
		}
	}
	// the agent of "quiet" reports again: its own Ready replaces the mark, and stays
	report("quiet", 0)
	reconcile("quiet")
	if a, s, _, _ := readyOf("quiet"); a.Status != metav1.ConditionTrue || s.Status != metav1.ConditionTrue {
		t.Errorf("quiet node after a fresh report: %+v %+v", a, s)
	}

	// wired to a manager: deleting the live node's Node marks its Agent without waiting for a recheck
	mgr, err := ctrl.NewManager(cp.Admin.Config, ctrl.Options{Scheme: scheme(t), Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&liveness.Reconciler{Client: mgr.GetClient(), SilentAfter: time.Hour, SkipNameValidation: true}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() { cancel(); <-done }()
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "live"}}); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, 30*time.Second, 50*time.Millisecond, "live node's Agent marked NodeDeleted", func() error {
		a, s, _, _ := readyOf("live")
		if a.Reason != storev1.ReasonNodeDeleted || s.Reason != storev1.ReasonNodeDeleted {
			return errNotYet
		}
		return nil
	})
}

type notYet struct{}

func (notYet) Error() string { return "not marked yet" }

var errNotYet error = notYet{}
