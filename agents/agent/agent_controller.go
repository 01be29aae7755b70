package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/plinth-storage/plinth/internal/hostnqn"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Agent reasons (defined with the API types: see storev1 for when each surfaces).
const (
	ReasonMissingKernelModules = storev1.ReasonMissingKernelModules
	ReasonNoBindAddress        = storev1.ReasonNoBindAddress
	ReasonAuthUnsupported      = storev1.ReasonAuthUnsupported
)

type agentReconciler struct{ *node }

func (r *agentReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("agent").
		For(&storev1.Agent{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// the volume reconciler asks for a report when a host entry got other secrets
		WatchesRawSource(source.Channel(r.agentWake, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

// followHostKeys notices a key rotation (a Protocol's keyGeneration raised in Git: the
// controller replaced the host's master, docs/design.md#key-distribution) the way the node
// plugin does: at every report it asks Options.Keys (the key server) again for the keys of
// each host whose entry it wrote, and when one is served with another key id than the entry
// holds it wakes every VolumeState of the node whose protocol asks for DH-HMAC-CHAP, so that
// each writes the new secrets into the host entries (the agent has no watch on Secrets). A
// failed ask is logged and asked again at the next report.
func (r *agentReconciler) followHostKeys(ctx context.Context) {
	r.mu.Lock()
	entries := maps.Clone(r.hostKeys)
	r.mu.Unlock()
	rotated := ""
	for nqn, e := range entries {
		k, err := r.keys.HostKey(ctx, e.node, r.opts.NodeName)
		if err != nil {
			ctrl.LoggerFrom(ctx).V(1).Info("key rotation: ask for a host's keys; the next report asks again", "host", e.node, "error", err.Error())
			continue
		}
		if k.HostNQN == nqn && k.KeyID != "" && k.KeyID != e.keyID {
			rotated = e.node
			break
		}
	}
	if rotated == "" {
		return
	}
	var list storev1.VolumeStateList
	if err := r.client.List(ctx, &list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "list the node's volumes for a key rotation; the next report retries")
		return
	}
	n := 0
	for i := range list.Items {
		vs := &list.Items[i]
		if p := vs.Spec.Policy.ProtocolSpec.NVMeoFTCP; p == nil || !p.Auth.Enabled() || !vs.DeletionTimestamp.IsZero() {
			continue
		}
		select {
		case r.wake <- event.GenericEvent{Object: vs}:
			n++
		case <-ctx.Done():
			return
		}
	}
	ctrl.LoggerFrom(ctx).Info("DH-HMAC-CHAP keys rotated: writing the hosts' new keys", "host", rotated, "volumes", n)
}

// Reconcile publishes what the node has (host NQN, bind address, modules,
// backends, version) and a heartbeat, every RefreshInterval.
func (r *agentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var a storev1.Agent
	if err := r.client.Get(ctx, req.NamespacedName, &a); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if a.Name != r.opts.NodeName {
		return ctrl.Result{}, nil
	}
	before := a.DeepCopy()
	r.followHostKeys(ctx)
	ni := r.opts.probe()
	st := &a.Status
	st.ObservedGeneration = a.Generation
	st.HostNQN = ni.HostNQN
	if ni.HostNQN != "" {
		others, err := r.duplicateHostNQN(ctx, &a, before.Status.HostNQN == ni.HostNQN, ni.HostNQN)
		if err != nil {
			return ctrl.Result{}, err
		}
		if len(others) > 0 {
			st.HostNQN = "" // the registration is rejected: the first node keeps the NQN
		}
	} else {
		apimeta.RemoveStatusCondition(&st.Conditions, storev1.ConditionHostNQNConflict)
	}
	st.Version = r.opts.Version
	st.Capabilities = storev1.AgentCapabilities{Backends: ni.Backends, KernelModules: ni.Modules, NVMeAuth: ni.NVMeAuth, NVMeTLS: ni.NVMeTLS}
	st.HostKeys = r.reportedHostKeys()
	now := metav1.Now()
	st.LastHeartbeatTime = &now

	var blocking, notes []string
	var authStalled string
	reason := ReasonSucceeded
	needed := map[string]bool{}
	if a.Spec.NVMeoF != nil {
		needed["nvmet"], needed["nvmet_tcp"] = true, true
		addr, err := SelectAddress(a.Spec.NVMeoF.BindCIDR, r.opts.Addrs)
		if err != nil {
			blocking = append(blocking, err.Error())
			reason = ReasonNoBindAddress
		}
		st.Address = addr
		if a.Spec.NVMeoF.Auth && !slices.Contains(ni.NVMeAuth, storev1.CapabilityTarget) {
			// never a silent downgrade: the volumes asking for it are not exported
			authStalled = fmt.Sprintf("node %s: a Protocol asks for DH-HMAC-CHAP but the kernel has no NVMe target authentication (CONFIG_NVME_TARGET_AUTH; Linux 6.0 or newer built with it)", a.Name)
			blocking = append(blocking, authStalled)
			reason = ReasonAuthUnsupported
		}
	} else {
		st.Address = ""
	}
	var stores storev1.StoreList
	if err := r.client.List(ctx, &stores); err == nil {
		for _, s := range stores.Items {
			if s.Spec.Backend.LVM != nil && s.Spec.Backend.LVM.ThinPool != nil {
				needed["dm_thin_pool"] = true
			}
			if s.Spec.Backend.LVM != nil && s.Spec.Backend.LVM.Cache != nil && s.Spec.NodeName == r.opts.NodeName {
				needed["bcache"] = true
			}
		}
	}
	for _, m := range ni.Missing {
		if needed[m] {
			blocking = append(blocking, m+" not loaded")
			reason = ReasonMissingKernelModules
		} else {
			notes = append(notes, m+" not loaded")
		}
	}
	if ni.HostNQNError != "" {
		notes = append(notes, ni.HostNQNError)
	}
	if authStalled != "" {
		// a policy the node cannot serve: no retry helps until the kernel or the policy changes
		setCond(&st.Conditions, a.Generation, CondStalled, true, ReasonAuthUnsupported, authStalled)
	} else {
		apimeta.RemoveStatusCondition(&st.Conditions, CondStalled)
	}
	if c := apimeta.FindStatusCondition(st.Conditions, storev1.ConditionHostNQNConflict); c != nil {
		notes = append(notes, "host NQN not registered: "+c.Message)
	}
	if len(blocking) > 0 {
		setCond(&st.Conditions, a.Generation, CondReady, false, reason, strings.Join(append(blocking, notes...), "; "))
	} else {
		msg := fmt.Sprintf("backends %v, modules %v", ni.Backends, ni.Modules)
		if len(notes) > 0 {
			msg += "; " + strings.Join(notes, "; ")
		}
		setCond(&st.Conditions, a.Generation, CondReady, true, ReasonSucceeded, msg)
	}
	if err := r.client.Status().Patch(ctx, &a, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil
}

// duplicateHostNQN applies the rule of internal/hostnqn to the node's host NQN: the other nodes
// that present nqn (another Agent's status.hostNQN, another Node's plinth.dev/host-nqn written
// by its node plugin), read uncached, and whether this node's registration is rejected. It
// returns those nodes when it is (nil otherwise) and keeps the HostNQNConflict condition and a
// Warning event on the Agent, naming both nodes. holds says whether the Agent had nqn
// registered already. The check runs when the NQN this process registers changes and while a
// conflict stands (so it clears once an operator fixed the duplicate), not at every heartbeat:
// a node that joins later with the same NQN is the one whose registration is rejected.
func (r *agentReconciler) duplicateHostNQN(ctx context.Context, a *storev1.Agent, holds bool, nqn string) ([]string, error) {
	conflict := apimeta.FindStatusCondition(a.Status.Conditions, storev1.ConditionHostNQNConflict)
	r.mu.Lock()
	checked := r.nqnChecked == nqn
	r.mu.Unlock()
	if checked && conflict == nil {
		return nil, nil
	}
	self := a.Spec.NodeName
	if self == "" {
		self = a.Name
	}
	seen := map[string]bool{}
	var agents storev1.AgentList
	if err := r.reader.List(ctx, &agents); err != nil {
		return nil, fmt.Errorf("list Agents for host NQN %s: %w", nqn, err)
	}
	for _, o := range agents.Items {
		n := o.Spec.NodeName
		if n == "" {
			n = o.Name
		}
		if n != self && o.Status.HostNQN == nqn {
			seen[n] = true
		}
	}
	var nodes corev1.NodeList
	if err := r.reader.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("list Nodes for host NQN %s: %w", nqn, err)
	}
	for _, n := range nodes.Items {
		if n.Name == self {
			holds = holds || n.Annotations[policyv1.AnnotationHostNQN] == nqn
		} else if n.Annotations[policyv1.AnnotationHostNQN] == nqn {
			seen[n.Name] = true
		}
	}
	others := slices.Sorted(maps.Keys(seen))
	r.mu.Lock()
	r.nqnChecked = nqn
	r.mu.Unlock()
	if !hostnqn.Rejected(self, holds, others) {
		apimeta.RemoveStatusCondition(&a.Status.Conditions, storev1.ConditionHostNQNConflict)
		return nil, nil
	}
	msg := hostnqn.Message(nqn, self, others) + "; this node's registration is rejected"
	if conflict == nil || conflict.Message != msg {
		r.events.Eventf(a, nil, corev1.EventTypeWarning, hostnqn.ReasonDuplicate, "Register", "%s", msg)
		ctrl.LoggerFrom(ctx).Error(nil, "host NQN registration rejected", "hostNQN", nqn, "node", self, "alsoPresentedBy", others)
	}
	setCond(&a.Status.Conditions, a.Generation, storev1.ConditionHostNQNConflict, true, hostnqn.ReasonDuplicate, msg)
	return others, nil
}
