package policy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	"github.com/fluxcd/pkg/ssa"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/render"
	"github.com/plinth-storage/plinth/controllers/storageclass"
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
	mu      sync.Mutex
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
		manager: m, vetter: v,
	}, nil
}

// policyObject is a policy object with its status and a copy taken before any change.
type policyObject struct {
	obj          client.Object
	kind         string
	status       *policyv1.PolicyStatus
	setter       conditions.Setter
	before       client.Object
	beforeStatus *policyv1.PolicyStatus
	// oldReady is the Ready condition before this reconcile (for events on transitions).
	oldReady *condSnapshot
}

type condSnapshot struct{ status, reason, message string }

func (p *policyObject) key() string { return p.kind + "/" + p.obj.GetName() }

// outcome collects what the reconcile found for each policy object, keyed "<Kind>/<name>".
type outcome struct {
	invalid     map[string][]string // own problems
	setInvalid  bool
	applyErr    map[string][]string
	replacement map[string]string // ReplacementRequired message
	replacing   map[string]string // ReplacementInProgress message
	replaced    map[string]string
	drifted     map[string][]drift.Item
	corrected   map[string][]drift.Item
	applied     map[string][]string // changed objects, for events
	pruned      map[string][]string
	inUse       map[string]int    // StorageClass name → PVCs
	forced      map[string]string // StorageClass name → PrunedInUse message (deleted in use by override)
	produced    map[string][]policyv1.ObjectReference
	revision    map[string]string
}

func newOutcome() *outcome {
	return &outcome{
		invalid: map[string][]string{}, applyErr: map[string][]string{}, replacement: map[string]string{},
		replacing: map[string]string{}, replaced: map[string]string{}, drifted: map[string][]drift.Item{},
		corrected: map[string][]drift.Item{}, applied: map[string][]string{}, pruned: map[string][]string{},
		inUse: map[string]int{}, forced: map[string]string{}, produced: map[string][]policyv1.ObjectReference{}, revision: map[string]string{},
	}
}

