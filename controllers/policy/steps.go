package policy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/fluxcd/pkg/ssa"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/plan"
	"github.com/plinth-storage/plinth/controllers/render"
	"github.com/plinth-storage/plinth/controllers/storageclass"
	"github.com/plinth-storage/plinth/internal/driftmetric"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

// ObjectError is a failed write (or a refused dry-run) of one rendered object: the error
// carries the object, so it is reported on the policy objects that produced it.
type ObjectError struct {
	// Op is "dry-run", "apply", "replace" or "prune".
	Op string
	// Kind and Name name the rendered object.
	Kind, Name string
	Err        error
}

// Error is "<op> <Kind>/<name>: <error>".
func (e *ObjectError) Error() string {
	return e.Op + " " + e.Kind + "/" + e.Name + ": " + e.Err.Error()
}

// Unwrap returns the API error.
func (e *ObjectError) Unwrap() error { return e.Err }

// vetSet vets the whole set; an invalid set changes nothing in the cluster. A Placement whose
// only problem is a reference to a pool or protocol not in the set (yet: both may arrive in
// the same sync) is recorded as waiting, so its status change is not announced as a warning.
func (r *Reconciler) vetSet(ctx context.Context, s *scope) (bool, error) {
	pol, problems := r.keptVet.VetObjects(s.pools, s.protos, s.places)
	if len(problems) == 0 {
		s.pol = pol
		return false, nil
	}
	s.setInvalid, s.judged = true, true
	for k, msgs := range problemsByObject(problems) {
		if k == "" {
			s.setProblems = append(s.setProblems, msgs...)
			continue
		}
		if kind, _, ok := cutKey(k); ok {
			ReconcileErrors.WithLabelValues(kind).Inc()
		}
		if p := s.owner(k); p != nil {
			p.out.invalid = msgs
		}
	}
	for _, p := range s.objs {
		p.out.waitingFor = missingReferences(p, problems, s)
	}
	ctrl.LoggerFrom(ctx).Info("policy set is invalid; nothing applied", "problems", len(problems))
	return true, nil
}

// missingReferences returns the policy objects p names that are not in the set, when every
// problem of p is such a reference (nil otherwise).
func missingReferences(p *policyObject, problems []vet.Problem, s *scope) []string {
	pl, ok := p.obj.(*policyv1.Placement)
	if !ok || len(p.out.invalid) == 0 {
		return nil
	}
	has := func(kind, name string) bool { _, ok := s.byKey[kind+"/"+name]; return ok }
	var missing []string
	for _, pr := range problems {
		if pr.Kind != "Placement" || pr.Name != pl.Name {
			continue
		}
		switch {
		case pr.Field == "spec.poolRef.name" && !has("StoragePool", pl.Spec.PoolRef.Name):
			missing = append(missing, "StoragePool/"+pl.Spec.PoolRef.Name)
		case pr.Field == "spec.protocolRef.name" && !has("Protocol", pl.Spec.ProtocolRef.Name):
			missing = append(missing, "Protocol/"+pl.Spec.ProtocolRef.Name)
		default:
			return nil
		}
	}
	return missing
}

// render renders the vetted set for the Nodes; render errors make the set invalid.
func (r *Reconciler) render(_ context.Context, s *scope) (bool, error) {
	rendered, err := r.renderer.Render(render.Input{Pools: s.pol.Pools, Protocols: s.pol.Protocols, Placements: s.pol.Placements, Nodes: s.nodes})
	if err != nil {
		s.setInvalid, s.judged = true, true
		for _, e := range render.Errors(err) {
			var re *render.Error
			if !errors.As(e, &re) {
				s.setProblems = append(s.setProblems, e.Error())
				continue
			}
			ReconcileErrors.WithLabelValues(re.Kind).Inc()
			if p := s.owner(re.Kind + "/" + re.Name); p != nil {
				p.out.invalid = append(p.out.invalid, re.Error())
			}
		}
		return true, nil
	}
	s.rendered = rendered
	for key, srcs := range rendered.Sources {
		kind, name, _ := cutKey(key)
		ref := policyv1.ObjectReference{APIVersion: storev1.GroupVersion.String(), Kind: kind, Name: name}
		switch kind {
		case "StorageClass":
			ref.APIVersion = "storage.k8s.io/v1"
		case policyv1.SnapshotClassKind:
			ref.APIVersion = policyv1.SnapshotClassAPIVersion
		case policyv1.GroupSnapshotClassKind:
			ref.APIVersion = policyv1.GroupSnapshotClassAPIVersion
		case render.AttributesClassKind:
			ref.APIVersion = "storage.k8s.io/v1"
		}
		s.each(srcs, func(p *policyObject) { p.out.produced = append(p.out.produced, ref) })
	}
	return false, nil
}

