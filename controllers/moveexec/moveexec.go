// Package moveexec is the controller's part of carrying out a volume move (VolumeState
// spec.move; docs/design.md, "Data mobility"): the agents copy and verify, this switches
// spec.storeName from the move's source to its target once the copy is verified
// (status.move Copied), and clears spec.move once the agent reports the source's copy
// deleted (Done) or the move Failed. Each write is one Update under the object's
// resourceVersion, so a switch never lands on a spec changed meanwhile. It does not admit
// moves: spec.move is set by hand or by a later admission step (see the design).
package moveexec

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Event reasons on the VolumeState.
const (
	ReasonMoveSwitched = "MoveSwitched"
	ReasonMoveEnded    = "MoveEnded"
)

// Results of plinth_volume_moves_total.
const (
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
)

var (
	// Moves is plinth_volume_moves_total{result}: moves ended, succeeded (the volume is
	// served from the target, the source's copy deleted) or failed (the source stays).
	Moves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "plinth_volume_moves_total",
		Help: "Volume moves ended, by result (succeeded, failed).",
	}, []string{"result"})
	// MoveDuration is plinth_volume_move_duration_seconds: from the copy's start
	// (status.move.startedAt) to the end of a succeeded move, in seconds.
	MoveDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "plinth_volume_move_duration_seconds",
		Help:    "Duration of succeeded volume moves, copy start to source deleted, in seconds.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 8),
	})
)

// States of plinth_volume_moves_planned.
const (
	StateInFlight  = "in_flight"
	StateWaiting   = "waiting"
	StateCrossNode = "cross_node"
	StateBlocked   = "blocked"
)

// MovesPlanned is plinth_volume_moves_planned{state}: the moves of the Starter's last plan,
// by state: in_flight (spec.move set), waiting (for a free slot of maxParallelMovesPerStore),
// cross_node (target on another node: not carried out yet), blocked (no room, no protocol,
// snapshots). Zero everywhere when nothing is to move.
var MovesPlanned = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "plinth_volume_moves_planned",
	Help: "Volume moves of the last plan, by state (in_flight, waiting, cross_node, blocked).",
}, []string{"state"})

func init() { metrics.Registry.MustRegister(Moves, MoveDuration, MovesPlanned) }

// Reconciler switches and ends moves. Client must be able to update VolumeStates.
type Reconciler struct {
	Client client.Client
	// Events records MoveSwitched and MoveEnded on the VolumeState; nil records none.
	Events events.EventRecorder
	// SkipNameValidation lets tests start several managers in one process.
	SkipNameValidation bool
}

// SetupWithManager watches VolumeStates (spec and status changes: the agent's status.move
// is what moves a move on).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("volume-move").
		WithOptions(controller.Options{SkipNameValidation: &r.SkipNameValidation}).
		For(&storev1.VolumeState{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			vs, ok := o.(*storev1.VolumeState)
			return ok && vs.Spec.Move != nil
		}))).
		Complete(r)
}

// Step is what Next decides for one VolumeState.
type Step int

const (
	// StepNone: nothing to do (no move, or the agent has not reported on this one yet).
	StepNone Step = iota
	// StepSwitch: the copy is verified; spec.storeName goes to the target.
	StepSwitch
	// StepEnd: the move is Done or Failed; spec.move is cleared.
	StepEnd
)

// Next decides the controller's step for vs from spec.move and the agent's status.move
// (a status about another move id counts for nothing). A verified copy is switched to only
// while no consumer has been let in since it was made (spec.publicationGeneration unchanged,
// no publication); the switch's Update carries the resourceVersion Next judged, so a
// publication written meanwhile makes it a conflict, never a switch.
func Next(vs *storev1.VolumeState) Step {
	m, st := vs.Spec.Move, vs.Status.Move
	if m == nil || st == nil || st.ID != m.ID || vs.DeletionTimestamp != nil {
		return StepNone
	}
	switch {
	case st.Phase == storev1.MoveCopied && vs.Spec.StoreName == m.SourceStore:
		if len(vs.Spec.Publications) > 0 || st.PublicationGeneration != vs.Spec.PublicationGeneration {
			// a consumer was let in after the copy: the agent copies again first
			return StepNone
		}
		return StepSwitch
	case st.Phase == storev1.MoveDone && vs.Spec.StoreName == m.TargetStore,
		st.Phase == storev1.MoveFailed && vs.Spec.StoreName == m.SourceStore:
		return StepEnd
	}
	return StepNone
}

// Reconcile takes one step of one VolumeState's move.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var vs storev1.VolumeState
	if err := r.Client.Get(ctx, req.NamespacedName, &vs); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	m := vs.Spec.Move
	switch Next(&vs) {
	case StepSwitch:
		var target storev1.Store
		if err := r.Client.Get(ctx, client.ObjectKey{Name: m.TargetStore}, &target); err != nil {
			return ctrl.Result{}, fmt.Errorf("move %s of %s: read the target store: %w", m.ID, vs.Name, err)
		}
		// the volume now lives on the target: its Store, the labels agents and the CSI
		// driver select it by, and the frozen pool and backend (what it was made on)
		vs.Spec.StoreName = target.Name
		vs.Spec.Policy.Pool = target.Spec.Pool
		vs.Spec.Policy.Backend = target.Spec.Backend
		if vs.Labels == nil {
			vs.Labels = map[string]string{}
		}
		vs.Labels[policyv1.LabelPool] = storev1.NameLabelValue(target.Spec.Pool)
		vs.Labels[policyv1.LabelNode] = storev1.NameLabelValue(target.Spec.NodeName)
		if err := r.Client.Update(ctx, &vs); err != nil {
			return ctrl.Result{}, ignoreConflict(err)
		}
		r.event(&vs, corev1.EventTypeNormal, ReasonMoveSwitched, "move %s: served from %s from now on (copy verified, %s)", m.ID, target.Name, vs.Status.Move.Checksum)
	case StepEnd:
		st := vs.Status.Move
		vs.Spec.Move = nil
		if err := r.Client.Update(ctx, &vs); err != nil {
			return ctrl.Result{}, ignoreConflict(err)
		}
		if st.Phase == storev1.MoveDone {
			Moves.WithLabelValues(ResultSucceeded).Inc()
			if st.StartedAt != nil {
				MoveDuration.Observe(time.Since(st.StartedAt.Time).Seconds())
			}
			r.event(&vs, corev1.EventTypeNormal, ReasonMoveEnded, "move %s succeeded: %d bytes on %s", st.ID, st.BytesTotal, st.TargetStore)
		} else {
			Moves.WithLabelValues(ResultFailed).Inc()
			r.event(&vs, corev1.EventTypeWarning, ReasonMoveEnded, "move %s failed, the volume stays on %s: %s", st.ID, st.SourceStore, st.Message)
		}
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) event(vs *storev1.VolumeState, typ, reason, format string, args ...any) {
	if r.Events != nil {
		r.Events.Eventf(vs, nil, typ, reason, "Move", format, args...)
	}
}

// ignoreConflict: a conflict means the object changed under the step; its new version comes
// as an event and is judged afresh.
func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}