// Reconcile runs one pass over the whole policy set; req is ignored (there is one key).
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	start := time.Now()
	res, err := r.reconcile(ctx)
	ReconcileDuration.WithLabelValues(KindPolicySet).Observe(time.Since(start).Seconds())
	if err != nil {
		ReconcileErrors.WithLabelValues(KindPolicySet).Inc()
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)

	var pools policyv1.StoragePoolList
	var protos policyv1.ProtocolList
	var places policyv1.PlacementList
	var nodes corev1.NodeList
	for _, l := range []client.ObjectList{&pools, &protos, &places, &nodes} {
		if err := r.Client.List(ctx, l); err != nil {
			return ctrl.Result{}, fmt.Errorf("list %T: %w", l, err)
		}
	}

	// Policy objects with copies taken before any change.
	var objs []*policyObject
	track := func(obj client.Object, kind string, st *policyv1.PolicyStatus, setter conditions.Setter) error {
		p := &policyObject{obj: obj, kind: kind, status: st, setter: setter, before: obj.DeepCopyObject().(client.Object), beforeStatus: st.DeepCopy()}
		if c := conditions.Get(setter, meta.ReadyCondition); c != nil {
			p.oldReady = &condSnapshot{string(c.Status), c.Reason, c.Message}
		}
		objs = append(objs, p)
		return nil
	}
	var livePools []policyv1.StoragePool
	var liveProtos []policyv1.Protocol
	var livePlaces []policyv1.Placement
	var deletingPlaces []*policyv1.Placement
	for i := range pools.Items {
		o := &pools.Items[i]
		if o.DeletionTimestamp.IsZero() {
			livePools = append(livePools, *o)
			if err := track(o, "StoragePool", &o.Status, o); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	for i := range protos.Items {
		o := &protos.Items[i]
		if o.DeletionTimestamp.IsZero() {
			liveProtos = append(liveProtos, *o)
			if err := track(o, "Protocol", &o.Status, o); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	for i := range places.Items {
		o := &places.Items[i]
		if !o.DeletionTimestamp.IsZero() {
			deletingPlaces = append(deletingPlaces, o)
			continue
		}
		livePlaces = append(livePlaces, *o)
		if err := track(o, "Placement", &o.Status, o); err != nil {
			return ctrl.Result{}, err
		}
	}

	out := newOutcome()

	// 1. Vet the whole set; an invalid set changes nothing in the cluster.
	pol, problems := VetObjects(r.vetter, livePools, liveProtos, livePlaces)
	if len(problems) > 0 {
		out.setInvalid = true
		for k, msgs := range problemsByObject(problems) {
			out.invalid[k] = msgs
			if kind, _, ok := strings.Cut(k, "/"); ok {
				ReconcileErrors.WithLabelValues(kind).Inc()
			}
		}
		log.Info("policy set is invalid; nothing applied", "problems", len(problems))
		return ctrl.Result{}, r.writeStatus(ctx, objs, out, nil, nil)
	}

	// 2. Render.
	rendered, err := render.Render(render.Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements, Nodes: nodes.Items})
	if err != nil {
		out.setInvalid = true
		for _, e := range render.Errors(err) {
			var re *render.Error
			if errors.As(e, &re) {
				out.invalid[re.Kind+"/"+re.Name] = append(out.invalid[re.Kind+"/"+re.Name], re.Error())
				ReconcileErrors.WithLabelValues(re.Kind).Inc()
			} else {
				out.invalid[""] = append(out.invalid[""], e.Error())
			}
		}
		return ctrl.Result{}, r.writeStatus(ctx, objs, out, nil, nil)
	}
	placeByName := map[string]*policyv1.Placement{}
	for i := range pol.Placements {
		placeByName[pol.Placements[i].Name] = &pol.Placements[i]
	}
	poolByName := map[string]*policyv1.StoragePool{}
	for i := range pol.Pools {
		poolByName[pol.Pools[i].Name] = &pol.Pools[i]
	}
	for key, srcs := range rendered.Sources {
		kind, name, _ := strings.Cut(key, "/")
		ref := policyv1.ObjectReference{APIVersion: storev1.GroupVersion.String(), Kind: kind, Name: name}
		if kind == "StorageClass" {
			ref.APIVersion = "storage.k8s.io/v1"
		}
		for _, s := range srcs {
			out.produced[s] = append(out.produced[s], ref)
		}
	}

	// 3. Desired objects; StorageClasses whose immutable fields changed are classified first.
	desired, err := rendered.Unstructured()
	if err != nil {
		return ctrl.Result{}, err
	}
	prev, err := r.Inventory.Load(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	next := inventory.New()
	type replacement struct {
		desired, live *storagev1.StorageClass
		placement     string
	}
	var replacements []replacement
	var toDiff []*unstructured.Unstructured
	for _, u := range desired {
		if u.GetKind() != "StorageClass" {
			toDiff = append(toDiff, u)
			continue
		}
		var want storagev1.StorageClass
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &want); err != nil {
			return ctrl.Result{}, err
		}
		placement := want.Labels[policyv1.LabelPlacement]
		var live storagev1.StorageClass
		err := r.APIReader.Get(ctx, types.NamespacedName{Name: want.Name}, &live)
		if apierrors.IsNotFound(err) {
			toDiff = append(toDiff, u)
			continue
		}
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("get StorageClass %s: %w", want.Name, err)
		}
		imm := storageclass.Immutable(storageclass.Diff(&live, &want))
		if len(imm) == 0 {
			toDiff = append(toDiff, u)
			continue
		}
		policy := EffectiveReplacement(placeByName[placement])
		pvcs, pvs, err := r.classUsage(ctx, want.Name)
		if err != nil {
			return ctrl.Result{}, err
		}
		what := storageclass.Describe(imm)
		switch {
		case ReplacementAllowed(policy, pvcs, pvs):
			replacements = append(replacements, replacement{desired: &want, live: &live, placement: placement})
			continue
		case policy == policyv1.ReplacementIfUnused:
			out.replacement["Placement/"+placement] = fmt.Sprintf("StorageClass %s needs replacement (%s); replacement is IfUnused and it is %s: kept as it is, in-place fields applied",
				want.Name, what, usage(pvcs, pvs))
		default:
			out.replacement["Placement/"+placement] = fmt.Sprintf("StorageClass %s needs replacement (%s); replacement is Never: kept as it is, in-place fields applied; set spec.storageClass.replacement to IfUnused or Always to replace it",
				want.Name, what)
		}
		keep := storageclass.KeepImmutable(&want, &live)
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(keep)
		if err != nil {
			return ctrl.Result{}, err
		}
		ku := &unstructured.Unstructured{Object: m}
		unstructured.RemoveNestedField(ku.Object, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(ku.Object, "status")
		toDiff = append(toDiff, ku)
	}

	// 4. Diff each object against the live one (server-side dry-run, one field manager):
	// a changed digest is a policy change; an unchanged digest with a live difference is drift.
	var stores storev1.StoreList
	if err := r.Client.List(ctx, &stores); err != nil {
		return ctrl.Result{}, err
	}
	liveStores := map[string]*storev1.Store{}
	for i := range stores.Items {
		liveStores[stores.Items[i].Name] = &stores.Items[i]
	}
	var toApply []*unstructured.Unstructured
	applyOwners := map[string][]string{}
	var driftCount = map[string]int{"StorageClass": 0, "Agent": 0, "Store": 0}
	// Objects whose digest is unchanged and whose cached live copy still holds every field
	// Plinth sets need no server round trip: a no-op reconcile of 1,000 objects makes no
	// request for them. The rest go through the server-side dry-run.
	var needDiff []*unstructured.Unstructured
	for _, u := range toDiff {
		e, err := inventory.EntryOf(u)
		if err != nil {
			return ctrl.Result{}, err
		}
		if old, ok := prev.Get(e.ID()); ok && old.Digest == e.Digest && r.cachedSubset(ctx, u) {
			next.Put(e)
			continue
		}
		needDiff = append(needDiff, u)
	}
	toDiff = needDiff
	diffs, err := r.diffAll(ctx, toDiff)
	if err != nil {
		return ctrl.Result{}, err
	}
	for i, u := range toDiff {
		key := u.GetKind() + "/" + u.GetName()
		owners := ownersOf(key, rendered.Sources)
		e, err := inventory.EntryOf(u)
		if err != nil {
			return ctrl.Result{}, err
		}
		next.Put(e)
		if u.GetKind() == "Store" {
			if s := liveStores[u.GetName()]; s != nil && s.Annotations[AnnotationDraining] != "" {
				// Rendered again (the node got its label back): no longer draining.
				p := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, AnnotationDraining))
				if err := r.Client.Patch(ctx, s, client.RawPatch(types.MergePatchType, p), client.FieldOwner(r.FieldManager)); err != nil {
					return ctrl.Result{}, fmt.Errorf("clear draining mark of Store %s: %w", s.Name, err)
				}
			}
		}
		d := diffs[i]
		cse, live, merged, err := d.cse, d.live, d.merged, d.err
		if err != nil {
			for _, o := range owners {
				out.applyErr[o] = append(out.applyErr[o], fmt.Sprintf("%s: dry-run: %v", key, err))
			}
			continue
		}
		old, known := prev.Get(e.ID())
		sameDigest := known && old.Digest == e.Digest
		var item *drift.Item
		switch cse.Action {
		case ssa.CreatedAction:
			if sameDigest {
				item = &drift.Item{Kind: u.GetKind(), Name: u.GetName(), Deleted: true}
			}
		case ssa.ConfiguredAction:
			if sameDigest {
				item = &drift.Item{Kind: u.GetKind(), Name: u.GetName(), Fields: drift.Paths(live, merged)}
			}
		default:
			continue
		}
		if item == nil { // new object or policy change
			toApply = append(toApply, u)
			applyOwners[key] = owners
			continue
		}
		driftOwners := driftOwnersOf(u.GetKind(), owners)
		if r.correctDrift(u, placeByName, poolByName) {
			toApply = append(toApply, u)
			applyOwners[key] = owners
			for _, o := range driftOwners {
				out.corrected[o] = append(out.corrected[o], *item)
			}
			continue
		}
		driftCount[u.GetKind()]++
		for _, o := range driftOwners {
			out.drifted[o] = append(out.drifted[o], *item)
		}
	}

	// 5. Apply what changed, then replace what needs and may be replaced.
	if len(toApply) > 0 {
		cs, err := r.manager.ApplyAll(ctx, toApply, ssa.DefaultApplyOptions())
		if err != nil {
			blamed := false
			for key, owners := range applyOwners {
				if strings.Contains(err.Error(), key) || strings.Contains(err.Error(), strings.Replace(key, "/", "/", 1)) {
					blamed = true
					for _, o := range owners {
						out.applyErr[o] = append(out.applyErr[o], err.Error())
					}
				}
			}
			if !blamed {
				for _, owners := range applyOwners {
					for _, o := range owners {
						out.applyErr[o] = append(out.applyErr[o], err.Error())
					}
				}
			}
		} else {
			for _, e := range cs.Entries {
				if e.Action == ssa.CreatedAction || e.Action == ssa.ConfiguredAction {
					key := e.ObjMetadata.GroupKind.Kind + "/" + e.ObjMetadata.Name
					for _, o := range applyOwners[key] {
						out.applied[o] = append(out.applied[o], key+" "+string(e.Action))
					}
				}
			}
			log.Info("applied", "changes", len(cs.Entries))
		}
	}
	waiting := false
	for _, rp := range replacements {
		key := "Placement/" + rp.placement
		done, err := r.replace(ctx, rp.desired, rp.live)
		u, cerr := render.ToUnstructured(rp.desired)
		if cerr != nil {
			return ctrl.Result{}, cerr
		}
		e, _ := inventory.EntryOf(u)
		if err != nil {
			out.applyErr[key] = append(out.applyErr[key], err.Error())
			if old, ok := prev.Get(e.ID()); ok {
				next.Put(old)
			}
			continue
		}
		if !done {
			waiting = true
			out.replacing[key] = fmt.Sprintf("StorageClass %s deleted for replacement; waiting for the old object to go", rp.desired.Name)
			if old, ok := prev.Get(e.ID()); ok {
				next.Put(old)
			}
			continue
		}
		next.Put(e)
		out.replaced[key] = fmt.Sprintf("StorageClass %s replaced: %s", rp.desired.Name,
			storageclass.Describe(storageclass.Immutable(storageclass.Diff(rp.live, rp.desired))))
	}

	// 6. Prune what left the rendered set — from the inventory only (B38), never in use (B39).
	keptNodes := map[string]bool{}
	for _, e := range prev.Stale(next) {
		if _, ok := next.Get(e.ID()); ok {
			continue
		}
		live := e.Object()
		if err := r.APIReader.Get(ctx, types.NamespacedName{Name: e.Name}, live); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return ctrl.Result{}, fmt.Errorf("get %s: %w", e, err)
		}
		owners := ownersFromLabels(live)
		var pvcs int
		var vols storev1.VolumeStateList
		switch e.Kind {
		case "StorageClass":
			if pvcs, _, err = r.classUsage(ctx, e.Name); err != nil {
				return ctrl.Result{}, err
			}
		case "Store":
			if err := r.Client.List(ctx, &vols, client.MatchingFields{indexVolumeStor: e.Name}); err != nil {
				return ctrl.Result{}, err
			}
		}
		switch DecidePrune(live, pvcs, len(vols.Items), keptNodes) {
		case PruneKeepOptedOut:
			log.Info("left Git with pruning disabled: dropped from the inventory, kept", "object", e.String())
			continue
		case PruneKeepInUse:
			next.Put(e)
			out.inUse[e.Name] = pvcs
			continue
		case PruneDeleteInUse:
			pending, err := r.pendingClaims(ctx, e.Name)
			if err != nil {
				return ctrl.Result{}, err
			}
			msg := forcedPruneMessage(e.Name, pvcs, pending)
			out.forced[e.Name] = msg
			log.Info("pruning a StorageClass in use: "+AnnotationPrune+"="+PruneValueForce, "object", e.String(), "pvcs", pvcs, "pending", pending)
			if r.Recorder != nil {
				r.Recorder.Eventf(live, nil, corev1.EventTypeWarning, ReasonPrunedInUse, "Prune", "%s", msg)
			}
		case PruneKeepDraining:
			next.Put(e)
			if e.Kind != "Store" {
				continue
			}
			node, _, _ := unstructured.NestedString(live.Object, "spec", "nodeName")
			keptNodes[node] = true
			if live.GetAnnotations()[AnnotationDraining] == "" {
				p := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, AnnotationDraining))
				if err := r.Client.Patch(ctx, live, client.RawPatch(types.MergePatchType, p), client.FieldOwner(r.FieldManager)); err != nil {
					return ctrl.Result{}, fmt.Errorf("mark Store %s draining: %w", e.Name, err)
				}
				for _, o := range owners {
					r.event(o, objs, corev1.EventTypeWarning, ReasonDraining,
						fmt.Sprintf("Store %s left the policy but holds %d volumes: kept and marked draining", e.Name, len(vols.Items)))
				}
			}
			continue
		}
		if _, err := r.manager.Delete(ctx, live, ssa.DeleteOptions{PropagationPolicy: "Background", Exclusions: pruneDisabled}); err != nil {
			for _, o := range owners {
				out.applyErr[o] = append(out.applyErr[o], fmt.Sprintf("prune %s: %v", e, err))
			}
			next.Put(e)
			continue
		}
		log.Info("pruned", "object", e.String())
		for _, o := range owners {
			out.pruned[o] = append(out.pruned[o], e.String())
		}
	}
	// In-use classes of placements still in Git are reported too.
	for _, pl := range pol.Placements {
		if _, ok := out.inUse[pl.Spec.StorageClass.Name]; ok {
			continue
		}
		pvcs, _, err := r.classUsage(ctx, pl.Spec.StorageClass.Name)
		if err != nil {
			return ctrl.Result{}, err
		}
		out.inUse[pl.Spec.StorageClass.Name] = pvcs
	}

	// 7. Record the inventory (no write when unchanged).
	if _, err := r.Inventory.Save(ctx, prev, next); err != nil {
		return ctrl.Result{}, err
	}
	applied := map[string]int{"StorageClass": 0, "Agent": 0, "Store": 0}
	for _, e := range next.Entries() {
		applied[e.Kind]++
	}
	for k, n := range applied {
		AppliedObjects.WithLabelValues(k).Set(float64(n))
	}
	for k, n := range driftCount {
		DriftObjects.WithLabelValues("api", k).Set(float64(n))
	}

	// 8. Revisions, Store capacity, finalizers, status.
	rr := &revisionReader{reader: r.APIReader, cache: map[syncSource]string{}}
	for _, p := range objs {
		rev, ok, err := rr.revision(ctx, p.obj.GetLabels(), p.obj.GetAnnotations(), r.ArgoNamespace)
		if !ok {
			log.Info("cannot read the sync revision; keeping the last one", "object", p.key(), "error", err.Error())
			rev = p.status.LastAppliedRevision
		}
		out.revision[p.key()] = rev
	}
	if err := r.finishDeletedPlacements(ctx, deletingPlaces, out, objs); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.writeStatus(ctx, objs, out, rendered, stores.Items); err != nil {
		return ctrl.Result{}, err
	}
	if len(out.applyErr) > 0 {
		var msgs []string
		for k, m := range out.applyErr {
			msgs = append(msgs, k+": "+strings.Join(m, "; "))
		}
		sort.Strings(msgs)
		return ctrl.Result{}, errors.New(strings.Join(msgs, "\n"))
	}
	if waiting {
		return ctrl.Result{RequeueAfter: r.ReplacementPoll}, nil
	}
	return ctrl.Result{RequeueAfter: r.ResyncInterval}, nil
}