// makePlan decides everything the rest of the reconcile does (controllers/plan), and records
// on the policy objects what needs no write to be known: blocked replacements, refused
// dry-runs, drift.
func (r *Reconciler) makePlan(ctx context.Context, s *scope) (bool, error) {
	desired, err := r.renderer.Unstructured(s.rendered) // the objects not rendered anew are the kept ones
	if err != nil {
		return false, err
	}
	if s.prev, err = r.Inventory.Load(ctx); err != nil {
		return false, err
	}
	var stores storev1.StoreList
	if err := r.Client.List(ctx, &stores); err != nil {
		return false, err
	}
	s.stores = stores.Items
	in := plan.Input{Desired: desired, Sources: s.rendered.Sources, Previous: s.prev, Kept: &r.kept,
		Placements: map[string]*policyv1.Placement{}, Pools: map[string]*policyv1.StoragePool{}}
	for i := range s.pol.Placements {
		in.Placements[s.pol.Placements[i].Name] = &s.pol.Placements[i]
	}
	for i := range s.pol.Pools {
		in.Pools[s.pol.Pools[i].Name] = &s.pol.Pools[i]
	}
	src := &plan.Cluster{Counter: indexedCounter{r.Client}, Reader: r.APIReader, Cache: r.Client, Manager: r.manager, Concurrency: 8, Kept: &r.kept}
	if s.plan, err = plan.Make(ctx, in, src); err != nil {
		return false, err
	}
	s.next = inventory.WithCapacity(len(s.plan.Objects))
	for i := range s.plan.Classes {
		if cc := &s.plan.Classes[i]; cc.Blocked() != "" {
			s.each([]string{"Placement/" + cc.Placement}, func(p *policyObject) { p.out.replacementRequired = cc.Blocked() })
		}
	}
	for i := range s.plan.Objects {
		o := &s.plan.Objects[i]
		s.next.Put(o.Entry)
		switch {
		case o.Action == plan.Rejected:
			s.fail(&ObjectError{Op: "dry-run", Kind: o.Object.GetKind(), Name: o.Object.GetName(), Err: o.DryRunErr}, o.Owners)
		case o.Action == plan.Drift && o.Correct:
			s.each(o.DriftOwners(), func(p *policyObject) { p.out.corrected = append(p.out.corrected, *o.Drift) })
		case o.Action == plan.Drift:
			s.driftCount[o.Object.GetKind()]++
			s.each(o.DriftOwners(), func(p *policyObject) { p.out.drifted = append(p.out.drifted, *o.Drift) })
		}
	}
	return false, nil
}

// undrain clears the draining mark of a rendered Store: it is rendered again (its node got
// its label back).
func (r *Reconciler) undrain(ctx context.Context, s *scope) (bool, error) {
	rendered := map[string]bool{}
	for i := range s.plan.Objects {
		if o := s.plan.Objects[i].Object; o.GetKind() == "Store" {
			rendered[o.GetName()] = true
		}
	}
	for i := range s.stores {
		st := &s.stores[i]
		if !rendered[st.Name] || st.Annotations[AnnotationDraining] == "" {
			continue
		}
		p := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, AnnotationDraining))
		if err := r.Client.Patch(ctx, st, client.RawPatch(types.MergePatchType, p), client.FieldOwner(r.FieldManager)); err != nil {
			return false, fmt.Errorf("clear draining mark of Store %s: %w", st.Name, err)
		}
	}
	return false, nil
}

// applyConcurrency bounds the server-side applies of one kind in flight; the client's QPS and
// burst (--kube-api-qps, --kube-api-burst) bound their rate. controller-runtime's client keeps
// one rate limiter per resource type (a REST client per GroupVersionKind, each with its own
// token bucket of that QPS and burst), so each kind applied at once drains its own bucket.
const applyConcurrency = 8

// applyValidation asks the API server not to decode an apply body a second time. Without a
// fieldValidation parameter the server runs Warn: after decoding the apply patch it decodes it
// again strictly (sigs.k8s.io/yaml UnmarshalStrict into a map), which can only find duplicate
// keys — a field unknown to the schema fails the apply itself, whatever the directive (the
// field manager's typed conversion). The body is applyBody's encoding of one Go map, which
// has no duplicate keys, so the second decode finds nothing and costs the API server a
// YAML-to-JSON conversion and a JSON decode of every apply (4-5 % of its CPU profile during
// the fleet's first apply).
const applyValidation = client.FieldValidation(metav1.FieldValidationIgnore)

