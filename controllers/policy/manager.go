package policy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"net/http"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/liveness"
	nvmeauthctrl "github.com/plinth-storage/plinth/controllers/nvmeauth"
	"github.com/plinth-storage/plinth/internal/dhchap"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Options configure NewManager.
type Options struct {
	// Config reaches the API server.
	Config *rest.Config
	// MetricsAddr serves /metrics ("0" disables); HealthAddr serves /healthz and /readyz ("0" disables).
	MetricsAddr, HealthAddr string
	// LeaderElection makes only one replica reconcile; the Lease lives in LeaderElectionNamespace.
	LeaderElection          bool
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod time the Lease (nil: controller-runtime's
	// 15 s, 10 s and 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod *time.Duration
	// Namespace holds the inventory ConfigMap InventoryName (default inventory.DefaultName).
	Namespace     string
	InventoryName string
	// FieldManager of every write (default DefaultFieldManager).
	FieldManager string
	// ArgoNamespace is where Argo CD's Applications live (revision lookup).
	ArgoNamespace string
	// QPS and Burst limit the client's requests per second to the API server (0: 50 and
	// 300, Flux's defaults; negative: no client-side limiter, for an API server running
	// API Priority and Fairness — internal/clientlimit decides).
	QPS   float32
	Burst int
	// Resync is the period of reconciles without events (0: none).
	Resync time.Duration
	// Logger for the manager and the reconciler.
	Logger logr.Logger
	// SkipNameValidation allows more than one manager per process (tests).
	SkipNameValidation bool
	// KeyServerAddr, when set, serves the DH-HMAC-CHAP key server there (HTTPS, every replica;
	// controllers/nvmeauth KeyServer, docs/design.md#key-distribution); "" serves none.
	KeyServerAddr string
	// KeyServerHosts are extra names of its certificate (tests: 127.0.0.1).
	KeyServerHosts []string
	// KeyServerListening, when set, receives the key server's bound address (tests bind port 0).
	KeyServerListening chan<- string
	// WrapClient, when set, wraps the client the reconciler writes with (tests count writes).
	WrapClient func(client.Client) client.Client
}

// Scheme returns a scheme with the Kubernetes built-in kinds and Plinth's two API groups.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, policyv1.AddToScheme, storev1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// NewManager builds the controller manager with the policy reconciler, health and readiness
// probes, the metrics endpoint (with plinth_agent_heartbeat_age_seconds) and leader election.
// Start the returned manager to run.
func NewManager(ctx context.Context, o Options) (ctrl.Manager, *Reconciler, error) {
	if o.Namespace == "" {
		return nil, nil, fmt.Errorf("the namespace of the inventory ConfigMap is required")
	}
	if err := RegisterMetrics(); err != nil {
		return nil, nil, fmt.Errorf("register metrics: %w", err)
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, nil, err
	}
	ctrl.SetLogger(o.Logger)
	cfg := rest.CopyConfig(o.Config)
	cfg.QPS, cfg.Burst = o.QPS, o.Burst
	if cfg.QPS == 0 {
		cfg.QPS = 50
	}
	if cfg.Burst == 0 {
		cfg.Burst = 300
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Logger:                        o.Logger,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:        o.HealthAddr,
		LeaderElection:                o.LeaderElection,
		LeaderElectionID:              "plinth-controller.plinth.dev",
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 o.LeaseDuration,
		RenewDeadline:                 o.RenewDeadline,
		RetryPeriod:                   o.RetryPeriod,
		// Secrets: only the DH-HMAC-CHAP host Secrets of its own namespace (controllers/nvmeauth),
		// never a cluster-wide Secret informer
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {
				Namespaces: map[string]cache.Config{o.Namespace: {}},
				Label:      labels.SelectorFromSet(labels.Set{dhchap.LabelComponent: dhchap.ComponentValue}),
			},
		}},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("create manager: %w", err)
	}
	c := mgr.GetClient()
	if o.WrapClient != nil {
		c = o.WrapClient(c)
	}
	fm := o.FieldManager
	if fm == "" {
		fm = DefaultFieldManager
	}
	name := o.InventoryName
	if name == "" {
		name = inventory.DefaultName
	}
	inv := &inventory.Store{Client: c, Reader: mgr.GetAPIReader(), Namespace: o.Namespace, Name: name, FieldOwner: fm}
	r, err := New(c, mgr.GetAPIReader(), mgr.GetEventRecorder("plinth-controller"), inv, fm)
	if err != nil {
		return nil, nil, err
	}
	if o.ArgoNamespace != "" {
		r.ArgoNamespace = o.ArgoNamespace
	}
	r.ResyncInterval = o.Resync
	r.SkipNameValidation = o.SkipNameValidation
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return nil, nil, fmt.Errorf("set up policy controller: %w", err)
	}
	if err := (&liveness.Reconciler{Client: mgr.GetClient(), SkipNameValidation: o.SkipNameValidation}).SetupWithManager(mgr); err != nil {
		return nil, nil, fmt.Errorf("set up liveness controller: %w", err)
	}
	if err := (&nvmeauthctrl.Reconciler{Client: mgr.GetClient(), Namespace: o.Namespace, SkipNameValidation: o.SkipNameValidation}).SetupWithManager(mgr); err != nil {
		return nil, nil, fmt.Errorf("set up nvme-auth controller: %w", err)
	}
	if o.KeyServerAddr != "" {
		ks := &nvmeauthctrl.KeyServer{Keys: hostkeys.Secrets{Reader: mgr.GetClient(), Namespace: o.Namespace}, Reader: mgr.GetAPIReader(),
			Reviewer: mgr.GetClient(), Namespace: o.Namespace, Audience: hostkeys.Audience}
		if err := mgr.Add(&nvmeauthctrl.KeyServerRunnable{Addr: o.KeyServerAddr, Server: ks, Reader: mgr.GetAPIReader(), Client: mgr.GetClient(),
			Namespace: o.Namespace, Hosts: o.KeyServerHosts, Listening: o.KeyServerListening}); err != nil {
			return nil, nil, fmt.Errorf("add the key server: %w", err)
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, nil, err
	}
	if err := mgr.AddReadyzCheck("informers", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return fmt.Errorf("informer caches not synced")
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	for _, col := range []prometheus.Collector{&HeartbeatCollector{Reader: mgr.GetClient()}, &VolumeCollector{Reader: mgr.GetClient()}} {
		if err := metrics.Registry.Register(col); err != nil {
			var dup prometheus.AlreadyRegisteredError
			if !errors.As(err, &dup) { // a second manager in one process (tests) keeps the first
				return nil, nil, err
			}
		}
	}
	return mgr, r, nil
}
