package diff

import (
	"context"
	"fmt"
	"k8s.io/apimachinery/pkg/api/equality"
	"slices"
	"sort"
	"strings"

	"github.com/fluxcd/pkg/ssa"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/plan"
	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/controllers/render"
	"github.com/plinth-storage/plinth/controllers/storageclass"
	"github.com/plinth-storage/plinth/internal/overrides"
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
	// MoveRate is the copy rate in bytes per second the move plan assumes where Stores
	// report no measured rate (default DefaultMoveRate).
	MoveRate int64
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
	if o.MoveRate <= 0 {
		o.MoveRate = DefaultMoveRate
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
	src := &plan.Cluster{Counter: cl, Reader: c, Manager: m, Concurrency: o.Concurrency}
	pl, err := plan.Make(ctx, plan.Input{Desired: desired, Sources: rendered.Sources, Placements: after.places, Pools: after.pools, Previous: prev}, src)
	if err != nil {
		return nil, err
	}
	b := &builder{rep: rep, before: before, after: after, cl: cl, sources: rendered.Sources, fallback: paths[0]}
	b.report(pl)
	b.capacity()
	b.protocolChanges()
	b.authSupport(rendered.Agents)
	b.cacheSupport(rendered.Agents)
	b.overrides()
	b.encryption()
	if err := b.moves(rendered, o.MoveRate); err != nil {
		return nil, err
	}
	rep.Policy = policyChanges(before, after, func(string, string) (string, int) { return "", 0 })
	b.finish()
	return rep, nil
}

// cluster is what Live reads from the API server.
type cluster struct {
	nodes  []corev1.Node
	agents map[string]*storev1.Agent
	policy *vet.Policies
	stores map[string]*storev1.Store
	// volumes by Store name; claims and PVs by StorageClass name; pvs by CSI volume handle.
	volumes map[string][]storev1.VolumeState
	claims  map[string][]corev1.PersistentVolumeClaim
	pvs     map[string][]corev1.PersistentVolume
	pvByID  map[string]*corev1.PersistentVolume
	// attrClaims are the claims by each VolumeAttributesClass they name
	// (policyv1.ClaimAttributesClasses); attrPVs count the PVs by theirs.
	attrClaims map[string][]corev1.PersistentVolumeClaim
	attrPVs    map[string]int
	// snapshots are the VolumeSnapshots by spec.volumeSnapshotClassName.
	snapshots map[string][]Snapshot
	// snapshotsOf are the VolumeSnapshotState names by source volume id; attachedTo the nodes
	// of attached VolumeAttachments of csi.plinth.dev by PV name (readMoveInputs).
	snapshotsOf map[string][]string
	attachedTo  map[string][]string
}

// volumeSnapshotListGVK is external-snapshotter's VolumeSnapshotList.
var volumeSnapshotListGVK = schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshotList"}

// readSnapshots lists the VolumeSnapshots by class; a cluster without the snapshot API (no
// CRDs) has none.
func readSnapshots(ctx context.Context, c client.Client) (map[string][]Snapshot, error) {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(volumeSnapshotListGVK)
	if err := c.List(ctx, l); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list VolumeSnapshots: %w", err)
	}
	out := map[string][]Snapshot{}
	for _, u := range l.Items {
		class, _, _ := unstructured.NestedString(u.Object, "spec", "volumeSnapshotClassName")
		if class == "" {
			continue
		}
		sn := Snapshot{Namespace: u.GetNamespace(), Name: u.GetName()}
		if pvc, _, _ := unstructured.NestedString(u.Object, "spec", "source", "persistentVolumeClaimName"); pvc != "" {
			sn.Source = pvc
		} else if content, _, _ := unstructured.NestedString(u.Object, "spec", "source", "volumeSnapshotContentName"); content != "" {
			sn.Source = "content " + content
		}
		sn.ReadyToUse, _, _ = unstructured.NestedBool(u.Object, "status", "readyToUse")
		out[class] = append(out[class], sn)
	}
	for _, ss := range out {
		sort.Slice(ss, func(i, j int) bool {
			return ss[i].Namespace+"/"+ss[i].Name < ss[j].Namespace+"/"+ss[j].Name
		})
	}
	return out, nil
}