// applyStage is the stage in which objects of kind are applied: StorageClasses first, then
// Agents and Stores together (neither refers to the other: an agent serves its Stores and
// publishes its Agent's status independently), then any other kind. A stage starts when the
// one before it has finished.
func applyStage(kind string) int {
	switch inventory.KindOrder(kind) {
	case 0:
		return 0
	case 1, 2:
		return 1
	default:
		return 2
	}
}

// apply applies what policy changed and the drift to correct: one server-side apply per
// object under the controller's field manager with forced ownership — the request
// fluxcd/pkg/ssa's ApplyAll sends once its own dry-run found a change. That dry-run would be
// the second one here: the plan already decided, from a dry-run or (for objects new to the
// inventory and to the cache) from the informer cache, that each of these objects changes.
// Objects go stage by stage (applyStage); within a stage every kind applies at once, up to
// applyConcurrency objects of each kind in flight; a failed apply carries its object and is
// reported on the object's owners, the others still apply.
func (r *Reconciler) apply(ctx context.Context, s *scope) (bool, error) {
	var todo []*plan.Object
	for i := range s.plan.Objects {
		if o := &s.plan.Objects[i]; o.Apply() {
			todo = append(todo, o)
		}
	}
	if len(todo) == 0 {
		return false, nil
	}
	sort.SliceStable(todo, func(i, j int) bool {
		return inventory.KindOrder(todo[i].Object.GetKind()) < inventory.KindOrder(todo[j].Object.GetKind())
	})
	errs := make([]error, len(todo))
	applyKind := func(lo, hi int) {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(applyConcurrency)
		for i := lo; i < hi; i++ {
			g.Go(func() error {
				u := todo[i].Object.DeepCopy() // the response lands in u; the plan keeps the render
				body, err := applyBody(u.Object)
				if err != nil {
					errs[i] = err
					return nil
				}
				// the apply fluxcd/pkg/ssa sends, its body in block-style YAML (applyBody)
				errs[i] = r.Client.Patch(gctx, u, client.RawPatch(types.ApplyYAMLPatchType, body), client.ForceOwnership, client.FieldOwner(r.FieldManager), applyValidation)
				return nil
			})
		}
		_ = g.Wait() // the goroutines return no error: each apply's is kept in errs
	}
	for lo := 0; lo < len(todo); {
		stage := applyStage(todo[lo].Object.GetKind())
		var kinds sync.WaitGroup
		for lo < len(todo) && applyStage(todo[lo].Object.GetKind()) == stage {
			hi := lo
			for hi < len(todo) && todo[hi].Object.GetKind() == todo[lo].Object.GetKind() {
				hi++
			}
			from, to := lo, hi
			kinds.Go(func() { applyKind(from, to) })
			lo = hi
		}
		kinds.Wait()
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	changes := 0
	for i, o := range todo {
		if errs[i] != nil {
			s.fail(&ObjectError{Op: "apply", Kind: o.Object.GetKind(), Name: o.Object.GetName(), Err: errs[i]}, o.Owners)
			continue
		}
		a := ssa.ConfiguredAction
		if o.Action == plan.Create {
			a = ssa.CreatedAction
		}
		changes++
		s.each(o.Owners, func(p *policyObject) { p.out.applied = append(p.out.applied, o.Key()+" "+string(a)) })
	}
	ctrl.LoggerFrom(ctx).Info("applied", "changes", changes, "failed", len(todo)-changes)
	return false, nil
}

// replaceClasses replaces the StorageClasses the plan allows to replace; an old class still
// going away makes the reconcile look again soon.
func (r *Reconciler) replaceClasses(ctx context.Context, s *scope) (bool, error) {
	for _, cc := range s.plan.Replacements() {
		key := "Placement/" + cc.Placement
		done, err := r.replace(ctx, cc.Desired, cc.Live)
		if err != nil || !done {
			if old, ok := s.prev.Get(cc.Entry.ID()); ok {
				s.next.Put(old) // the old class stays recorded until the new one is applied
			}
		}
		switch {
		case err != nil:
			s.fail(&ObjectError{Op: "replace", Kind: "StorageClass", Name: cc.Desired.Name, Err: err}, []string{key})
		case !done:
			s.waiting = true
			s.each([]string{key}, func(p *policyObject) {
				p.out.replacing = fmt.Sprintf("StorageClass %s deleted for replacement; waiting for the old object to go", cc.Desired.Name)
			})
		default:
			s.next.Put(cc.Entry)
			s.each([]string{key}, func(p *policyObject) {
				p.out.replaced = fmt.Sprintf("StorageClass %s replaced: %s", cc.Desired.Name, describeChanges(cc))
			})
		}
	}
	return false, nil
}

// prune carries out the plan's prune verdicts: delete, keep in use, keep draining (marking the
// Store), or drop an opted-out object from the inventory.
func (r *Reconciler) prune(ctx context.Context, s *scope) (bool, error) {
	log := ctrl.LoggerFrom(ctx)
	for i := range s.plan.Prunes {
		pr := &s.plan.Prunes[i]
		e, live := pr.Entry, pr.Live
		switch pr.Verdict {
		case plan.PruneKeepOptedOut:
			log.Info("left Git with pruning disabled: dropped from the inventory, kept", "object", klog.KObj(live), "kind", e.Kind)
			continue
		case plan.PruneKeepInUse:
			s.next.Put(e)
			s.inUse[e.Name] = pr.Usage.PVCs
			continue
		case plan.PruneKeepDraining:
			s.next.Put(e)
			if err := r.markDraining(ctx, s, pr); err != nil {
				return false, err
			}
			continue
		case plan.PruneDeleteInUse:
			msg := forcedPruneMessage(e.Name, pr.Usage.PVCs, pr.Usage.Pending)
			s.forced[e.Name] = msg
			log.Info("pruning a StorageClass in use: "+AnnotationPrune+"="+PruneValueForce, "object", klog.KObj(live), "pvcs", pr.Usage.PVCs, "pending", pr.Usage.Pending)
			if r.Recorder != nil {
				r.Recorder.Eventf(live, nil, corev1.EventTypeWarning, ReasonPrunedInUse, "Prune", "%s", msg)
			}
		}
		if _, err := r.manager.Delete(ctx, live, ssa.DeleteOptions{PropagationPolicy: "Background", Exclusions: plan.PruneExclusions()}); err != nil {
			s.fail(&ObjectError{Op: "prune", Kind: e.Kind, Name: e.Name, Err: err}, pr.Owners)
			s.next.Put(e)
			continue
		}
		log.Info("pruned", "object", klog.KObj(live), "kind", e.Kind)
		s.each(pr.Owners, func(p *policyObject) { p.out.pruned = append(p.out.pruned, e.String()) })
	}
	return false, nil
}

// markDraining marks a Store kept for its volumes draining, once, and says so on its pools.
func (r *Reconciler) markDraining(ctx context.Context, s *scope, pr *plan.Prune) error {
	if pr.Entry.Kind != "Store" || pr.Live.GetAnnotations()[AnnotationDraining] != "" {
		return nil
	}
	p := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, AnnotationDraining))
	if err := r.Client.Patch(ctx, pr.Live, client.RawPatch(types.MergePatchType, p), client.FieldOwner(r.FieldManager)); err != nil {
		return fmt.Errorf("mark Store %s draining: %w", pr.Entry.Name, err)
	}
	msg := fmt.Sprintf("Store %s left the policy but holds %d volumes: kept and marked draining", pr.Entry.Name, pr.Usage.Volumes)
	s.each(pr.Owners, func(p *policyObject) { r.event(p, corev1.EventTypeWarning, ReasonDraining, msg) })
	return nil
}

