package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/fencing"
	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/failpoint"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// node is the state the reconcilers of one agent share.
type node struct {
	// bootID identifies this kernel boot (/proc/sys/kernel/random/boot_id): exports
	// recorded in another boot are gone with it and are restored, not reported.
	bootID string
	opts   Options
	client client.Client
	marks  *fencing.Store
	target *nvmet.Target
	wake   chan event.GenericEvent
	// events records Warning events on the node's objects (fencing refusals, a duplicate
	// host NQN).
	events events.EventRecorder
	// reader reads uncached what the node's cache does not hold: other Agents and Nodes.
	reader client.Reader
	// keys gives the DH-HMAC-CHAP keys of the hosts its volumes allow (Options.Keys).
	keys hostkeys.Source
	// nqnChecked is the host NQN this process last checked against the other nodes'
	// (agent_controller.go); guarded by mu.
	nqnChecked string

	// agentWake asks the Agent reconciler for a report (status.hostKeys changed).
	agentWake chan event.GenericEvent
	mu        sync.Mutex
	stores    map[string]*storeRuntime
	// hostKeys is, for each host entry this process wrote or found matching the keys served
	// for it (by host NQN), the host's node and the key id of those keys
	// (dhchap.AnnotationKeyID): reported in status.hostKeys, and asked again at every report
	// to notice a rotation (followHostKeys); guarded by mu.
	hostKeys map[string]hostKeyEntry
	// orphanSince is when this process first saw each orphan volume, per Store
	// (orphans.go); guarded by mu.
	orphanSince map[string]map[string]time.Time
	// claimTried is when this process last read, and did not find, the PV of a volume whose
	// identity stamp names no claim yet (identity.go); guarded by mu.
	claimTried map[string]time.Time
}

// storeRuntime is a Store's backend instance and what the last refresh saw.
type storeRuntime struct {
	mu        sync.Mutex // serialises ensure and rebuilds
	key       string     // fingerprint of the spec the backend was built from
	be        backend.Backend
	beReserve int64
	ensured   bool
	total     int64 // physical size seen last, for percent reserves
}

// Scheme returns a scheme with the runtime API group and core/v1.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := storev1.AddToScheme(s); err != nil {
		panic(err) // static registration; cannot fail
	}
	// Nodes (their host NQN annotation, agent_controller.go) and the Secrets of DH-HMAC-CHAP,
	// both read uncached
	if err := corev1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// CacheOptions scopes the manager's cache to one node: the Agent named
// node, and the Stores and VolumeStates labelled plinth.dev/node =
// storev1.NameLabelValue(node). No cached object keeps its managedFields: the
// agent never reads them, and its Updates of cached objects without them leave
// the server's as they are.
func CacheOptions(nodeName string) cache.Options {
	byNode := labels.SelectorFromSet(labels.Set{policyv1.LabelNode: storev1.NameLabelValue(nodeName)})
	return cache.Options{DefaultTransform: cache.TransformStripManagedFields(), ByObject: map[client.Object]cache.ByObject{
		&storev1.Agent{}:       {Field: fields.OneTermEqualSelector("metadata.name", nodeName)},
		&storev1.Store{}:       {Label: byNode},
		&storev1.VolumeState{}: {Label: byNode},
		// snapshots carry the node label of their source volume's Store
		&storev1.VolumeSnapshotState{}: {Label: byNode},
	}}
}

// RBAC of the agent (kustomize/rbac): its cache, status patches and the
// VolumeState finalizer.
//
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=agents;stores,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumestates;volumesnapshotstates,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=agents/status;stores/status;volumestates/status;volumesnapshotstates/status,verbs=get;patch;update
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumestates/finalizers;volumesnapshotstates/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
//
// The key server's certificate, read through the API while kubelet has not filled the Pod's
// volume of it (cmd/plinth: hostkeys.FileOrAPI; the Role names the one ConfigMap).
//
// +kubebuilder:rbac:groups="",namespace=plinth-system,resources=configmaps,resourceNames=plinth-key-server-ca,verbs=get

