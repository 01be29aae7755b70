package policy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	"github.com/fluxcd/pkg/ssa"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/plan"
	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

// DefaultFieldManager is the one field manager of every write the controller makes.
const DefaultFieldManager = "plinth-controller"

// RequestName is the name of the single request that stands for the whole policy set.
const RequestName = "policy-set"

// Field indexes registered by SetupWithManager.
const (
	indexPVCClass   = "spec.storageClassName"
	indexPVClass    = "spec.storageClassName"
	indexVolumeStor = "spec.storeName"
	// indexPVCAttrClass and indexPVAttrClass hold every VolumeAttributesClass a claim or PV
	// names (policyv1.ClaimAttributesClasses).
	indexPVCAttrClass = "plinth.dev/volumeAttributesClassNames"
	indexPVAttrClass  = "spec.volumeAttributesClassName"
)

// Reconciler reconciles the policy set. Build it with New.
type Reconciler struct {
	// Client reads from the manager's cache and writes; APIReader reads from the API server.
	Client    client.Client
	APIReader client.Reader
	// Recorder emits events on policy objects (events.k8s.io/v1).
	Recorder events.EventRecorder
	// Inventory is where the record of applied objects lives.
	Inventory *inventory.Store
	// FieldManager is the field manager of applies, patches and status writes.
	FieldManager string
	// ArgoNamespace is where Argo CD keeps its Applications (for the revision).
	ArgoNamespace string
	// ResyncInterval re-runs a reconcile with no event, to refresh revisions and catch drift
	// of objects whose watch events were missed. 0 disables it.
	ResyncInterval time.Duration
	// ReplacementPoll is how soon to look again while an old StorageClass goes away.
	ReplacementPoll time.Duration
	// SkipNameValidation lets several managers in one process (tests) register the
	// controller name "policy".
	SkipNameValidation bool

	manager *ssa.ResourceManager
	vetter  *vet.Vetter
	// keptVet and renderer keep, between reconciles, each policy object's verdict (by UID and
	// resourceVersion) and render, so that a reconcile after one object changed vets and
	// renders what it touches (BenchmarkRerenderOneOf10kPolicies1kNodes); both are used under
	// mu, and the render they return is valid until the next reconcile.
	keptVet  *KeptVetter
	renderer render.Renderer
	// kept keeps, per rendered object the renderer hands out again, what the plan computed
	// of it: its digest and its comparisons with the live objects (plan.Kept).
	kept plan.Kept
	mu   sync.Mutex
}

// New returns a reconciler that applies through c with fieldManager. The CUE schema is
// compiled here once.
func New(c client.Client, apiReader client.Reader, recorder events.EventRecorder, inv *inventory.Store, fieldManager string) (*Reconciler, error) {
	v, err := vet.NewVetter()
	if err != nil {
		return nil, fmt.Errorf("compile policy schema: %w", err)
	}
	if fieldManager == "" {
		fieldManager = DefaultFieldManager
	}
	m := ssa.NewResourceManager(c, nil, ssa.Owner{Field: fieldManager, Group: policyv1.GroupVersion.Group})
	m.SetConcurrency(8)
	return &Reconciler{
		Client: c, APIReader: apiReader, Recorder: recorder, Inventory: inv,
		FieldManager: fieldManager, ArgoNamespace: "argocd", ReplacementPoll: 2 * time.Second,
		manager: m, vetter: v, keptVet: NewKeptVetter(v),
	}, nil
}

// policyObject is a policy object with its status, a copy taken before any change, and what
// this reconcile found for it.
type policyObject struct {
	obj          client.Object
	kind         string
	status       *policyv1.PolicyStatus
	setter       conditions.Setter
	before       client.Object
	beforeStatus *policyv1.PolicyStatus
	// oldReady is the Ready condition before this reconcile (for events on transitions).
	oldReady *condSnapshot
	out      outcome
}

type condSnapshot struct{ status, reason, message string }

func (p *policyObject) key() string { return p.kind + "/" + p.obj.GetName() }

// outcome is what one reconcile found for one policy object; the status setters read it.
type outcome struct {
	// invalid are the object's own vet or render problems; waitingFor names the policy
	// objects its references name that are not in the set (yet).
	invalid    []string
	waitingFor []string
	// applyErrs are the failed writes of the objects it produced.
	applyErrs []error
	// replacementRequired, replacing and replaced describe its StorageClass's replacement:
	// not allowed, waiting for the old object to go, done.
	replacementRequired, replacing, replaced string
	drifted, corrected                       []drift.Item
	// applied and pruned are "Kind/name ..." of the objects it changed, for events.
	applied, pruned []string
	produced        []policyv1.ObjectReference
	// revision is the revision the sync tool applied (the one its labels name); sync is what
	// the sync tool said (nil when it could not be read).
	revision string
	sync     *syncRevision
}

// track records obj with copies taken before any change.
func track(obj client.Object, kind string, st *policyv1.PolicyStatus, setter conditions.Setter) *policyObject {
	p := &policyObject{obj: obj, kind: kind, status: st, setter: setter, before: obj.DeepCopyObject().(client.Object), beforeStatus: st.DeepCopy()}
	if c := conditions.Get(setter, meta.ReadyCondition); c != nil {
		p.oldReady = &condSnapshot{string(c.Status), c.Reason, c.Message}
	}
	return p
}