// cachedSubset reports whether the informer cache's copy of u holds every field u sets.
func (r *Reconciler) cachedSubset(ctx context.Context, u *unstructured.Unstructured) bool {
	o, err := r.Client.Scheme().New(u.GroupVersionKind())
	if err != nil {
		return false
	}
	obj, ok := o.(client.Object)
	if !ok {
		return false
	}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: u.GetName()}, obj); err != nil {
		return false
	}
	obj.GetObjectKind().SetGroupVersionKind(u.GroupVersionKind()) // typed cache objects carry no TypeMeta
	live, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return false
	}
	return drift.Subset(u.Object, live)
}

type diffResult struct {
	cse          *ssa.ChangeSetEntry
	live, merged *unstructured.Unstructured
	err          error
}

// diffAll runs the server-side dry-run diff of every object, 8 at a time (the API server
// serves them in parallel; a no-op reconcile of 1,000 objects is 2,000 reads and dry-runs).
func (r *Reconciler) diffAll(ctx context.Context, objs []*unstructured.Unstructured) ([]diffResult, error) {
	out := make([]diffResult, len(objs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, u := range objs {
		g.Go(func() error {
			cse, live, merged, err := r.manager.Diff(gctx, u, ssa.DefaultDiffOptions())
			out[i] = diffResult{cse: cse, live: live, merged: merged, err: err}
			return gctx.Err()
		})
	}
	return out, g.Wait()
}

// correctDrift says whether drift of u is corrected: a StorageClass follows the driftPolicy of
// its Placement's pool, a Store its own (the pool's), and Agents are always corrected.
func (r *Reconciler) correctDrift(u *unstructured.Unstructured, places map[string]*policyv1.Placement, pools map[string]*policyv1.StoragePool) bool {
	switch u.GetKind() {
	case "Agent":
		return true
	case "Store":
		dp, _, _ := unstructured.NestedString(u.Object, "spec", "driftPolicy")
		return dp == string(policyv1.DriftPolicyCorrect)
	case "StorageClass":
		pl := places[u.GetLabels()[policyv1.LabelPlacement]]
		if pl == nil {
			return false
		}
		p := pools[pl.Spec.PoolRef.Name]
		return p != nil && p.Spec.DriftPolicy == policyv1.DriftPolicyCorrect
	}
	return false
}

// replace deletes live and creates desired in its place (B36): the new object is validated
// first by a server dry-run create, the delete is preconditioned on live's UID, and an old
// object still present afterwards means "wait", not failure. It returns done=false while
// waiting.
func (r *Reconciler) replace(ctx context.Context, desired, live *storagev1.StorageClass) (bool, error) {
	want := storageclass.Replacement(desired, live)
	probe := want.DeepCopy()
	probe.Name = ""
	prefix := want.Name
	if len(prefix) > 200 {
		prefix = prefix[:200]
	}
	probe.GenerateName = prefix + "-"
	if err := r.Client.Create(ctx, probe, client.DryRunAll, client.FieldOwner(r.FieldManager)); err != nil {
		return false, fmt.Errorf("replacement StorageClass %s rejected by the API server (dry-run create): %w", want.Name, err)
	}
	uid := live.UID
	if err := r.Client.Delete(ctx, live, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return false, fmt.Errorf("delete StorageClass %s for replacement: %w", want.Name, err)
	}
	var now storagev1.StorageClass
	err := r.APIReader.Get(ctx, types.NamespacedName{Name: want.Name}, &now)
	switch {
	case err == nil && now.UID == uid:
		return false, nil // still going away
	case err == nil:
		return false, fmt.Errorf("StorageClass %s was recreated by someone else during the replacement", want.Name)
	case !apierrors.IsNotFound(err):
		return false, err
	}
	// Apply what policy renders; the preserved default-class annotation goes back to the
	// manager that owned it, so a later apply does not remove it as a field Plinth dropped.
	du, err := render.ToUnstructured(desired)
	if err != nil {
		return false, err
	}
	if _, err := r.manager.Apply(ctx, du, ssa.DefaultApplyOptions()); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return false, fmt.Errorf("create replacement StorageClass %s: %w", want.Name, err)
	}
	if v, ok := want.Annotations[storageclass.DefaultClassAnnotation]; ok && desired.Annotations[storageclass.DefaultClassAnnotation] == "" {
		owner := annotationOwner(live, storageclass.DefaultClassAnnotation)
		p := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, storageclass.DefaultClassAnnotation, v))
		created := &storagev1.StorageClass{}
		created.Name = want.Name
		if err := r.Client.Patch(ctx, created, client.RawPatch(types.MergePatchType, p), client.FieldOwner(owner)); err != nil {
			return false, fmt.Errorf("restore %s on StorageClass %s: %w", storageclass.DefaultClassAnnotation, want.Name, err)
		}
	}
	return true, nil
}