func readCluster(ctx context.Context, c client.Client) (*cluster, error) {
	var (
		nodes  corev1.NodeList
		pools  policyv1.StoragePoolList
		protos policyv1.ProtocolList
		places policyv1.PlacementList
		stores storev1.StoreList
		agents storev1.AgentList
		vols   storev1.VolumeStateList
		claims corev1.PersistentVolumeClaimList
		pvs    corev1.PersistentVolumeList
	)
	for _, l := range []client.ObjectList{&nodes, &pools, &protos, &places, &stores, &agents, &vols, &claims, &pvs} {
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
		pvs: map[string][]corev1.PersistentVolume{}, pvByID: map[string]*corev1.PersistentVolume{},
		attrClaims: map[string][]corev1.PersistentVolumeClaim{}, attrPVs: map[string]int{}}
	if cl.snapshots, err = readSnapshots(ctx, c); err != nil {
		return nil, err
	}
	if err := readMoveInputs(ctx, c, cl); err != nil {
		return nil, err
	}
	for i := range stores.Items {
		cl.stores[stores.Items[i].Name] = &stores.Items[i]
	}
	cl.agents = map[string]*storev1.Agent{}
	for i := range agents.Items {
		cl.agents[agents.Items[i].Name] = &agents.Items[i]
	}
	for _, v := range vols.Items {
		cl.volumes[v.Spec.StoreName] = append(cl.volumes[v.Spec.StoreName], v)
	}
	for _, p := range claims.Items {
		if p.Spec.StorageClassName != nil && *p.Spec.StorageClassName != "" {
			cl.claims[*p.Spec.StorageClassName] = append(cl.claims[*p.Spec.StorageClassName], p)
		}
		var target string
		if m := p.Status.ModifyVolumeStatus; m != nil {
			target = m.TargetVolumeAttributesClassName
		}
		for _, vac := range policyv1.ClaimAttributesClasses(p.Spec.VolumeAttributesClassName, p.Status.CurrentVolumeAttributesClassName, target) {
			cl.attrClaims[vac] = append(cl.attrClaims[vac], p)
		}
	}
	for i := range pvs.Items {
		p := &pvs.Items[i]
		if p.Spec.StorageClassName != "" {
			cl.pvs[p.Spec.StorageClassName] = append(cl.pvs[p.Spec.StorageClassName], *p)
		}
		if c := p.Spec.VolumeAttributesClassName; c != nil && *c != "" {
			cl.attrPVs[*c]++
		}
		if p.Spec.CSI != nil && p.Spec.CSI.Driver == policyv1.DriverName {
			cl.pvByID[p.Spec.CSI.VolumeHandle] = p
		}
	}
	return cl, nil
}

// ClassUsage implements plan.Counter from the lists read once.
func (cl *cluster) ClassUsage(_ context.Context, name string) (plan.Usage, error) {
	u := plan.Usage{PVCs: len(cl.claims[name]), PVs: len(cl.pvs[name]), Known: true}
	for _, c := range cl.claims[name] {
		if c.Status.Phase == corev1.ClaimPending {
			u.Pending++
		}
	}
	return u, nil
}

// AttributesClassUsage implements plan.Counter from the lists read once.
func (cl *cluster) AttributesClassUsage(_ context.Context, name string) (plan.Usage, error) {
	return plan.Usage{PVCs: len(cl.attrClaims[name]), PVs: cl.attrPVs[name], Known: true}, nil
}