// scope is one reconcile of the policy set: what it read, decided and did, passed from step
// to step.
type scope struct {
	// Read by the read step.
	objs     []*policyObject
	byKey    map[string]*policyObject
	deleting []*policyv1.Placement
	pools    []policyv1.StoragePool
	protos   []policyv1.Protocol
	places   []policyv1.Placement
	nodes    []corev1.Node
	// Decided.
	pol      *vet.Policies
	rendered *render.Output
	prev     *inventory.Inventory
	plan     *plan.Plan
	stores   []storev1.Store
	// setProblems are the problems of the set that name no object; setInvalid is true when the
	// set does not vet or render (nothing is applied).
	setInvalid  bool
	setProblems []string
	// Done.
	next       *inventory.Inventory
	inUse      map[string]int    // StorageClass name → PVCs
	forced     map[string]string // StorageClass name → PrunedInUse message
	driftCount map[string]int    // kind → drifted objects not corrected
	errs       []error
	waiting    bool
	// judged is set once every policy object's status is decided: the deferred write sends
	// status only then (a failed read leaves the last status as it was). complete is set when
	// the whole plan ran, so the inventory-derived status (produced, pool capacity) is filled.
	judged, complete bool
}

// owner returns the tracked policy object named key ("Kind/name"), or nil.
func (s *scope) owner(key string) *policyObject { return s.byKey[key] }

// each calls f on the tracked policy objects among keys.
func (s *scope) each(keys []string, f func(*policyObject)) {
	for _, k := range keys {
		if p := s.byKey[k]; p != nil {
			f(p)
		}
	}
}

// fail records a failed write of a rendered object on its owners and in the reconcile's error.
func (s *scope) fail(err error, owners []string) {
	s.errs = append(s.errs, err)
	s.each(owners, func(p *policyObject) { p.out.applyErrs = append(p.out.applyErrs, err) })
}

// step is one named part of a reconcile; stop ends the reconcile without an error (the set is
// invalid: nothing more to do until it changes).
type step struct {
	name string
	run  func(ctx context.Context, s *scope) (stop bool, err error)
}

// steps are the reconcile's parts in order: deciding (vet, render, plan) before doing.
func (r *Reconciler) steps() []step {
	return []step{
		{"vet", r.vetSet},
		{"render", r.render},
		{"plan", r.makePlan},
		{"undrain", r.undrain},
		{"apply", r.apply},
		{"replace", r.replaceClasses},
		{"prune", r.prune},
		{"usage", r.countUsage},
		{"inventory", r.saveInventory},
		{"revision", r.readRevisions},
	}
}

// Reconcile runs one pass over the whole policy set; req is ignored (there is one key).
// Status, events and metrics are written once, in a deferred function, from what the steps
// recorded in the scope.
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (res ctrl.Result, retErr error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	start := time.Now()
	s := &scope{byKey: map[string]*policyObject{}, inUse: map[string]int{}, forced: map[string]string{},
		driftCount: map[string]int{"StorageClass": 0, "Agent": 0, "Store": 0}}
	defer func() {
		if err := r.finish(ctx, s); err != nil {
			retErr = errors.Join(retErr, err)
		}
		if retErr == nil && len(s.errs) > 0 {
			retErr = errors.Join(s.errs...)
		}
		switch {
		case retErr != nil:
			res = ctrl.Result{}
		case s.waiting:
			res = ctrl.Result{RequeueAfter: r.ReplacementPoll}
		case s.complete:
			res = ctrl.Result{RequeueAfter: r.ResyncInterval}
		}
		ReconcileDuration.WithLabelValues(KindPolicySet).Observe(time.Since(start).Seconds())
		if retErr != nil {
			ReconcileErrors.WithLabelValues(KindPolicySet).Inc()
		}
	}()
	if err := r.read(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	log := ctrl.LoggerFrom(ctx)
	for _, st := range r.steps() {
		stop, err := st.run(ctx, s)
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("%s: %w", st.name, err)
		}
		if stop {
			log.V(1).Info("reconcile stopped", "step", st.name)
			return ctrl.Result{}, nil
		}
	}
	s.judged, s.complete = true, true
	return ctrl.Result{}, nil
}

// finish writes what the reconcile decided: the status of Placements removed from Git, then
// every policy object's status, events and metrics. Nothing is written before the set was
// judged.
func (r *Reconciler) finish(ctx context.Context, s *scope) error {
	if !s.judged {
		return nil
	}
	if s.complete {
		if err := r.finishDeletedPlacements(ctx, s); err != nil {
			return err
		}
	}
	return r.writeStatus(ctx, s)
}

// read lists the policy set and the Nodes, and tracks the policy objects not being deleted.
func (r *Reconciler) read(ctx context.Context, s *scope) error {
	var pools policyv1.StoragePoolList
	var protos policyv1.ProtocolList
	var places policyv1.PlacementList
	var nodes corev1.NodeList
	for _, l := range []client.ObjectList{&pools, &protos, &places, &nodes} {
		if err := r.Client.List(ctx, l); err != nil {
			return fmt.Errorf("list %T: %w", l, err)
		}
	}
	s.nodes = nodes.Items
	add := func(p *policyObject) {
		s.objs = append(s.objs, p)
		s.byKey[p.key()] = p
	}
	for i := range pools.Items {
		if o := &pools.Items[i]; o.DeletionTimestamp.IsZero() {
			s.pools = append(s.pools, *o)
			add(track(o, "StoragePool", &o.Status, o))
		}
	}
	for i := range protos.Items {
		if o := &protos.Items[i]; o.DeletionTimestamp.IsZero() {
			s.protos = append(s.protos, *o)
			add(track(o, "Protocol", &o.Status, o))
		}
	}
	for i := range places.Items {
		o := &places.Items[i]
		if !o.DeletionTimestamp.IsZero() {
			s.deleting = append(s.deleting, o)
			continue
		}
		s.places = append(s.places, *o)
		add(track(o, "Placement", &o.Status, o))
	}
	return nil
}