// NewManager builds the agent's manager for cfg: cache scoped to the node,
// /metrics on Options.MetricsAddr, /healthz and /readyz (caches synced) on
// Options.ProbeAddr, and the Agent, Store and VolumeState reconcilers.
func NewManager(cfg *rest.Config, opts Options) (manager.Manager, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	marks, err := fencing.Open(opts.MarksDir())
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 Scheme(),
		Cache:                  CacheOptions(opts.NodeName),
		Metrics:                metricsserver.Options{BindAddress: opts.MetricsAddr},
		HealthProbeBindAddress: opts.ProbeAddr,
		PprofBindAddress:       opts.PprofAddr,
		LeaderElection:         false,
		// one agent per node; tests restart it inside one process
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("agent manager: %w", err)
	}
	// Without a boot id (a /proc without it) every boot looks the same: a missing export is
	// then always drift, as before boots were told apart.
	bootID, _ := os.ReadFile(filepath.Join(opts.ProcRoot, "sys", "kernel", "random", "boot_id"))
	if opts.Keys == nil {
		opts.Keys = hostkeys.Secrets{Reader: mgr.GetAPIReader(), Namespace: opts.AuthNamespace}
	}
	n := &node{
		bootID: strings.TrimSpace(string(bootID)),
		opts:   opts,
		client: mgr.GetClient(),
		reader: mgr.GetAPIReader(),
		keys:   opts.Keys,
		marks:  marks,
		target: nvmet.New(opts.NVMetRoot),
		wake:   make(chan event.GenericEvent, 1024),
		// one pending report is enough: it reads hostKeys when it runs
		agentWake: make(chan event.GenericEvent, 1),
		events:    mgr.GetEventRecorder("plinth-agent"),
		stores:    map[string]*storeRuntime{},

		orphanSince: map[string]map[string]time.Time{},
		claimTried:  map[string]time.Time{},
	}
	if err := mgr.AddHealthzCheck("ping", func(*http.Request) error { return nil }); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("caches", func(r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("caches not synced")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := (&agentReconciler{n}).setup(mgr); err != nil {
		return nil, err
	}
	if err := (&storeReconciler{n}).setup(mgr); err != nil {
		return nil, err
	}
	if err := (&volumeReconciler{n}).setup(mgr); err != nil {
		return nil, err
	}
	if err := (&snapshotReconciler{n}).setup(mgr); err != nil {
		return nil, err
	}
	return mgr, nil
}

// Run runs the agent until ctx is done. It first arms the crash points named
// in $PLINTH_FAILPOINTS (internal/failpoint; empty in production), "once"
// points recorded under Options.FailpointsDir, so that a fault test can stop
// this process at an exact step.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	if err := opts.defaults(); err != nil {
		return err
	}
	armed, err := failpoint.Configure(os.Getenv(failpoint.Env), opts.FailpointsDir())
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if len(armed) > 0 {
		ctrl.Log.WithName("agent").Info("crash points armed: this process exits on purpose at them", "failpoints", armed, "exitCode", failpoint.ExitCode)
	}
	mgr, err := NewManager(cfg, opts)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// runtime returns the store's runtime, new when the spec's backend, reserve
// or overcommit changed.
func (n *node) runtime(s *storev1.Store) *storeRuntime {
	b, _ := json.Marshal(struct {
		B policyv1.Backend
		R string
		O int32
	}{s.Spec.Backend, s.Spec.Reserve, s.Spec.OvercommitPercent})
	n.mu.Lock()
	defer n.mu.Unlock()
	rt, ok := n.stores[s.Name]
	if !ok || rt.key != string(b) {
		rt = &storeRuntime{key: string(b)}
		n.stores[s.Name] = rt
	}
	return rt
}

func (n *node) dropStore(name string) {
	n.mu.Lock()
	delete(n.stores, name)
	n.mu.Unlock()
	for _, t := range []string{"total", "allocatable", "provisioned", "available", "snapshots", "cache_total", "cache_free", "cache_provisioned"} {
		StoreCapacityBytes.DeletePartialMatch(map[string]string{"store": name, "type": t})
	}
	StoreThinUsedRatio.DeletePartialMatch(map[string]string{"store": name})
}

// backend returns the store's backend, built with the reserve resolved
// against the last physical size seen, and ensured (VG, thin pool) once.
func (n *node) backend(ctx context.Context, s *storev1.Store, rt *storeRuntime) (backend.Backend, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	reserve, err := policyv1.ReserveBytes(s.Spec.Reserve, rt.total)
	if err != nil {
		return nil, err
	}
	if rt.be == nil || rt.beReserve != reserve {
		kind := s.Spec.Backend.Kind()
		be, err := n.opts.NewBackend(s, reserve, func(string, []string, time.Duration, error) {
			BackendCommands.WithLabelValues(kind).Inc()
		})
		if err != nil {
			return nil, err
		}
		rt.be, rt.beReserve = be, reserve
	}
	if !rt.ensured {
		if e, ok := rt.be.(ensurer); ok {
			start := time.Now()
			err := e.Ensure(ctx)
			OperationDuration.WithLabelValues("ensure").Observe(time.Since(start).Seconds())
			if err != nil {
				return nil, err
			}
		}
		rt.ensured = true
	}
	return rt.be, nil
}

var errOtherNode = errors.New("store of another node")

// storeOf returns the Store a VolumeState names, from the node's cache.
func (n *node) storeOf(ctx context.Context, vs *storev1.VolumeState) (*storev1.Store, error) {
	var s storev1.Store
	if err := n.client.Get(ctx, client.ObjectKey{Name: vs.Spec.StoreName}, &s); err != nil {
		return nil, err
	}
	if s.Spec.NodeName != n.opts.NodeName {
		return nil, fmt.Errorf("store %s belongs to node %s: %w", s.Name, s.Spec.NodeName, errOtherNode)
	}
	return &s, nil
}