// annotationOwner returns the field manager that owns annotation key on obj, or
// "plinth-preserved" when none does.
func annotationOwner(obj client.Object, key string) string {
	needle := fmt.Sprintf("%q", "f:"+key)
	for _, mf := range obj.GetManagedFields() {
		if mf.FieldsV1 != nil && strings.Contains(string(mf.FieldsV1.Raw), needle) && mf.Manager != "" {
			return mf.Manager
		}
	}
	return "plinth-preserved"
}

// classUsage counts PVCs and PVs whose storageClassName is name (informer cache).
func (r *Reconciler) classUsage(ctx context.Context, name string) (pvcs, pvs int, err error) {
	var claims corev1.PersistentVolumeClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingFields{indexPVCClass: name}); err != nil {
		return 0, 0, fmt.Errorf("list PVCs of StorageClass %s: %w", name, err)
	}
	var vols corev1.PersistentVolumeList
	if err := r.Client.List(ctx, &vols, client.MatchingFields{indexPVClass: name}); err != nil {
		return 0, 0, fmt.Errorf("list PVs of StorageClass %s: %w", name, err)
	}
	return len(claims.Items), len(vols.Items), nil
}

// finishDeletedPlacements releases the in-use finalizer of Placements removed from Git once
// their StorageClass is gone or unused, and reports the ones still in use.
func (r *Reconciler) finishDeletedPlacements(ctx context.Context, deleting []*policyv1.Placement, out *outcome, objs []*policyObject) error {
	for _, pl := range deleting {
		if !controllerutil.ContainsFinalizer(pl, policyv1.FinalizerInUse) {
			continue
		}
		class := pl.Spec.StorageClass.Name
		if n := out.inUse[class]; n > 0 {
			// Still in use: the class was kept; say so on the Placement.
			p := &policyObject{obj: pl, kind: "Placement", status: &pl.Status, setter: pl, before: pl.DeepCopy(), beforeStatus: pl.Status.DeepCopy()}
			if c := conditions.Get(pl, meta.ReadyCondition); c != nil {
				p.oldReady = &condSnapshot{string(c.Status), c.Reason, c.Message}
			}
			msg := fmt.Sprintf("removed from Git; StorageClass %s is kept: in use by %d PVCs (existing volumes keep working; new PVCs and expansion need the class)", class, n)
			conditions.MarkFalse(pl, meta.ReadyCondition, ReasonInUse, "%s", msg)
			conditions.MarkReconciling(pl, ReasonInUse, "%s", msg)
			conditions.Delete(pl, meta.StalledCondition)
			pl.Status.ObservedGeneration = pl.Generation
			pl.Status.StorageClass = class
			n32 := int32(n)
			pl.Status.InUseBy = &n32
			r.emitTransition(p)
			if err := kerrors.FilterOut(r.patch(ctx, p), apierrors.IsNotFound); err != nil {
				return fmt.Errorf("patch Placement %s: %w", pl.Name, err)
			}
			continue
		}
		if msg := out.forced[class]; msg != "" && r.Recorder != nil {
			r.Recorder.Eventf(pl, nil, corev1.EventTypeWarning, ReasonPrunedInUse, "Prune", "%s", msg)
		}
		before := pl.DeepCopy()
		controllerutil.RemoveFinalizer(pl, policyv1.FinalizerInUse)
		if err := r.Client.Patch(ctx, pl, client.MergeFrom(before), client.FieldOwner(r.FieldManager)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("release finalizer of Placement %s: %w", pl.Name, err)
		}
	}
	return nil
}