// countUsage counts the PVCs of the StorageClasses of the Placements still in Git (the ones
// that left were counted by prune).
func (r *Reconciler) countUsage(ctx context.Context, s *scope) (bool, error) {
	c := indexedCounter{r.Client}
	for _, pl := range s.pol.Placements {
		if _, ok := s.inUse[pl.Spec.StorageClass.Name]; ok {
			continue
		}
		u, err := c.ClassUsage(ctx, pl.Spec.StorageClass.Name)
		if err != nil {
			return false, err
		}
		s.inUse[pl.Spec.StorageClass.Name] = u.PVCs
	}
	return false, nil
}

// saveInventory records the inventory (no write when unchanged) and the object metrics.
func (r *Reconciler) saveInventory(ctx context.Context, s *scope) (bool, error) {
	if _, err := r.Inventory.Save(ctx, s.prev, s.next); err != nil {
		return false, err
	}
	applied := map[string]int{"StorageClass": 0, "Agent": 0, "Store": 0}
	for k, n := range s.next.KindCounts() {
		applied[k] = n
	}
	for k, n := range applied {
		AppliedObjects.WithLabelValues(k).Set(float64(n))
	}
	for k, n := range s.driftCount {
		DriftObjects.WithLabelValues(driftmetric.SourceAPI, k).Set(float64(n))
	}
	return false, nil
}

