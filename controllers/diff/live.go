package diff

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/fluxcd/pkg/ssa"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/controllers/render"
	"github.com/plinth-storage/plinth/controllers/storageclass"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

// DefaultNamespace is where the controller keeps its inventory ConfigMap in the shipped
// manifests (kustomize/).
const DefaultNamespace = "plinth-system"

// LiveOptions configure Live.
type LiveOptions struct {
	// Client reads the cluster and sends the server-side dry-runs; its scheme must hold the
	// core kinds and Plinth's two API groups (policy.Scheme). Nothing is ever written.
	Client client.Client
	// Namespace and InventoryName locate the controller's inventory ConfigMap (defaults
	// DefaultNamespace and inventory.DefaultName): the record prune trusts.
	Namespace, InventoryName string
	// FieldManager is the controller's field manager (default policy.DefaultFieldManager):
	// the dry-runs apply as the controller would.
	FieldManager string
	// Concurrency bounds the dry-runs in flight (default 4).
	Concurrency int
}

// Live compares the policy tree at paths with the live cluster: it vets and renders the tree
// for the cluster's Nodes, dry-runs each rendered object with server-side apply under the
// controller's field manager (fluxcd/pkg/ssa, as the controller's drift detection does),
// classifies StorageClasses whose immutable fields change (controllers/storageclass), and
// predicts pruning from the controller's inventory ConfigMap with the controller's rules. The
// error is for API and I/O failures; an invalid tree is a report with Problems.
func Live(ctx context.Context, paths []string, o LiveOptions) (*Report, error) {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.InventoryName == "" {
		o.InventoryName = inventory.DefaultName
	}
	if o.FieldManager == "" {
		o.FieldManager = policy.DefaultFieldManager
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	rep := &Report{Mode: ModeLive, Paths: paths}
	v, err := vet.NewVetter()
	if err != nil {
		return nil, err
	}
	after, problems, err := loadTree(v, paths)
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		rep.Problems = problems
		return rep, nil
	}

	c := o.Client
	cl, err := readCluster(ctx, c)
	if err != nil {
		return nil, err
	}
	before := newPolicySet(cl.policy, nil)
	rendered, problems := renderSet(after, cl.nodes)
	if len(problems) > 0 {
		rep.Problems = problems
		return rep, nil
	}
	desired, err := rendered.Unstructured()
	if err != nil {
		return nil, err
	}
	prev, err := (&inventory.Store{Client: c, Reader: c, Namespace: o.Namespace, Name: o.InventoryName}).Load(ctx)
	if err != nil {
		return nil, err
	}
	m := ssa.NewResourceManager(c, nil, ssa.Owner{Field: o.FieldManager, Group: policyv1.GroupVersion.Group})
	b := &builder{rep: rep, before: before, after: after, cl: cl, sources: rendered.Sources, fallback: paths[0]}

	// 1. StorageClasses whose immutable fields change, classified as the controller does.
	next := inventory.New()
	var toDiff []*unstructured.Unstructured
	blocked := map[string]bool{}
	for _, u := range desired {
		e, err := inventory.EntryOf(u)
		if err != nil {
			return nil, err
		}
		next.Put(e)
		if u.GetKind() != "StorageClass" {
			toDiff = append(toDiff, u)
			continue
		}
		var want, live storagev1.StorageClass
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &want); err != nil {
			return nil, err
		}
		err = c.Get(ctx, types.NamespacedName{Name: want.Name}, &live)
		if apierrors.IsNotFound(err) {
			toDiff = append(toDiff, u)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get StorageClass %s: %w", want.Name, err)
		}
		changes := storageclass.Diff(&live, &want)
		imm := storageclass.Immutable(changes)
		if len(imm) == 0 {
			toDiff = append(toDiff, u)
			continue
		}
		if b.replacement(&want, changes, imm) {
			continue
		}
		ku, err := render.ToUnstructured(storageclass.KeepImmutable(&want, &live))
		if err != nil {
			return nil, err
		}
		blocked[ku.GetName()] = true
		toDiff = append(toDiff, ku)
	}

	// 2. Server-side dry-run of the rest, as the controller's drift detection runs it.
	results := make([]diffResult, len(toDiff))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Concurrency)
	for i, u := range toDiff {
		g.Go(func() error {
			cse, live, merged, err := m.Diff(gctx, u, ssa.DefaultDiffOptions())
			results[i] = diffResult{cse: cse, live: live, merged: merged, err: err}
			return gctx.Err()
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i, u := range toDiff {
		r := results[i]
		key := u.GetKind() + "/" + u.GetName()
		if r.err != nil {
			b.ownerViolation(key, RuleDryRunRejected, fmt.Sprintf("the API server rejects %s: %v", key, r.err))
			continue
		}
		e, _ := inventory.EntryOf(u)
		old, known := prev.Get(e.ID())
		same := known && old.Digest == e.Digest
		oc := ObjectChange{Kind: u.GetKind(), Name: u.GetName()}
		if blocked[u.GetName()] && u.GetKind() == "StorageClass" {
			oc.Reason = "immutable fields kept: replacement not allowed"
		}
		switch r.cse.Action {
		case ssa.CreatedAction:
			oc.Action = ActionCreate
			if same {
				oc.Action, oc.Reason = ActionDrift, "deleted outside Plinth"
			} else if u.GetKind() == "Store" {
				b.storeAdded(u)
			}
		case ssa.ConfiguredAction:
			oc.Action, oc.Fields = ActionChange, drift.Paths(r.live, r.merged)
			if same {
				oc.Action, oc.Reason = ActionDrift, "edited outside Plinth"
			}
		default:
			rep.Counts.Unchanged++
			continue
		}
		rep.Objects = append(rep.Objects, oc)
	}

	// 3. Prune, from the inventory only, with the controller's rules (B38, B39).
	keptNodes := map[string]bool{}
	for _, e := range prev.Stale(next) {
		live := e.Object()
		if err := c.Get(ctx, types.NamespacedName{Name: e.Name}, live); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("get %s: %w", e, err)
		}
		b.stale(live, keptNodes)
	}

	b.capacity()
	b.protocolChanges()
	rep.Policy = policyChanges(before, after, func(string, string) (string, int) { return "", 0 })
	b.finish()
	return rep, nil
}

type diffResult struct {
	cse          *ssa.ChangeSetEntry
	live, merged *unstructured.Unstructured
	err          error
}

// cluster is what Live reads from the API server.
type cluster struct {
	nodes  []corev1.Node
	policy *vet.Policies
	stores map[string]*storev1.Store
	// volumes by Store name; claims and PVs by StorageClass name; pvs by CSI volume handle.
	volumes map[string][]storev1.VolumeState
	claims  map[string][]corev1.PersistentVolumeClaim
	pvs     map[string][]corev1.PersistentVolume
	pvByID  map[string]*corev1.PersistentVolume
}

func readCluster(ctx context.Context, c client.Client) (*cluster, error) {
	var (
		nodes  corev1.NodeList
		pools  policyv1.StoragePoolList
		protos policyv1.ProtocolList
		places policyv1.PlacementList
		stores storev1.StoreList
		vols   storev1.VolumeStateList
		claims corev1.PersistentVolumeClaimList
		pvs    corev1.PersistentVolumeList
	)
	for _, l := range []client.ObjectList{&nodes, &pools, &protos, &places, &stores, &vols, &claims, &pvs} {
		if err := c.List(ctx, l); err != nil {
			return nil, fmt.Errorf("list %T: %w", l, err)
		}
	}
	// The live policy as the controller vets it (objects being deleted are gone from Git).
	var lp []policyv1.StoragePool
	var lr []policyv1.Protocol
	var ll []policyv1.Placement
	for _, o := range pools.Items {
		if o.DeletionTimestamp.IsZero() {
			lp = append(lp, o)
		}
	}
	for _, o := range protos.Items {
		if o.DeletionTimestamp.IsZero() {
			lr = append(lr, o)
		}
	}
	for _, o := range places.Items {
		if o.DeletionTimestamp.IsZero() {
			ll = append(ll, o)
		}
	}
	v, err := vet.NewVetter()
	if err != nil {
		return nil, err
	}
	pol, _ := policy.VetObjects(v, lp, lr, ll)
	cl := &cluster{nodes: nodes.Items, policy: pol, stores: map[string]*storev1.Store{},
		volumes: map[string][]storev1.VolumeState{}, claims: map[string][]corev1.PersistentVolumeClaim{},
		pvs: map[string][]corev1.PersistentVolume{}, pvByID: map[string]*corev1.PersistentVolume{}}
	for i := range stores.Items {
		cl.stores[stores.Items[i].Name] = &stores.Items[i]
	}
	for _, v := range vols.Items {
		cl.volumes[v.Spec.StoreName] = append(cl.volumes[v.Spec.StoreName], v)
	}
	for _, p := range claims.Items {
		if p.Spec.StorageClassName != nil && *p.Spec.StorageClassName != "" {
			cl.claims[*p.Spec.StorageClassName] = append(cl.claims[*p.Spec.StorageClassName], p)
		}
	}
	for i := range pvs.Items {
		p := &pvs.Items[i]
		if p.Spec.StorageClassName != "" {
			cl.pvs[p.Spec.StorageClassName] = append(cl.pvs[p.Spec.StorageClassName], *p)
		}
		if p.Spec.CSI != nil && p.Spec.CSI.Driver == policyv1.DriverName {
			cl.pvByID[p.Spec.CSI.VolumeHandle] = p
		}
	}
	return cl, nil
}

// builder fills a report from what a comparison found.
type builder struct {
	rep           *Report
	before, after *policySet
	// cl is nil offline.
	cl       *cluster
	sources  map[string][]string
	fallback string
	// draining holds the Stores kept draining (live) and removed holds every Store that
	// leaves the policy, by name.
	removed map[string]*StoreRemoval
	added   []StoreRef
	// ongoingNodes are nodes whose Stores were draining before this change.
	ongoingNodes map[string]bool
}

// replacement records a StorageClass whose immutable fields change and says whether the
// controller replaces it now (policy.ReplacementAllowed, the controller's own rule).
func (b *builder) replacement(want *storagev1.StorageClass, changes, imm []storageclass.Change) bool {
	placement := want.Labels[policyv1.LabelPlacement]
	p := policy.EffectiveReplacement(b.after.places[placement])
	ci := ClassImpact{Name: want.Name, Placement: placement, Action: ActionReplace, Changes: imm, Replacement: string(p), AllowedKnown: true}
	b.usage(&ci)
	pvcs, pvs := len(ci.Claims), len(ci.Volumes)
	switch {
	case b.cl == nil && p == policyv1.ReplacementIfUnused:
		ci.AllowedKnown = false
		ci.Outcome = "replacement IfUnused: replaced if no PVC or PV uses it (usage is not known offline); kept otherwise, Placement " + placement + " stalls with ReplacementRequired"
	case policy.ReplacementAllowed(p, pvcs, pvs):
		ci.Allowed = true
		ci.Outcome = fmt.Sprintf("replacement %s: replaced (deleted, then created with the new fields)", p)
		if pvcs+pvs > 0 {
			ci.Outcome += "; bound PVs keep working with the policy frozen at their creation"
		}
	case p == policyv1.ReplacementIfUnused:
		ci.Outcome = fmt.Sprintf("not replaced (replacement IfUnused, %s): kept as it is, in-place fields applied; Placement %s stalls with ReplacementRequired", usageText(pvcs, pvs), placement)
	default:
		ci.Outcome = fmt.Sprintf("not replaced (replacement Never): kept as it is, in-place fields applied; Placement %s stalls with ReplacementRequired", placement)
	}
	b.rep.Storage.Classes = append(b.rep.Storage.Classes, ci)
	if !ci.Allowed && ci.AllowedKnown {
		return false
	}
	fields := make([]string, len(changes))
	for i, ch := range changes {
		fields[i] = ch.Field
	}
	b.rep.Objects = append(b.rep.Objects, ObjectChange{Kind: "StorageClass", Name: want.Name, Action: ActionReplace,
		Fields: fields, Reason: storageclass.Describe(imm)})
	return true
}

// usage fills the claims and PVs of a class (live only).
func (b *builder) usage(ci *ClassImpact) {
	if b.cl == nil {
		return
	}
	for _, p := range b.cl.claims[ci.Name] {
		cl := Claim{Namespace: p.Namespace, Name: p.Name, Phase: string(p.Status.Phase), Volume: p.Spec.VolumeName}
		if q, ok := p.Status.Capacity[corev1.ResourceStorage]; ok {
			cl.SizeBytes = q.Value()
		} else if q, ok := p.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
			cl.SizeBytes = q.Value()
		}
		ci.Claims = append(ci.Claims, cl)
	}
	sort.Slice(ci.Claims, func(i, j int) bool {
		return ci.Claims[i].Namespace+"/"+ci.Claims[i].Name < ci.Claims[j].Namespace+"/"+ci.Claims[j].Name
	})
	for _, p := range b.cl.pvs[ci.Name] {
		pv := PV{Name: p.Name}
		if q, ok := p.Spec.Capacity[corev1.ResourceStorage]; ok {
			pv.SizeBytes = q.Value()
		}
		if r := p.Spec.ClaimRef; r != nil {
			pv.Claim = r.Namespace + "/" + r.Name
		}
		ci.Volumes = append(ci.Volumes, pv)
	}
	sort.Slice(ci.Volumes, func(i, j int) bool { return ci.Volumes[i].Name < ci.Volumes[j].Name })
}