// patch writes what changed on p since it was read: finalizers first (a merge patch with an
// optimistic lock), then the whole status in one merge patch of the status subresource, so a
// reader never sees new conditions with an old observedGeneration. Nothing changed, nothing sent.
func (r *Reconciler) patch(ctx context.Context, p *policyObject) error {
	if !equality.Semantic.DeepEqual(p.before.GetFinalizers(), p.obj.GetFinalizers()) {
		m := p.before.DeepCopyObject().(client.Object)
		m.SetFinalizers(p.obj.GetFinalizers())
		if err := r.Client.Patch(ctx, m, client.MergeFromWithOptions(p.before, client.MergeFromWithOptimisticLock{}), client.FieldOwner(r.FieldManager)); err != nil {
			return err
		}
	}
	if equality.Semantic.DeepEqual(p.beforeStatus, p.status) {
		return nil
	}
	s := p.obj.DeepCopyObject().(client.Object)
	return r.Client.Status().Patch(ctx, s, client.MergeFrom(p.before), client.FieldOwner(r.FieldManager))
}

// writeStatus sets every policy object's status from out and patches it; nothing is sent
// for an object whose status did not change.
func (r *Reconciler) writeStatus(ctx context.Context, objs []*policyObject, out *outcome, rendered *render.Output, stores []storev1.Store) error {
	var errs []error
	PolicyCondition.Reset()
	var invalidKeys []string
	for k := range out.invalid {
		invalidKeys = append(invalidKeys, k)
	}
	sort.Strings(invalidKeys)
	for _, p := range objs {
		key := p.key()
		obj := p.obj
		st := p.status
		st.ObservedGeneration = obj.GetGeneration()
		if p.kind == "Placement" {
			pl := obj.(*policyv1.Placement)
			controllerutil.AddFinalizer(pl, policyv1.FinalizerInUse)
			st.StorageClass = pl.Spec.StorageClass.Name
			if n, ok := out.inUse[pl.Spec.StorageClass.Name]; ok {
				n32 := int32(n)
				st.InUseBy = &n32
			}
		}
		switch {
		case len(out.invalid[key]) > 0:
			msg := strings.Join(out.invalid[key], "\n")
			conditions.MarkFalse(p.setter, meta.ReadyCondition, ReasonInvalidPolicy, "%s", msg)
			conditions.MarkStalled(p.setter, ReasonInvalidPolicy, "%s", msg)
			conditions.Delete(p.setter, meta.ReconcilingCondition)
		case out.setInvalid:
			msg := "not applied: the policy set has problems in " + strings.Join(invalidKeys, ", ")
			if len(out.invalid[""]) > 0 {
				msg += ": " + strings.Join(out.invalid[""], "; ")
			}
			conditions.MarkFalse(p.setter, meta.ReadyCondition, ReasonPolicySetInvalid, "%s", msg)
			conditions.MarkReconciling(p.setter, ReasonPolicySetInvalid, "%s", msg)
			conditions.Delete(p.setter, meta.StalledCondition)
		case len(out.applyErr[key]) > 0:
			msg := strings.Join(out.applyErr[key], "; ")
			conditions.MarkFalse(p.setter, meta.ReadyCondition, ReasonApplyFailed, "%s", msg)
			conditions.MarkReconciling(p.setter, ReasonApplyFailed, "%s", msg)
			conditions.Delete(p.setter, meta.StalledCondition)
		case out.replacement[key] != "":
			conditions.MarkFalse(p.setter, meta.ReadyCondition, ReasonReplacementRequired, "%s", out.replacement[key])
			conditions.MarkStalled(p.setter, ReasonReplacementRequired, "%s", out.replacement[key])
			conditions.Delete(p.setter, meta.ReconcilingCondition)
		case out.replacing[key] != "":
			conditions.MarkFalse(p.setter, meta.ReadyCondition, ReasonReplacementInProgress, "%s", out.replacing[key])
			conditions.MarkReconciling(p.setter, ReasonReplacementInProgress, "%s", out.replacing[key])
			conditions.Delete(p.setter, meta.StalledCondition)
		default:
			rev := out.revision[key]
			msg := readyMessage(p, out, rev)
			conditions.MarkTrue(p.setter, meta.ReadyCondition, ReasonApplied, "%s", msg)
			conditions.Delete(p.setter, meta.StalledCondition)
			conditions.Delete(p.setter, meta.ReconcilingCondition)
			st.LastAppliedRevision = rev
			if rendered != nil {
				st.Produced = sortRefs(out.produced[key])
			}
		}
		if !out.setInvalid {
			setDrifted(p, out.drifted[key], out.corrected[key])
		}
		if p.kind == "StoragePool" && rendered != nil {
			setPoolStatus(obj.(*policyv1.StoragePool), rendered, stores)
		}
		r.emitTransition(p)
		for _, it := range out.corrected[key] {
			r.event(key, objs, corev1.EventTypeNormal, ReasonDriftCorrected, "corrected "+it.String())
		}
		if len(out.applied[key]) > 0 {
			r.event(key, objs, corev1.EventTypeNormal, ReasonApplied, summarize(out.applied[key], 10))
		}
		if len(out.pruned[key]) > 0 {
			r.event(key, objs, corev1.EventTypeNormal, ReasonPruned, "pruned "+summarize(out.pruned[key], 10))
		}
		if m := out.replaced[key]; m != "" {
			r.event(key, objs, corev1.EventTypeWarning, ReasonReplaced, m)
		}
		for _, c := range st.Conditions {
			PolicyCondition.WithLabelValues(p.kind, obj.GetName(), c.Type, string(c.Status)).Set(1)
		}
		if err := r.patch(ctx, p); err != nil {
			// An object deleted meanwhile needs no status.
			if err := kerrors.FilterOut(err, apierrors.IsNotFound); err != nil {
				errs = append(errs, fmt.Errorf("patch %s: %w", key, err))
			}
		}

	}
	return errors.Join(errs...)
}