// StoreUsage implements plan.Counter from the lists read once.
func (cl *cluster) StoreUsage(_ context.Context, name string) (plan.Usage, error) {
	return plan.Usage{Volumes: len(cl.volumes[name]), Known: true}, nil
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

// report fills the report's objects and storage impact from the plan: what the controller
// will do, in the controller's own decisions.
func (b *builder) report(p *plan.Plan) {
	for i := range p.Classes {
		b.replacement(&p.Classes[i])
	}
	for i := range p.Objects {
		b.object(&p.Objects[i])
	}
	for i := range p.Prunes {
		b.stale(&p.Prunes[i])
	}
}

// object records a rendered object that is not replaced.
func (b *builder) object(o *plan.Object) {
	u := o.Object
	oc := ObjectChange{Kind: u.GetKind(), Name: u.GetName()}
	if o.KeptImmutable {
		oc.Reason = "immutable fields kept: replacement not allowed"
	}
	switch o.Action {
	case plan.Rejected:
		b.rejected(o)
		if u.GetKind() == render.AttributesClassKind {
			b.attributesClass(u, ActionChange, nil)
		}
		return
	case plan.Create:
		oc.Action = ActionCreate
		if u.GetKind() == "Store" {
			b.storeAdded(u)
		}
	case plan.Change:
		oc.Action, oc.Fields = ActionChange, o.Fields
		if u.GetKind() == policyv1.SnapshotClassKind {
			b.snapshotClass(u, ActionChange, o.Fields)
		}
		if u.GetKind() == render.AttributesClassKind {
			b.attributesClass(u, ActionChange, o.Fields)
		}
	case plan.Drift:
		oc.Action, oc.Fields, oc.Reason = ActionDrift, o.Fields, "edited outside Plinth"
		if o.Drift.Deleted {
			oc.Reason = "deleted outside Plinth"
		}
	default:
		b.rep.Counts.Unchanged++
		return
	}
	b.rep.Objects = append(b.rep.Objects, oc)
}

// replacement records a StorageClass whose immutable fields change with the controller's
// decision (plan.ReplacementAllowed). A replacement the policy forbids stalls the Placement:
// a violation at the field that asks for it.
func (b *builder) replacement(cc *plan.ClassChange) {
	placement := cc.Placement
	ci := ClassImpact{Name: cc.Desired.Name, Placement: placement, Action: ActionReplace, Changes: cc.Immutable,
		Replacement: string(cc.Policy), Allowed: cc.Allowed, AllowedKnown: cc.AllowedKnown, Default: cc.WasDefault}
	b.usage(&ci)
	pvcs, pvs := len(ci.Claims), len(ci.Volumes)
	switch {
	case !cc.AllowedKnown:
		ci.Outcome = "replacement IfUnused: replaced if no PVC or PV uses it (usage is not known offline); kept otherwise, Placement " + placement + " stalls with ReplacementRequired"
	case cc.Allowed:
		ci.Outcome = fmt.Sprintf("replacement %s: replaced (deleted, then created with the new fields)", cc.Policy)
		if pvcs+pvs > 0 {
			ci.Outcome += "; bound PVs keep working with the policy frozen at their creation"
		}
	case cc.Policy == policyv1.ReplacementIfUnused:
		ci.Outcome = fmt.Sprintf("not replaced (replacement IfUnused, %s): kept as it is, in-place fields applied; Placement %s stalls with ReplacementRequired", plan.UsageText(pvcs, pvs), placement)
	default:
		ci.Outcome = fmt.Sprintf("not replaced (replacement Never): kept as it is, in-place fields applied; Placement %s stalls with ReplacementRequired", placement)
	}
	if cc.WasDefault && (cc.Allowed || !cc.AllowedKnown) {
		ci.Outcome += "; it is the cluster's default StorageClass: PVCs that name no class get none while it is gone"
	}
	b.rep.Storage.Classes = append(b.rep.Storage.Classes, ci)
	if !cc.Allowed && cc.AllowedKnown {
		if bp := b.before.places[placement]; bp != nil && len(specPaths(&bp.Spec, &b.after.places[placement].Spec)) == 0 {
			return // stalled already before this change: not caused by it
		}
		b.violation(RuleReplacementNotAllowed, "Placement", placement, placementField(cc.Immutable),
			fmt.Sprintf("StorageClass %s needs a replacement (%s) that replacement %s does not allow: the controller keeps the class and Placement %s stalls with ReplacementRequired",
				cc.Desired.Name, storageclass.Describe(cc.Immutable), cc.Policy, placement))
		return
	}
	fields := make([]string, len(cc.Changes))
	for i, ch := range cc.Changes {
		fields[i] = ch.Field
	}
	b.rep.Objects = append(b.rep.Objects, ObjectChange{Kind: "StorageClass", Name: cc.Desired.Name, Action: ActionReplace,
		Fields: fields, Reason: storageclass.Describe(cc.Immutable)})
}

// placementField is the Placement field that renders the first immutable StorageClass field
// in changes (spec.storageClass when none maps).
func placementField(changes []storageclass.Change) string {
	for _, ch := range changes {
		switch ch.Field {
		case "parameters." + policyv1.ParamFSType:
			return "spec.filesystem.fsType"
		case "parameters." + policyv1.ParamPool:
			return "spec.poolRef.name"
		case "parameters." + policyv1.ParamProtocol:
			return "spec.protocolRef.name"
		case "parameters." + policyv1.ParamSpreadAcross:
			return "spec.spreadAcross"
		case "reclaimPolicy":
			return "spec.storageClass.reclaimPolicy"
		case "volumeBindingMode":
			return "spec.storageClass.volumeBindingMode"
		}
	}
	return "spec.storageClass"
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

func (b *builder) storeAdded(u *unstructured.Unstructured) {
	pool, _, _ := unstructured.NestedString(u.Object, "spec", "pool")
	node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	b.added = append(b.added, StoreRef{Name: u.GetName(), Pool: pool, Node: node})
}

// stale reports the controller's prune verdict on a live object that left the rendered set
// (plan.DecidePrune): an opt-out keeps it, a StorageClass with PVCs is kept, a Store that
// VolumeStates name is kept draining and so is the Agent of its node; the rest is deleted.
// Stores come before Agents (inventory.Stale's order).
func (b *builder) stale(pr *plan.Prune) {
	if b.ongoingNodes == nil {
		b.ongoingNodes = map[string]bool{}
	}
	live := pr.Live
	oc := ObjectChange{Kind: live.GetKind(), Name: live.GetName(), Action: ActionPrune}
	defer func() { b.rep.Objects = append(b.rep.Objects, oc) }()

	// Usage as the controller counts it (live only; offline both are 0 and the outcome says
	// what usage would change).
	var ci ClassImpact
	var r *StoreRemoval
	switch live.GetKind() {
	case "StorageClass":
		ci = ClassImpact{Name: live.GetName(), Placement: live.GetLabels()[policyv1.LabelPlacement], Action: ActionPrune, AllowedKnown: true,
			Default: live.GetAnnotations()[storageclass.DefaultClassAnnotation] == "true"}
		b.usage(&ci)
	case "Store":
		r = b.storeRemoval(live)
	}
	switch pr.Verdict {
	case plan.PruneKeepOptedOut:
		oc.Action, oc.Reason = ActionKeep, "pruning disabled on the object: dropped from Plinth's inventory, never deleted"
	case plan.PruneKeepInUse:
		if live.GetKind() == render.AttributesClassKind {
			oc.Action, oc.Reason = ActionKeep, fmt.Sprintf("named by %d PVCs and %d PVs: kept", pr.Usage.PVCs, pr.Usage.PVs)
			oc.Ongoing = b.attributesClass(live, ActionKeep, nil)
			if oc.Ongoing {
				oc.Reason += " already"
			}
			return
		}
		b.keptInUse(live, &oc, ci, pr.Usage.PVCs)
	case plan.PruneDeleteInUse:
		if live.GetKind() == render.AttributesClassKind {
			oc.Reason = fmt.Sprintf("named by %d PVCs; deleted by the %s=%s override", pr.Usage.PVCs, plan.AnnotationPrune, plan.PruneValueForce)
			b.attributesClass(live, ActionPrune, nil)
			return
		}
		ci.Outcome = fmt.Sprintf("deleted although %d PVCs use it (%s=%s on the live class): existing PVs keep working, expansion of its PVCs will fail and its %d Pending PVCs will not be provisioned",
			pr.Usage.PVCs, plan.AnnotationPrune, plan.PruneValueForce, pr.Usage.Pending)
		oc.Reason = fmt.Sprintf("in use by %d PVCs; deleted by the %s=%s override", pr.Usage.PVCs, plan.AnnotationPrune, plan.PruneValueForce)
		b.addClass(ci)
	case plan.PruneKeepDraining:
		oc.Action = ActionKeep
		if r == nil { // the Agent of a node that keeps a draining Store
			oc.Reason, oc.Ongoing = "its node keeps a draining Store", b.ongoingNodes[pr.Node]
			return
		}
		r.Drains = true
		oc.Reason = fmt.Sprintf("holds %d volumes: kept and marked draining until they are gone", pr.Usage.Volumes)
		if s := b.cl.stores[live.GetName()]; s != nil && s.IsMarkedDraining() {
			b.ongoingNodes[r.Node] = true
			oc.Ongoing, oc.Reason = true, fmt.Sprintf("holds %d volumes: draining already", pr.Usage.Volumes)
		}
	default: // plan.PruneDelete
		b.deleted(live, &oc, ci)
		if live.GetKind() == policyv1.SnapshotClassKind {
			b.snapshotClass(live, ActionPrune, nil)
		}
	}
}

// attributesClass records a tier (VolumeAttributesClass) that changes, is pruned or kept in
// use, with the claims that name it; a tier that leaves the policy while claims name it is a
// violation on its Placement, unless the tier had left before this change (keptAlready).
func (b *builder) attributesClass(u *unstructured.Unstructured, action string, fields []string) (keptAlready bool) {
	ai := AttributesClassImpact{Name: u.GetName(), Placement: u.GetLabels()[policyv1.LabelPlacement], Action: action, Fields: fields}
	if b.cl != nil {
		for _, c := range b.cl.attrClaims[ai.Name] {
			ai.Claims = append(ai.Claims, c.Namespace+"/"+c.Name)
		}
		sort.Strings(ai.Claims)
	}
	n := fmt.Sprintf("%d PVCs name it", len(ai.Claims))
	if b.cl == nil {
		n = "its claims are not known offline"
	}
	switch action {
	case ActionChange:
		ai.Outcome = n + ": a VolumeAttributesClass's parameters are immutable, so the class keeps its limits and so do its claims; declare a tier of another name and move the claims to it"
	case ActionKeep:
		ai.Outcome = n + ": the class is kept, but no Placement declares the tier any more; move them to a declared tier"
		if bp := b.before.places[ai.Placement]; b.cl != nil && (bp == nil || bp.Spec.AttributesClass(ai.Name) == nil) {
			keptAlready = true // the tier left before this change
			break
		}
		b.violation(RuleAttributesClassInUse, "Placement", ai.Placement, "spec.attributesClasses", fmt.Sprintf(
			"VolumeAttributesClass %s leaves the policy while %d PVCs name it (%s): they would be left on a tier no Placement declares",
			ai.Name, len(ai.Claims), strings.Join(first(ai.Claims, 3), ", ")))
	default:
		ai.Outcome = n + ": deleted; they keep the limits in force until their next modification, which names a class that is gone"
	}
	b.rep.Storage.AttributesClasses = append(b.rep.Storage.AttributesClasses, ai)
	return keptAlready
}

// snapshotClass records a VolumeSnapshotClass that changes or is pruned, with the
// VolumeSnapshots that name it (live) and what happens to them.
func (b *builder) snapshotClass(u *unstructured.Unstructured, action string, fields []string) {
	si := SnapshotClassImpact{Name: u.GetName(), Placement: u.GetLabels()[policyv1.LabelPlacement], Action: action, Fields: fields}
	if b.cl != nil {
		si.Snapshots = b.cl.snapshots[si.Name]
	}
	n := fmt.Sprintf("%d VolumeSnapshots name it", len(si.Snapshots))
	if b.cl == nil {
		n = "its VolumeSnapshots are not known offline"
	}
	switch action {
	case ActionPrune:
		si.Outcome = n + ": they stay restorable and deletable (each VolumeSnapshotContent keeps its driver and deletion policy); new VolumeSnapshots of this class fail until a class of that name exists again"
	default:
		si.Outcome = n + ": they keep the settings they were taken with; new VolumeSnapshots of this class are taken with the new ones"
	}
	b.rep.Storage.SnapshotClasses = append(b.rep.Storage.SnapshotClasses, si)
}

// storeRemoval records a Store that leaves the policy, with its volumes (live only).
func (b *builder) storeRemoval(live *unstructured.Unstructured) *StoreRemoval {
	pool, _, _ := unstructured.NestedString(live.Object, "spec", "pool")
	node, _, _ := unstructured.NestedString(live.Object, "spec", "nodeName")
	r := &StoreRemoval{StoreRef: StoreRef{Name: live.GetName(), Pool: pool, Node: node}}
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
	return r
}

// keptInUse records a StorageClass kept because PVCs use it: a violation unless it was kept
// already before this change.
func (b *builder) keptInUse(live *unstructured.Unstructured, oc *ObjectChange, ci ClassImpact, pvcs int) {
	placement := ci.Placement
	ci.Action = ActionKeep
	ci.Outcome = fmt.Sprintf("kept: in use by %d PVCs; Placement %s keeps its finalizer and reports InUse until they are gone", pvcs, placement)
	oc.Action, oc.Reason = ActionKeep, fmt.Sprintf("in use by %d PVCs", pvcs)
	b.addClass(ci)
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
}

// deleted records an object the controller deletes.
func (b *builder) deleted(live *unstructured.Unstructured, oc *ObjectChange, ci ClassImpact) {
	switch {
	case live.GetKind() == "StorageClass" && b.cl == nil:
		ci.AllowedKnown = false
		ci.Outcome = "deleted unless PVCs use it (usage is not known offline): then kept, and its Placement stays not Ready"
		b.addClass(ci)
	case live.GetKind() == "StorageClass":
		ci.Outcome = "deleted (no PVC uses it)"
		b.addClass(ci)
	case live.GetKind() == "Store" && b.cl == nil:
		oc.Reason = "deleted, or kept draining if it holds volumes (not known offline)"
	}
}

// addClass records the impact on a StorageClass that leaves the policy, calling out the
// cluster's default class.
func (b *builder) addClass(ci ClassImpact) {
	if ci.Default && ci.Action != ActionKeep {
		ci.Outcome += "; it is the cluster's default StorageClass: PVCs that name no class get none once it is gone"
	}
	b.rep.Storage.Classes = append(b.rep.Storage.Classes, ci)
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

// authSupport reports, for each rendered Agent that will need NVMe target authentication
// (spec.nvmeof.auth), a live Agent whose kernel said it has none (live only): its volumes of
// the authenticated classes would not be exported. The violation is on the first Protocol with
// DH-HMAC-CHAP that one of the node's pools is served by.
func (b *builder) authSupport(agents []storev1.Agent) {
	if b.cl == nil {
		return
	}
	protoOfPool := map[string]string{}
	for _, name := range names(b.after.places, b.after.places) {
		pl := b.after.places[name]
		if p := b.after.protos[pl.Spec.ProtocolRef.Name]; p != nil && p.Spec.NVMeoFTCP != nil && p.Spec.NVMeoFTCP.Auth.Enabled() {
			if _, ok := protoOfPool[pl.Spec.PoolRef.Name]; !ok {
				protoOfPool[pl.Spec.PoolRef.Name] = p.Name
			}
		}
	}
	for _, a := range agents {
		if a.Spec.NVMeoF == nil || !a.Spec.NVMeoF.Auth {
			continue
		}
		live := b.cl.agents[a.Name]
		if live == nil || live.Status.LastHeartbeatTime == nil || slices.Contains(live.Status.Capabilities.NVMeAuth, storev1.CapabilityTarget) {
			continue
		}
		proto := ""
		for _, pool := range strings.Split(a.Annotations[render.AnnotationPools], ",") {
			if p, ok := protoOfPool[pool]; ok && (proto == "" || p < proto) {
				proto = p
			}
		}
		if proto == "" {
			continue
		}
		b.violation(RuleAuthUnsupported, "Protocol", proto, "spec.nvmeofTcp.auth", fmt.Sprintf(
			"node %s reports no NVMe target authentication in its kernel (Agent status.capabilities.nvmeAuth %v; needs CONFIG_NVME_TARGET_AUTH): it would export none of the volumes that ask for DH-HMAC-CHAP",
			a.Name, live.Status.Capabilities.NVMeAuth))
	}
}

// cacheSupport reports, for each rendered Agent of a node that carries a pool with an LVM cache
// (lvm.cache), a live Agent that has reported a kernel without the bcache module (its
// status.capabilities.kernelModules lacks "bcache"): that node's Store of the pool would be
// Stalled (MissingKernelModules) and make no volume. Agents that have not reported yet are not
// judged.
func (b *builder) cacheSupport(agents []storev1.Agent) {
	if b.cl == nil {
		return
	}
	for _, a := range agents {
		live := b.cl.agents[a.Name]
		if live == nil || live.Status.LastHeartbeatTime == nil || slices.Contains(live.Status.Capabilities.KernelModules, "bcache") {
			continue
		}
		for _, pool := range strings.Split(a.Annotations[render.AnnotationPools], ",") {
			p := b.after.pools[pool]
			if p == nil || p.Spec.Backend.LVM == nil || p.Spec.Backend.LVM.Cache == nil {
				continue
			}
			b.violation(RuleCacheUnsupported, "StoragePool", pool, "spec.backend.lvm.cache", fmt.Sprintf(
				"node %s reports no bcache module in its kernel (Agent status.capabilities.kernelModules %v): its Store of pool %s would be Stalled (MissingKernelModules) and make no volume",
				a.Name, live.Status.Capabilities.KernelModules, pool))
		}
	}
}

// overrides reports the Pending PVCs of each proposed Placement's class whose override
// annotations that Placement would refuse (live only): their CreateVolume would fail.
func (b *builder) overrides() {
	if b.cl == nil {
		return
	}
	for _, name := range names(b.after.places, b.after.places) {
		pl := b.after.places[name]
		var refused []string
		var reason string
		for _, c := range b.cl.claims[pl.Spec.StorageClass.Name] {
			if c.Status.Phase != corev1.ClaimPending {
				continue
			}
			if _, err := overrides.Parse(c.Annotations, pl, ""); err != nil {
				refused = append(refused, c.Namespace+"/"+c.Name)
				if reason == "" {
					reason = err.Error()
				}
			}
		}
		if len(refused) == 0 {
			continue
		}
		sort.Strings(refused)
		field := "spec.overrides.allowed"
		if pl.Spec.Overrides == nil {
			field = ""
		}
		b.violation(RuleOverrideRefused, "Placement", name, field, fmt.Sprintf(
			"%d Pending PVCs (%s) carry overrides this Placement refuses, so their provisioning would fail; first: %s",
			len(refused), strings.Join(first(refused, 3), ", "), reason))
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

// withoutGeneration is e without its keyGeneration (nil stays nil).
func withoutGeneration(e *policyv1.Encryption) *policyv1.Encryption {
	if e == nil {
		return nil
	}
	c := e.DeepCopy()
	c.KeyGeneration = 0
	return c
}

// encryption reports a Placement whose encryption is removed or changed (RuleEncryptionDropped):
// with a cluster, only when volumes of it are encrypted, counting them; offline, always.
func (b *builder) encryption() {
	for _, name := range names(b.after.places, b.after.places) {
		old, pl := b.before.places[name], b.after.places[name]
		if old == nil || old.Spec.Encryption == nil || equality.Semantic.DeepEqual(withoutGeneration(old.Spec.Encryption), withoutGeneration(pl.Spec.Encryption)) {
			continue // raising keyGeneration rotates keys: the volumes stay as they are
		}
		what := "drops encryption"
		if pl.Spec.Encryption != nil {
			what = "changes its encryption"
		}
		existing := "its existing volumes (not known offline)"
		if b.cl != nil {
			var vols []string
			for _, vs := range b.cl.volumes {
				for _, v := range vs {
					if v.Spec.Policy.Placement == name && v.Spec.Policy.Encryption != nil {
						vols = append(vols, v.Name)
					}
				}
			}
			if len(vols) == 0 {
				continue
			}
			sort.Strings(vols)
			existing = fmt.Sprintf("its %d encrypted volumes (%s)", len(vols), strings.Join(first(vols, 3), ", "))
		}
		b.violation(RuleEncryptionDropped, "Placement", name, "spec.encryption", fmt.Sprintf(
			"Placement %s %s: %s stay as they were made (encrypted, with their keys), new volumes would not match them", name, what, existing))
	}
}