func usageText(pvcs, pvs int) string {
	s := fmt.Sprintf("in use by %d PVCs", pvcs)
	if pvs > 0 {
		s += fmt.Sprintf(" and %d PVs", pvs)
	}
	return s
}

func (b *builder) storeAdded(u *unstructured.Unstructured) {
	pool, _, _ := unstructured.NestedString(u.Object, "spec", "pool")
	node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	b.added = append(b.added, StoreRef{Name: u.GetName(), Pool: pool, Node: node})
}

// stale decides for a live object that left the rendered set what the controller's prune
// step decides (controllers/policy reconcile step 6): an opt-out keeps it, a StorageClass
// with PVCs is kept, a Store that VolumeStates name is kept draining and so is the Agent of
// its node; the rest is deleted. Stores come before Agents (inventory.Stale's order).
func (b *builder) stale(live *unstructured.Unstructured, keptNodes map[string]bool) {
	if b.ongoingNodes == nil {
		b.ongoingNodes = map[string]bool{}
	}
	ongoingNodes := b.ongoingNodes
	oc := ObjectChange{Kind: live.GetKind(), Name: live.GetName(), Action: ActionPrune}
	defer func() { b.rep.Objects = append(b.rep.Objects, oc) }()

	// Usage as the controller counts it (live only; offline both are 0 and the outcome says
	// what usage would change).
	var ci ClassImpact
	var r *StoreRemoval
	pvcs, volumes := 0, 0
	switch live.GetKind() {
	case "StorageClass":
		ci = ClassImpact{Name: live.GetName(), Placement: live.GetLabels()[policyv1.LabelPlacement], Action: ActionPrune, AllowedKnown: true}
		b.usage(&ci)
		pvcs = len(ci.Claims)
	case "Store":
		pool, _, _ := unstructured.NestedString(live.Object, "spec", "pool")
		node, _, _ := unstructured.NestedString(live.Object, "spec", "nodeName")
		r = &StoreRemoval{StoreRef: StoreRef{Name: live.GetName(), Pool: pool, Node: node}}
		if b.cl != nil {
			for _, v := range b.cl.volumes[live.GetName()] {
				r.Volumes = append(r.Volumes, b.volume(&v))
			}
			sort.Slice(r.Volumes, func(i, j int) bool { return r.Volumes[i].ID < r.Volumes[j].ID })
			if s := b.cl.stores[live.GetName()]; s != nil && s.Status.Capacity != nil {
				r.ProvisionedBytes = s.Status.Capacity.Provisioned
			}
		}
		if b.removed == nil {
			b.removed = map[string]*StoreRemoval{}
		}
		b.removed[r.Name] = r
		volumes = len(r.Volumes)
	}

	switch policy.DecidePrune(live, pvcs, volumes, keptNodes) {
	case policy.PruneKeepOptedOut:
		oc.Action, oc.Reason = ActionKeep, "pruning disabled on the object: dropped from Plinth's inventory, never deleted"
		return
	case policy.PruneKeepInUse:
		placement := ci.Placement
		ci.Action = ActionKeep
		ci.Outcome = fmt.Sprintf("kept: in use by %d PVCs; Placement %s keeps its finalizer and reports InUse until they are gone", pvcs, placement)
		oc.Action, oc.Reason = ActionKeep, fmt.Sprintf("in use by %d PVCs", pvcs)
		b.rep.Storage.Classes = append(b.rep.Storage.Classes, ci)
		if bp := b.before.places[placement]; b.cl != nil && (bp == nil || bp.Spec.StorageClass.Name != live.GetName()) {
			// The Placement left (or renamed its class) before this change: kept already.
			oc.Ongoing, oc.Reason = true, oc.Reason+"; kept already"
			return
		}
		field := "spec.storageClass.name"
		if b.after.places[placement] == nil {
			field = ""
		}
		msg := fmt.Sprintf("StorageClass %s leaves the policy while %d PVCs use it (%s): the controller keeps it and Placement %s stays not Ready; existing volumes keep working, new PVCs and expansion need the class",
			live.GetName(), pvcs, claimList(ci.Claims, 5), placement)
		b.violation(RulePrunedClassInUse, "Placement", placement, field, msg)
		return
	case policy.PruneDeleteInUse:
		pending := 0
		for _, c := range ci.Claims {
			if c.Phase == string(corev1.ClaimPending) {
				pending++
			}
		}
		ci.Outcome = fmt.Sprintf("deleted although %d PVCs use it (%s=%s on the live class): existing PVs keep working, expansion of its PVCs will fail and its %d Pending PVCs will not be provisioned",
			pvcs, policy.AnnotationPrune, policy.PruneValueForce, pending)
		oc.Reason = fmt.Sprintf("in use by %d PVCs; deleted by the %s=%s override", pvcs, policy.AnnotationPrune, policy.PruneValueForce)
		b.rep.Storage.Classes = append(b.rep.Storage.Classes, ci)
		return
	case policy.PruneKeepDraining:
		oc.Action = ActionKeep
		if r == nil { // the Agent of a node that keeps a draining Store
			node, _, _ := unstructured.NestedString(live.Object, "spec", "nodeName")
			oc.Reason, oc.Ongoing = "its node keeps a draining Store", ongoingNodes[node]
			return
		}
		r.Drains = true
		keptNodes[r.Node] = true
		oc.Reason = fmt.Sprintf("holds %d volumes: kept and marked draining until they are gone", volumes)
		if s := b.cl.stores[live.GetName()]; s != nil && s.IsDraining() {
			ongoingNodes[r.Node] = true
			oc.Ongoing, oc.Reason = true, fmt.Sprintf("holds %d volumes: draining already", volumes)
		}
		return
	}
	// policy.PruneDelete.
	switch {
	case live.GetKind() == "StorageClass" && b.cl == nil:
		ci.AllowedKnown = false
		ci.Outcome = "deleted unless PVCs use it (usage is not known offline): then kept, and its Placement stays not Ready"
		b.rep.Storage.Classes = append(b.rep.Storage.Classes, ci)
	case live.GetKind() == "StorageClass":
		ci.Outcome = "deleted (no PVC uses it)"
		b.rep.Storage.Classes = append(b.rep.Storage.Classes, ci)
	case live.GetKind() == "Store" && b.cl == nil:
		oc.Reason = "deleted, or kept draining if it holds volumes (not known offline)"
	}
}