// readRevisions reads the sync revision of every policy object: the revision applied, and a
// newer one the sync tool refused; an object whose sync tool cannot be read keeps the last
// revision and its Synced condition.
func (r *Reconciler) readRevisions(ctx context.Context, s *scope) (bool, error) {
	rr := &revisionReader{reader: r.APIReader, cache: map[syncSource]syncRevision{}}
	for _, p := range s.objs {
		rev, ok, err := rr.revision(ctx, p.obj.GetLabels(), p.obj.GetAnnotations(), r.ArgoNamespace)
		if !ok {
			ctrl.LoggerFrom(ctx).Info("cannot read the sync revision; keeping the last one", "object", klog.KObj(p.obj), "kind", p.kind, "error", err.Error())
			p.out.revision = p.status.LastAppliedRevision
			continue
		}
		p.out.revision = rev.applied
		p.out.sync = &rev
	}
	return false, nil
}

// indexedCounter counts usage from the informer cache's field indexes (IndexFields).
type indexedCounter struct{ c client.Reader }

// ClassUsage implements plan.Counter.
func (ic indexedCounter) ClassUsage(ctx context.Context, name string) (plan.Usage, error) {
	var claims corev1.PersistentVolumeClaimList
	if err := ic.c.List(ctx, &claims, client.MatchingFields{indexPVCClass: name}); err != nil {
		return plan.Usage{}, fmt.Errorf("list PVCs of StorageClass %s: %w", name, err)
	}
	var vols corev1.PersistentVolumeList
	if err := ic.c.List(ctx, &vols, client.MatchingFields{indexPVClass: name}); err != nil {
		return plan.Usage{}, fmt.Errorf("list PVs of StorageClass %s: %w", name, err)
	}
	u := plan.Usage{PVCs: len(claims.Items), PVs: len(vols.Items), Known: true}
	for i := range claims.Items {
		if claims.Items[i].Status.Phase == corev1.ClaimPending {
			u.Pending++
		}
	}
	return u, nil
}

// AttributesClassUsage implements plan.Counter: the PVCs that name VolumeAttributesClass
// name (asked for, in force or the target of a modification) and the PVs that name it.
func (ic indexedCounter) AttributesClassUsage(ctx context.Context, name string) (plan.Usage, error) {
	var claims corev1.PersistentVolumeClaimList
	if err := ic.c.List(ctx, &claims, client.MatchingFields{indexPVCAttrClass: name}); err != nil {
		return plan.Usage{}, fmt.Errorf("list PVCs of VolumeAttributesClass %s: %w", name, err)
	}
	var vols corev1.PersistentVolumeList
	if err := ic.c.List(ctx, &vols, client.MatchingFields{indexPVAttrClass: name}); err != nil {
		return plan.Usage{}, fmt.Errorf("list PVs of VolumeAttributesClass %s: %w", name, err)
	}
	return plan.Usage{PVCs: len(claims.Items), PVs: len(vols.Items), Known: true}, nil
}

// StoreUsage implements plan.Counter.
func (ic indexedCounter) StoreUsage(ctx context.Context, name string) (plan.Usage, error) {
	var vols storev1.VolumeStateList
	if err := ic.c.List(ctx, &vols, client.MatchingFields{indexVolumeStor: name}); err != nil {
		return plan.Usage{}, fmt.Errorf("list VolumeStates of Store %s: %w", name, err)
	}
	return plan.Usage{Volumes: len(vols.Items), Known: true}, nil
}

// forcedPruneMessage says what deleting an in-use StorageClass leaves behind:
// bound volumes keep working; resizing their claims is refused by admission without the class;
// Pending claims are never provisioned.
func forcedPruneMessage(class string, pvcs, pending int) string {
	return fmt.Sprintf("StorageClass %s deleted while in use by %d PVCs (%s=%s): existing PVs keep working, "+
		"but expansion of its PVCs will fail and its %d Pending PVCs will not be provisioned until a class of that name exists again",
		class, pvcs, AnnotationPrune, PruneValueForce, pending)
}

// cutKey splits "Kind/name".
func cutKey(key string) (kind, name string, ok bool) { return strings.Cut(key, "/") }

// describeChanges says which immutable fields of a replaced class changed.
func describeChanges(cc *plan.ClassChange) string { return storageclass.Describe(cc.Immutable) }