func readyMessage(p *policyObject, out *outcome, rev string) string {
	msg := ""
	switch p.kind {
	case "Placement":
		pl := p.obj.(*policyv1.Placement)
		msg = "StorageClass " + pl.Spec.StorageClass.Name + " applied"
		if n := out.inUse[pl.Spec.StorageClass.Name]; n > 0 {
			msg += fmt.Sprintf(", in use by %d PVCs", n)
		}
	case "StoragePool":
		msg = fmt.Sprintf("%d objects applied", len(out.produced[p.key()]))
	default:
		msg = fmt.Sprintf("used by %d StorageClasses", len(out.produced[p.key()]))
	}
	if m := out.replaced[p.key()]; m != "" {
		msg += "; " + m
	}
	if rev != "" {
		msg += "; revision " + rev
	}
	return msg
}

func setDrifted(p *policyObject, drifted, corrected []drift.Item) {
	switch {
	case len(drifted) > 0:
		conditions.MarkTrue(p.setter, DriftedCondition, ReasonDriftDetected, "%s (driftPolicy Report: not corrected)", drift.Summary(drifted, 10))
	case len(corrected) > 0:
		conditions.MarkFalse(p.setter, DriftedCondition, ReasonDriftCorrected, "corrected %s", drift.Summary(corrected, 10))
	default:
		c := conditions.Get(p.setter, DriftedCondition)
		if c != nil && c.Reason == ReasonDriftCorrected && c.ObservedGeneration == p.obj.GetGeneration() {
			return // keep saying what was last corrected until the policy changes
		}
		conditions.MarkFalse(p.setter, DriftedCondition, ReasonNoDrift, "no drift")
	}
}