func (b *builder) volume(v *storev1.VolumeState) Volume {
	out := Volume{ID: v.Name, SizeBytes: v.Spec.CapacityBytes, Phase: string(v.Status.Phase), Exported: v.Status.Export != nil}
	if pv := b.cl.pvByID[v.Name]; pv != nil {
		out.PV = pv.Name
		if r := pv.Spec.ClaimRef; r != nil {
			out.Claim = r.Namespace + "/" + r.Name
		}
	}
	return out
}

func claimList(cs []Claim, max int) string {
	var s []string
	for i, c := range cs {
		if i == max {
			s = append(s, fmt.Sprintf("and %d more", len(cs)-max))
			break
		}
		s = append(s, c.Namespace+"/"+c.Name)
	}
	return strings.Join(s, ", ")
}

// violation records a violation positioned at field of the policy object kind/name in the
// proposed tree (at the tree's first path, line 0, when the object left it).
func (b *builder) violation(rule, kind, name, field, msg string) {
	file, line, col := b.after.position(kind, name, field, b.fallback)
	b.rep.Violations = append(b.rep.Violations, Violation{Rule: rule, File: file, Line: line, Column: col,
		Object: kind + "/" + name, Field: field, Message: msg})
}

// ownerViolation records a violation on the first policy object that produced key.
func (b *builder) ownerViolation(key, rule, msg string) {
	owners := b.sources[key]
	if len(owners) == 0 {
		b.rep.Violations = append(b.rep.Violations, Violation{Rule: rule, File: b.fallback, Object: key, Message: msg})
		return
	}
	kind, name, _ := strings.Cut(owners[0], "/")
	b.violation(rule, kind, name, "", msg)
}

