// Package liveness marks the Agent and the Stores of a node whose agent cannot answer: its
// Node object was deleted, or its heartbeat (Agent status.lastHeartbeatTime) is older than
// SilentAfter. It sets Ready=False with reason NodeDeleted or AgentSilent and a message that
// says since when; the agent's own next report replaces the condition, so a node that comes
// back clears it without this package. It never deletes anything.
package liveness

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// DefaultSilentAfter is how old a heartbeat may be before the agent counts as silent: four of
// the agent's default 30 s refreshes (the CSI controller uses the same threshold).
const DefaultSilentAfter = 2 * time.Minute

// Its RBAC (agents/status and stores/status: get, patch) is declared with the controller's in
// controllers/policy, which runs it.

// Reconciler is the liveness controller; one reconcile per Agent (named after its node).
type Reconciler struct {
	Client client.Client
	// SilentAfter defaults to DefaultSilentAfter.
	SilentAfter time.Duration
	// Now defaults to time.Now.
	Now func() time.Time
	// SkipNameValidation lets tests start several managers in one process.
	SkipNameValidation bool
}

// SetupWithManager registers the reconciler: Agents, and Nodes mapped to the Agent of the
// same name (a deleted Node wakes its Agent at once).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("liveness").
		WithOptions(controller.Options{SkipNameValidation: &r.SkipNameValidation}).
		For(&storev1.Agent{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: o.GetName()}}}
		})).
		Complete(r)
}

// Verdict is what Decide says of one node.
type Verdict struct {
	// Reason is storev1.ReasonNodeDeleted, storev1.ReasonAgentSilent or "" (the agent may answer).
	Reason  string
	Message string
	// RecheckAfter is when a node that may answer would turn silent (0: no recheck needed).
	RecheckAfter time.Duration
}

// Decide judges a node from whether its Node exists and from the Agent's heartbeat (nil
// before the first report: not judged silent, the agent may still be starting).
func Decide(node string, nodeExists bool, heartbeat *metav1.Time, now time.Time, silentAfter time.Duration) Verdict {
	if !nodeExists {
		return Verdict{Reason: storev1.ReasonNodeDeleted, Message: fmt.Sprintf("node %s no longer exists: its agent will not report again", node)}
	}
	if heartbeat == nil {
		return Verdict{}
	}
	age := now.Sub(heartbeat.Time)
	if age > silentAfter {
		return Verdict{Reason: storev1.ReasonAgentSilent, Message: fmt.Sprintf("the agent of node %s has not reported since %s (more than %s)",
			node, heartbeat.UTC().Format(time.RFC3339), silentAfter)}
	}
	return Verdict{RecheckAfter: silentAfter - age + time.Second}
}

// Reconcile marks the Agent req.Name and its node's Stores when the node's agent cannot answer.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var a storev1.Agent
	if err := r.Client.Get(ctx, req.NamespacedName, &a); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	nodeName := a.Spec.NodeName
	if nodeName == "" {
		nodeName = a.Name
	}
	var n corev1.Node
	err := r.Client.Get(ctx, client.ObjectKey{Name: nodeName}, &n)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	silentAfter, now := r.SilentAfter, time.Now
	if silentAfter <= 0 {
		silentAfter = DefaultSilentAfter
	}
	if r.Now != nil {
		now = r.Now
	}
	v := Decide(nodeName, err == nil, a.Status.LastHeartbeatTime, now(), silentAfter)
	if v.Reason == "" {
		return ctrl.Result{RequeueAfter: v.RecheckAfter}, nil
	}
	if err := r.mark(ctx, &a, &a.Status.Conditions, a.Generation, v); err != nil {
		return ctrl.Result{}, err
	}
	var stores storev1.StoreList
	if err := r.Client.List(ctx, &stores, client.MatchingLabels{policyv1.LabelNode: storev1.NameLabelValue(nodeName)}); err != nil {
		return ctrl.Result{}, err
	}
	for i := range stores.Items {
		s := &stores.Items[i]
		if s.Spec.NodeName != nodeName {
			continue
		}
		if err := r.mark(ctx, s, &s.Status.Conditions, s.Generation, v); err != nil {
			return ctrl.Result{}, err
		}
	}
	ctrl.LoggerFrom(ctx).V(1).Info("node cannot answer", "node", nodeName, "reason", v.Reason, "stores", len(stores.Items))
	// a new heartbeat or the Node's return arrives as an event: no periodic recheck
	return ctrl.Result{}, nil
}

// mark sets Ready=False with the verdict on obj when it does not say so yet; the patch carries
// the resourceVersion, so it never overwrites a report the agent made meanwhile.
func (r *Reconciler) mark(ctx context.Context, obj client.Object, conds *[]metav1.Condition, gen int64, v Verdict) error {
	if c := apimeta.FindStatusCondition(*conds, storev1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse && c.Reason == v.Reason {
		return nil
	}
	before := obj.DeepCopyObject().(client.Object)
	apimeta.SetStatusCondition(conds, metav1.Condition{Type: storev1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: v.Reason, Message: v.Message, ObservedGeneration: gen})
	err := r.Client.Status().Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mark %s %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), v.Reason, err)
	}
	return nil
}