// setPoolStatus fills matchedNodes, capacity and StoresReady from the render and the Stores.
func setPoolStatus(pool *policyv1.StoragePool, rendered *render.Output, stores []storev1.Store) {
	want := map[string]bool{}
	for _, s := range rendered.Stores {
		if s.Spec.Pool == pool.Name {
			want[s.Name] = true
		}
	}
	n := int32(len(want))
	pool.Status.MatchedNodes = &n
	capacity := &policyv1.PoolCapacity{}
	var notReady []string
	ready := 0
	for i := range stores {
		s := &stores[i]
		if !want[s.Name] {
			continue
		}
		if c := s.Status.Capacity; c != nil {
			capacity.Total += c.Total
			capacity.Allocatable += c.Allocatable
			capacity.Provisioned += c.Provisioned
			capacity.Available += c.Available
			capacity.ReportingStores++
		}
		if conditions.IsReady(s) {
			ready++
		} else {
			notReady = append(notReady, s.Name)
		}
	}
	pool.Status.Capacity = capacity
	sort.Strings(notReady)
	switch {
	case len(want) == 0:
		conditions.MarkUnknown(pool, StoresReadyCondition, ReasonStoresUnknown, "no node matches the nodeSelector")
	case ready == len(want):
		conditions.MarkTrue(pool, StoresReadyCondition, ReasonStoresReady, "%d of %d Stores ready", ready, len(want))
	case capacity.ReportingStores == 0 && ready == 0:
		conditions.MarkUnknown(pool, StoresReadyCondition, ReasonStoresUnknown, "%d Stores, no agent has reported yet", len(want))
	default:
		conditions.MarkFalse(pool, StoresReadyCondition, ReasonStoresNotReady, "%d of %d Stores ready; not ready: %s", ready, len(want), summarize(notReady, 10))
	}
}