// capacity fills the per-pool capacity and the room violations (live only).
func (b *builder) capacity() {
	if b.cl == nil {
		return
	}
	type acc struct {
		pc                  PoolCapacity
		provAll             int64
		leaving             bool
		limBefore, limAfter int64
		storeViolations     int
	}
	pools := map[string]*acc{}
	get := func(p string) *acc {
		if pools[p] == nil {
			pools[p] = &acc{pc: PoolCapacity{Pool: p}}
		}
		return pools[p]
	}
	var storeNames []string
	for n := range b.cl.stores {
		storeNames = append(storeNames, n)
	}
	sort.Strings(storeNames)
	for _, n := range storeNames {
		s := b.cl.stores[n]
		a := get(s.Spec.Pool)
		a.pc.StoresBefore++
		if c := s.Status.Capacity; c != nil {
			a.pc.Before.Allocatable += c.Allocatable
			a.pc.Before.Provisioned += c.Provisioned
			l := policyv1.ProvisionLimit(c.Allocatable, s.Spec.Backend.IsThin(), int64(s.Spec.OvercommitPercent))
			a.pc.Before.Limit += l
			a.provAll += c.Provisioned
		}
		if r := b.removed[n]; r != nil {
			a.leaving = true
			if r.Drains {
				a.pc.DrainingBytes += r.ProvisionedBytes
			}
		}
	}
	for _, p := range b.after.list.Pools {
		get(p.Name)
	}
	// Rendered Stores of each pool, after the change.
	rendered := map[string][]string{}
	for key, src := range b.sources {
		kind, name, _ := strings.Cut(key, "/")
		if kind == "Store" && len(src) == 1 {
			_, pool, _ := strings.Cut(src[0], "/")
			rendered[pool] = append(rendered[pool], name)
		}
	}
	for pool, a := range pools {
		p := b.after.pools[pool]
		var changedFields []string
		if bp := b.before.pools[pool]; bp != nil && p != nil {
			changedFields = specPaths(&bp.Spec, &p.Spec)
		}
		roomChanged := changed(changedFields, "spec.reserve") || changed(changedFields, "spec.overcommitPercent")
		sort.Strings(rendered[pool])
		for _, n := range rendered[pool] {
			a.pc.StoresAfter++
			s := b.cl.stores[n]
			if p == nil || s == nil || s.Status.Capacity == nil {
				a.pc.Unreported++
				continue
			}
			c := s.Status.Capacity
			res, err := policyv1.ReserveBytes(p.Spec.Reserve, c.Total)
			if err != nil {
				res = 0
			}
			alloc := max(c.Total-res, 0)
			oc := int64(100)
			if p.Spec.OvercommitPercent != nil {
				oc = int64(*p.Spec.OvercommitPercent)
			}
			thin := p.Spec.Backend.IsThin()
			lim := policyv1.ProvisionLimit(alloc, thin, oc)
			a.pc.After.Allocatable += alloc
			a.pc.After.Provisioned += c.Provisioned
			a.pc.After.Limit += lim
			limBefore := policyv1.ProvisionLimit(c.Allocatable, s.Spec.Backend.IsThin(), int64(s.Spec.OvercommitPercent))
			if roomChanged && c.Provisioned > lim && lim < limBefore {
				a.storeViolations++
				withOldOvercommit := policyv1.ProvisionLimit(alloc, thin, int64(s.Spec.OvercommitPercent))
				if withOldOvercommit < c.Provisioned || !thin {
					b.violation(RuleInsufficientRoom, "StoragePool", pool, "spec.reserve", fmt.Sprintf(
						"Store %s: %s provisioned exceeds the %s allocatable after reserve %s (total %s; allocatable was %s)",
						n, FormatBytes(c.Provisioned), FormatBytes(lim), orZero(p.Spec.Reserve), FormatBytes(c.Total), FormatBytes(c.Allocatable)))
				} else {
					b.violation(RuleOvercommitExceeded, "StoragePool", pool, "spec.overcommitPercent", fmt.Sprintf(
						"Store %s: %s provisioned exceeds the overcommit limit %s (%s allocatable × %d%%; the limit was %s)",
						n, FormatBytes(c.Provisioned), FormatBytes(lim), FormatBytes(alloc), oc, FormatBytes(limBefore)))
				}
			}
		}
		if changed(changedFields, "spec.nodeSelector") && a.leaving && a.storeViolations == 0 && a.pc.After.Limit < a.provAll && a.pc.After.Limit < a.pc.Before.Limit && p != nil {
			b.violation(RuleInsufficientRoom, "StoragePool", pool, "spec.nodeSelector", fmt.Sprintf(
				"the pool keeps %d of %d Stores, which can hold %s; %s is provisioned in the pool (%s on Stores that drain)",
				a.pc.StoresAfter, a.pc.StoresBefore, FormatBytes(a.pc.After.Limit), FormatBytes(a.provAll), FormatBytes(a.pc.DrainingBytes)))
		}
		if a.pc.StoresBefore+a.pc.StoresAfter > 0 {
			b.rep.Storage.Pools = append(b.rep.Storage.Pools, a.pc)
		}
	}
	sort.Slice(b.rep.Storage.Pools, func(i, j int) bool { return b.rep.Storage.Pools[i].Pool < b.rep.Storage.Pools[j].Pool })
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

// protocolChanges reports a protocol change on a pool with exported volumes (live only): a
// Placement of the pool whose protocolRef changes, or a Protocol such a Placement uses whose
// spec changes.
func (b *builder) protocolChanges() {
	if b.cl == nil {
		return
	}
	exported := map[string][]string{}
	for name, s := range b.cl.stores {
		for _, v := range b.cl.volumes[name] {
			if v.Status.Export != nil {
				exported[s.Spec.Pool] = append(exported[s.Spec.Pool], v.Name)
			}
		}
	}
	seen := map[string]bool{}
	for _, name := range names(b.after.places, b.after.places) {
		pl := b.after.places[name]
		pool := pl.Spec.PoolRef.Name
		vols := exported[pool]
		if len(vols) == 0 {
			continue
		}
		sort.Strings(vols)
		what := fmt.Sprintf("pool %s has %d exported volumes (%s)", pool, len(vols), strings.Join(first(vols, 3), ", "))
		if old := b.before.places[name]; old != nil && old.Spec.ProtocolRef.Name != pl.Spec.ProtocolRef.Name {
			b.violation(RuleProtocolChangeExported, "Placement", name, "spec.protocolRef.name", fmt.Sprintf(
				"protocol changes from %s to %s while %s: their hosts stay connected to the old export", old.Spec.ProtocolRef.Name, pl.Spec.ProtocolRef.Name, what))
			continue
		}
		proto := pl.Spec.ProtocolRef.Name
		op, np := b.before.protos[proto], b.after.protos[proto]
		if op == nil || np == nil || seen[proto+"/"+pool] {
			continue
		}
		if fields := specPaths(&op.Spec, &np.Spec); len(fields) > 0 {
			seen[proto+"/"+pool] = true
			b.violation(RuleProtocolChangeExported, "Protocol", proto, fields[0], fmt.Sprintf(
				"Protocol %s changes (%s) while %s over it: their hosts stay connected to the old endpoint", proto, strings.Join(fields, ", "), what))
		}
	}
}

func first(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(append([]string(nil), s[:n]...), fmt.Sprintf("and %d more", len(s)-n))
}

// finish sorts everything and counts.
func (b *builder) finish() {
	r := b.rep
	sortObjects(r.Objects)
	sortViolations(r.Violations)
	sort.Slice(r.Storage.Classes, func(i, j int) bool { return r.Storage.Classes[i].Name < r.Storage.Classes[j].Name })
	sort.Slice(b.added, func(i, j int) bool { return b.added[i].Name < b.added[j].Name })
	r.Storage.StoresAdded = b.added
	var names []string
	for n := range b.removed {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r.Storage.StoresRemoved = append(r.Storage.StoresRemoved, *b.removed[n])
	}
	if r.Policy == nil {
		r.Policy = []PolicyChange{}
	}
	if r.Objects == nil {
		r.Objects = []ObjectChange{}
	}
	if r.Violations == nil {
		r.Violations = []Violation{}
	}
	for _, p := range []*[]StoreRef{&r.Storage.StoresAdded} {
		if *p == nil {
			*p = []StoreRef{}
		}
	}
	if r.Storage.StoresRemoved == nil {
		r.Storage.StoresRemoved = []StoreRemoval{}
	}
	if r.Storage.Classes == nil {
		r.Storage.Classes = []ClassImpact{}
	}
	if r.Storage.Pools == nil {
		r.Storage.Pools = []PoolCapacity{}
	}
	r.count()
}
