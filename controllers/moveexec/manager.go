package moveexec

import (
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The access of the move executor, granted to the CSI controller it runs in
// (kustomize/rbac/csi_controller.yaml; test/manifests checks the role holds these).
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumestates,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=stores;agents;volumesnapshotstates,verbs=get;list;watch
// +kubebuilder:rbac:groups=policy.plinth.dev,resources=storagepools;placements,verbs=get;list;watch
// +kubebuilder:rbac:groups=policy.plinth.dev,resources=storagepools/status,verbs=get;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.k8s.io,resources=volumeattachments,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=plinth-system,resources=leases,verbs=get;create;update

// LeaderElectionID is the Lease the move executor's replicas elect a leader with: one replica
// starts moves at a time, so maxParallelMovesPerStore holds across replicas.
const LeaderElectionID = "plinth-move-executor.plinth.dev"

// ManagerOptions configure NewManager.
type ManagerOptions struct {
	// Config reaches the API server. Required.
	Config *rest.Config
	// LeaderElection makes one replica run the executor; the Lease LeaderElectionID lives in
	// LeaderElectionNamespace (required with it).
	LeaderElection          bool
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod time the Lease (nil: controller-runtime's
	// 15 s, 10 s and 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod *time.Duration
	// Registerer, when set, receives plinth_volume_moves_total,
	// plinth_volume_move_duration_seconds and plinth_volume_moves_planned besides
	// controller-runtime's registry.
	Registerer prometheus.Registerer
	// Log receives the reconcilers' logs.
	Log logr.Logger
	// AssumedRate is the Starter's (bytes per second; 0: DefaultAssumedRate).
	AssumedRate int64
	// SkipNameValidation lets tests make several managers in one process.
	SkipNameValidation bool
}

// Scheme holds the kinds the executor reads and writes.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{storev1.AddToScheme, policyv1.AddToScheme, corev1.AddToScheme, storagev1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err) // static registration; cannot fail
		}
	}
	return s
}

// NewManager is the move executor as a process runs it (plinth csi --mode=controller
// --move-executor): a manager with the Starter (admits planned moves) and the Reconciler
// (switches and ends them), no metrics or health server of its own (the caller serves the
// Registerer). Errors: a missing Config or namespace, a Registerer that refuses the metrics,
// the manager's own.
func NewManager(o ManagerOptions) (ctrl.Manager, error) {
	if o.Config == nil {
		return nil, fmt.Errorf("move executor: no API server config")
	}
	if o.LeaderElection && o.LeaderElectionNamespace == "" {
		return nil, fmt.Errorf("move executor: leader election needs a namespace")
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{Moves, MoveDuration, MovesPlanned} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("move executor: register metrics: %w", err)
			}
		}
	}
	mgr, err := ctrl.NewManager(o.Config, ctrl.Options{
		Scheme:                        Scheme(),
		Logger:                        o.Log,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                o.LeaderElection,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 o.LeaseDuration,
		RenewDeadline:                 o.RenewDeadline,
		RetryPeriod:                   o.RetryPeriod,
	})
	if err != nil {
		return nil, fmt.Errorf("move executor: create manager: %w", err)
	}
	rec := mgr.GetEventRecorder("plinth-move-executor")
	if err := (&Reconciler{Client: mgr.GetClient(), Events: rec, SkipNameValidation: o.SkipNameValidation}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("move executor: %w", err)
	}
	if err := (&Starter{Client: mgr.GetClient(), Events: rec, AssumedRate: o.AssumedRate, SkipNameValidation: o.SkipNameValidation}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("move executor: %w", err)
	}
	return mgr, nil
}