// emitTransition records an event when the Ready condition changed.
func (r *Reconciler) emitTransition(p *policyObject) {
	c := conditions.Get(p.setter, meta.ReadyCondition)
	if c == nil || r.Recorder == nil {
		return
	}
	if p.oldReady != nil && p.oldReady.status == string(c.Status) && p.oldReady.reason == c.Reason && p.oldReady.message == c.Message {
		return
	}
	typ := corev1.EventTypeNormal
	if c.Status != "True" {
		typ = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(p.obj, nil, typ, c.Reason, "Reconcile", "%s", c.Message)
}

// event records an event on the tracked policy object named key, if it is tracked.
func (r *Reconciler) event(key string, objs []*policyObject, typ, reason, msg string) {
	if r.Recorder == nil {
		return
	}
	for _, p := range objs {
		if p.key() == key {
			r.Recorder.Eventf(p.obj, nil, typ, reason, "Reconcile", "%s", msg)
			return
		}
	}
}

// ownersOf returns the policy objects that produced key.
func ownersOf(key string, sources map[string][]string) []string { return sources[key] }

// driftOwnersOf narrows the owners on which drift is reported: a StorageClass's drift goes on
// its Placement, a Store's and an Agent's on their StoragePools.
func driftOwnersOf(kind string, owners []string) []string {
	want := "StoragePool/"
	if kind == "StorageClass" {
		want = "Placement/"
	}
	var out []string
	for _, o := range owners {
		if strings.HasPrefix(o, want) {
			out = append(out, o)
		}
	}
	return out
}

// ownersFromLabels names the policy objects of a live rendered object from its labels (the
// policy may be gone from the render).
func ownersFromLabels(u *unstructured.Unstructured) []string {
	l := u.GetLabels()
	var out []string
	if v := l[policyv1.LabelPlacement]; v != "" {
		out = append(out, "Placement/"+v)
	}
	if v := l[policyv1.LabelPool]; v != "" && u.GetKind() != "StorageClass" {
		out = append(out, "StoragePool/"+v)
	}
	if u.GetKind() == "Agent" {
		for _, p := range strings.Split(u.GetAnnotations()[render.AnnotationPools], ",") {
			if p != "" {
				out = append(out, "StoragePool/"+p)
			}
		}
	}
	return out
}

// pendingClaims counts the PVCs of StorageClass name still in phase Pending (informer cache):
// claims that can no longer be provisioned once the class is gone.
func (r *Reconciler) pendingClaims(ctx context.Context, name string) (int, error) {
	var claims corev1.PersistentVolumeClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingFields{indexPVCClass: name}); err != nil {
		return 0, fmt.Errorf("list PVCs of StorageClass %s: %w", name, err)
	}
	n := 0
	for i := range claims.Items {
		if claims.Items[i].Status.Phase == corev1.ClaimPending {
			n++
		}
	}
	return n, nil
}

// forcedPruneMessage says what deleting an in-use StorageClass leaves behind (field case B39):
// bound volumes keep working; resizing their claims is refused by admission without the class;
// Pending claims are never provisioned.
func forcedPruneMessage(class string, pvcs, pending int) string {
	return fmt.Sprintf("StorageClass %s deleted while in use by %d PVCs (%s=%s): existing PVs keep working, "+
		"but expansion of its PVCs will fail and its %d Pending PVCs will not be provisioned until a class of that name exists again",
		class, pvcs, AnnotationPrune, PruneValueForce, pending)
}

func usage(pvcs, pvs int) string {
	s := fmt.Sprintf("in use by %d PVCs", pvcs)
	if pvs > 0 {
		s += fmt.Sprintf(" and %d PVs", pvs)
	}
	return s
}

func summarize(items []string, max int) string {
	if len(items) <= max {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:max], ", ") + fmt.Sprintf(" and %d more", len(items)-max)
}

func sortRefs(refs []policyv1.ObjectReference) []policyv1.ObjectReference {
	out := append([]policyv1.ObjectReference(nil), refs...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Name < out[j].Name
	})
	return out
}
