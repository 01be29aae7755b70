package plan

import (
	"context"
	"fmt"
	"strings"

	"github.com/fluxcd/pkg/ssa"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/render"
	"github.com/plinth-storage/plinth/controllers/storageclass"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// Input is what a plan is made from: the rendered set, the vetted policy it came from and the
// inventory the last reconcile wrote.
type Input struct {
	// Desired are the rendered objects (render.Output.Unstructured), in apply order.
	Desired []*unstructured.Unstructured
	// Sources maps a rendered object's "Kind/name" to the policy objects ("Kind/name") that
	// produced it (render.Output.Sources).
	Sources map[string][]string
	// Placements and Pools are the vetted policy objects (schema defaults filled in) by name.
	Placements map[string]*policyv1.Placement
	Pools      map[string]*policyv1.StoragePool
	// Previous is the inventory the last reconcile wrote: the only record prune trusts.
	Previous *inventory.Inventory
	// Kept, when set, keeps between calls what Make computed of each rendered object (see
	// Kept); Desired must then hold the same pointer for an object whose render did not
	// change, and never a modified one. Nil computes everything.
	Kept *Kept
}

// Usage is how much uses a StorageClass or a Store.
type Usage struct {
	// PVCs, PVs and Pending count the PVCs, PVs and Pending PVCs whose storageClassName names
	// a StorageClass; Volumes counts the VolumeStates on a Store.
	PVCs, PVs, Pending, Volumes int
	// Known is false where usage cannot be read (plinth diff offline): the counts are 0 and a
	// rule that depends on them is reported as unknown.
	Known bool
}

// DryRun is the outcome of the server-side dry-run apply of one object.
type DryRun struct {
	// Action is ssa.CreatedAction (no live object), ssa.ConfiguredAction (the apply changes
	// the live object) or ssa.UnchangedAction.
	Action ssa.Action
	// Fields are the dotted paths the apply changes (ConfiguredAction), sorted.
	Fields []string
	// Err is the API server's refusal of the dry-run.
	Err error
}

// Source is how a plan reads the cluster. Nothing it does writes: server-side dry-runs only.
type Source interface {
	// Get returns the live object of kind gvk named name, or nil when there is none.
	Get(ctx context.Context, gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, error)
	// Cached says, without a server round trip, what an informer cache knows of u's live
	// object: absent, holding every field u sets, or differing; CacheUnknown when it cannot
	// tell (no cache, a kind it does not hold).
	Cached(ctx context.Context, u *unstructured.Unstructured) CacheState
	// DryRun dry-runs each object, in the order given; the error is for a cancelled context.
	DryRun(ctx context.Context, objs []*unstructured.Unstructured) ([]DryRun, error)
	// ClassUsage counts the PVCs and PVs of StorageClass name.
	ClassUsage(ctx context.Context, name string) (Usage, error)
	// AttributesClassUsage counts the PVCs and PVs that name VolumeAttributesClass name
	// (policyv1.ClaimAttributesClasses).
	AttributesClassUsage(ctx context.Context, name string) (Usage, error)
	// StoreUsage counts the VolumeStates on Store name.
	StoreUsage(ctx context.Context, name string) (Usage, error)
}

// CacheState is what a Source's informer cache knows of a rendered object's live copy.
type CacheState int

const (
	// CacheUnknown: no cache, or the cache does not hold that kind; a dry-run decides.
	CacheUnknown CacheState = iota
	// CacheAbsent: the cache holds the kind and no object of that name.
	CacheAbsent
	// CacheHolds: the cached copy holds every field the render sets.
	CacheHolds
	// CacheDiffers: the cached copy lacks or differs in a field the render sets.
	CacheDiffers
)

// Action is what the plan does with a rendered object.
type Action string

const (
	// Unchanged: the live object already equals what policy renders.
	Unchanged Action = "Unchanged"
	// Create: no live object yet.
	Create Action = "Create"
	// Change: policy changed the object (its digest differs from the inventory's).
	Change Action = "Change"
	// Drift: the object's digest is the one Plinth applied, but the live object was edited
	// or deleted outside Plinth; Correct says whether this reconcile reverts it.
	Drift Action = "Drift"
	// Rejected: the API server refused the dry-run; DryRunErr says why.
	Rejected Action = "Rejected"
)

// Object is the plan for one rendered object.
type Object struct {
	// Object is what is applied: the render, or for a StorageClass whose replacement is not
	// allowed, the render with the live immutable fields kept.
	Object *unstructured.Unstructured
	// Entry is Object's inventory entry.
	Entry inventory.Entry
	// Owners are the policy objects ("Kind/name") that produced it.
	Owners []string
	Action Action
	// Fields are the dotted paths that change (Change) or drifted (Drift).
	Fields []string
	// Drift describes the drift (Action Drift), and Correct whether it is reverted: a
	// StorageClass follows its Placement's pool's driftPolicy, a Store its own, an Agent
	// always.
	Drift   *drift.Item
	Correct bool
	// KeptImmutable is true for a StorageClass applied with its live immutable fields because
	// the replacement its policy needs is not allowed (see Plan.Classes).
	KeptImmutable bool
	// DryRunErr is the API server's refusal (Action Rejected).
	DryRunErr error
}

// Key is "Kind/name".
func (o *Object) Key() string { return o.Object.GetKind() + "/" + o.Object.GetName() }

// Apply reports whether the object is applied: it is new, policy changed it, or its drift is
// corrected.
func (o *Object) Apply() bool {
	return o.Action == Create || o.Action == Change || o.Action == Drift && o.Correct
}

// DriftOwners narrows the owners on which drift is reported: a StorageClass's drift goes on
// its Placement, a Store's and an Agent's on their StoragePools.
func (o *Object) DriftOwners() []string {
	want := "StoragePool/"
	if o.Object.GetKind() == "StorageClass" {
		want = "Placement/"
	}
	var out []string
	for _, ow := range o.Owners {
		if strings.HasPrefix(ow, want) {
			out = append(out, ow)
		}
	}
	return out
}

// ClassChange is a StorageClass whose immutable fields change: it is replaced (deleted, then
// created) when its Placement's replacement policy allows it, and kept otherwise.
type ClassChange struct {
	// Desired is the rendered class and Live the one in the cluster (offline: the old render).
	Desired, Live *storagev1.StorageClass
	// Entry is Desired's inventory entry.
	Entry inventory.Entry
	// Placement names the Placement that renders it.
	Placement string
	// Changes are all field changes; Immutable the ones that need a replacement.
	Changes, Immutable []storageclass.Change
	// Policy is the Placement's effective replacement policy.
	Policy policyv1.Replacement
	// Usage is the class's PVCs and PVs.
	Usage Usage
	// Allowed says whether the class is replaced now; when Usage is not known and the policy
	// is IfUnused it is false and AllowedKnown false.
	Allowed, AllowedKnown bool
	// WasDefault is true when the live class is the cluster's default StorageClass (it carries
	// storageclass.kubernetes.io/is-default-class: "true"): replacing it leaves the cluster
	// without a default for a moment.
	WasDefault bool
}

// Blocked is the ReplacementRequired message of a class whose replacement is not allowed, ""
// when it is allowed or unknown.
func (c *ClassChange) Blocked() string {
	if c.Allowed || !c.AllowedKnown {
		return ""
	}
	what := storageclass.Describe(c.Immutable)
	if c.Policy == policyv1.ReplacementIfUnused {
		return fmt.Sprintf("StorageClass %s needs replacement (%s); replacement is IfUnused and it is %s: kept as it is, in-place fields applied",
			c.Desired.Name, what, UsageText(c.Usage.PVCs, c.Usage.PVs))
	}
	return fmt.Sprintf("StorageClass %s needs replacement (%s); replacement is Never: kept as it is, in-place fields applied; set spec.storageClass.replacement to IfUnused or Always to replace it",
		c.Desired.Name, what)
}

// Prune is the plan for an object that left the rendered set but is in the inventory.
type Prune struct {
	// Entry is the inventory entry and Live the object as read from the cluster.
	Entry inventory.Entry
	Live  *unstructured.Unstructured
	// Owners name the policy objects of Live from its labels (the policy may be gone).
	Owners []string
	// Verdict is DecidePrune's.
	Verdict PruneVerdict
	// Usage is a StorageClass's PVCs or a Store's VolumeStates.
	Usage Usage
	// Node is spec.nodeName of a Store or an Agent.
	Node string
}

// Plan is what a reconcile does, as plain data; Make fills it, nothing in it is done yet.
type Plan struct {
	// Objects are the rendered objects except the StorageClasses that are replaced, in the
	// render's order.
	Objects []Object
	// Classes are the StorageClasses whose immutable fields change, replaced or not.
	Classes []ClassChange
	// Prunes are the objects that left the rendered set, Stores before Agents before
	// StorageClasses (inventory.Stale's order).
	Prunes []Prune
	// Rendered is the inventory of every rendered object, before anything is done.
	Rendered *inventory.Inventory
}

// Replacements are the classes replaced now.
func (p *Plan) Replacements() []*ClassChange {
	var out []*ClassChange
	for i := range p.Classes {
		if p.Classes[i].Allowed {
			out = append(out, &p.Classes[i])
		}
	}
	return out
}

// Make plans the reconcile of in against the cluster src reads. The error is for reads that
// failed (and malformed rendered objects); an object the API server refuses is an Object with
// Action Rejected.
func Make(ctx context.Context, in Input, src Source) (*Plan, error) {
	if in.Previous == nil {
		in.Previous = inventory.New()
	}
	p := &Plan{Rendered: inventory.WithCapacity(len(in.Desired))}
	entries := make(map[*unstructured.Unstructured]inventory.Entry, len(in.Desired)) // digests are computed once
	toDiff, err := p.classify(ctx, in, src, entries)
	if err != nil {
		return nil, err
	}
	if err := p.diff(ctx, in, src, toDiff, entries); err != nil {
		return nil, err
	}
	if err := p.prune(ctx, in, src); err != nil {
		return nil, err
	}
	in.Kept.sweep()
	return p, nil
}

// classify records every rendered object's entry and takes out the StorageClasses whose
// immutable fields change: replaced ones leave the apply; blocked ones are applied with the
// live immutable fields kept. It returns what goes through the dry-run.
func (p *Plan) classify(ctx context.Context, in Input, src Source, entries map[*unstructured.Unstructured]inventory.Entry) ([]*unstructured.Unstructured, error) {
	var toDiff []*unstructured.Unstructured
	for _, u := range in.Desired {
		e, err := in.Kept.entryOf(u)
		if err != nil {
			return nil, err
		}
		entries[u] = e
		p.Rendered.Put(e)
		if u.GetKind() != "StorageClass" {
			toDiff = append(toDiff, u)
			continue
		}
		cc, err := classChange(ctx, in, src, u, e)
		if err != nil {
			return nil, err
		}
		if cc == nil {
			toDiff = append(toDiff, u)
			continue
		}
		p.Classes = append(p.Classes, *cc)
		if cc.Allowed || !cc.AllowedKnown {
			continue
		}
		ku, err := render.ToUnstructured(storageclass.KeepImmutable(cc.Desired, cc.Live))
		if err != nil {
			return nil, err
		}
		toDiff = append(toDiff, ku)
	}
	return toDiff, nil
}

// classChange returns the ClassChange of rendered class u, or nil when no immutable field
// changes (or there is no live class).
func classChange(ctx context.Context, in Input, src Source, u *unstructured.Unstructured, e inventory.Entry) (*ClassChange, error) {
	k := in.Kept.of(u)
	if vc, ok := src.(versionCache); ok && k != nil {
		// The informer cache still holds the live class this render was last compared with
		// and found no immutable change in: no read. A later write to the class (a delete
		// and create included) reaches the cache as a new UID or resourceVersion, and its
		// watch event reconciles again, which reads it.
		if v, ok := vc.cachedVersion(ctx, u); ok && k.class.is(v) {
			return nil, nil
		}
	}
	lu, err := src.Get(ctx, u.GroupVersionKind(), u.GetName())
	if err != nil || lu == nil {
		return nil, err
	}
	lv := versionOfLive(lu.GetUID(), lu.GetResourceVersion())
	if k != nil && k.class.is(lv) {
		return nil, nil // this render against this live class showed no immutable change
	}
	var want storagev1.StorageClass
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &want); err != nil {
		return nil, fmt.Errorf("StorageClass %s: %w", u.GetName(), err)
	}
	var live storagev1.StorageClass
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(lu.Object, &live); err != nil {
		return nil, fmt.Errorf("live StorageClass %s: %w", want.Name, err)
	}
	changes := storageclass.Diff(&live, &want)
	imm := storageclass.Immutable(changes)
	if len(imm) == 0 {
		if k != nil {
			k.class = lv
		}
		return nil, nil
	}
	placement := want.Labels[policyv1.LabelPlacement]
	cc := &ClassChange{Desired: &want, Live: &live, Entry: e, Placement: placement, Changes: changes, Immutable: imm,
		Policy: EffectiveReplacement(in.Placements[placement]), AllowedKnown: true,
		WasDefault: live.Annotations[storageclass.DefaultClassAnnotation] == "true"}
	if cc.Usage, err = src.ClassUsage(ctx, want.Name); err != nil {
		return nil, err
	}
	switch {
	case !cc.Usage.Known && cc.Policy == policyv1.ReplacementIfUnused:
		cc.AllowedKnown = false
	default:
		cc.Allowed = ReplacementAllowed(cc.Policy, cc.Usage.PVCs, cc.Usage.PVs)
	}
	return cc, nil
}

// diff decides each object without a server round trip where the informer cache can: an
// object whose digest the inventory records and whose cached copy holds every field is
// Unchanged (a no-op reconcile of 1,000 objects makes no request for them); an object the
// inventory does not record and the cache does not hold is a Create (the apply itself is the
// one request it needs; a refusal is reported as the apply's error). The rest go through the
// server-side dry-run, where a changed digest is a policy change and an unchanged digest with
// a live difference is drift.
func (p *Plan) diff(ctx context.Context, in Input, src Source, objs []*unstructured.Unstructured, entries map[*unstructured.Unstructured]inventory.Entry) error {
	p.Objects = make([]Object, len(objs))
	var need []*unstructured.Unstructured
	var at []int
	for i, u := range objs {
		e, ok := entries[u]
		if !ok { // a StorageClass applied with its live immutable fields kept
			var err error
			if e, err = inventory.EntryOf(u); err != nil {
				return err
			}
		}
		o := Object{Object: u, Entry: e, Owners: in.Sources[u.GetKind()+"/"+u.GetName()], Action: Unchanged,
			KeptImmutable: u.GetKind() == "StorageClass" && isKept(p.Classes, u.GetName())}
		p.Objects[i] = o
		old, recorded := in.Previous.Get(e.ID())
		switch cached := src.Cached(ctx, u); {
		case recorded && old.Digest == e.Digest && cached == CacheHolds:
			continue
		case !recorded && cached == CacheAbsent:
			p.Objects[i].Action = Create
			continue
		}
		need = append(need, u)
		at = append(at, i)
	}
	results, err := src.DryRun(ctx, need)
	if err != nil {
		return err
	}
	for j, r := range results {
		o := &p.Objects[at[j]]
		old, known := in.Previous.Get(o.Entry.ID())
		decide(o, r, known && old.Digest == o.Entry.Digest, in)
	}
	return nil
}

func isKept(classes []ClassChange, name string) bool {
	for i := range classes {
		if classes[i].Desired.Name == name && !classes[i].Allowed && classes[i].AllowedKnown {
			return true
		}
	}
	return false
}

// decide sets o's action from its dry-run r; sameDigest says the inventory records the
// object's digest (policy did not change it since the last apply).
func decide(o *Object, r DryRun, sameDigest bool, in Input) {
	u := o.Object
	switch {
	case r.Err != nil:
		o.Action, o.DryRunErr = Rejected, r.Err
		return
	case r.Action == ssa.CreatedAction && sameDigest:
		o.Action, o.Drift = Drift, &drift.Item{Kind: u.GetKind(), Name: u.GetName(), Deleted: true}
	case r.Action == ssa.CreatedAction:
		o.Action = Create
		return
	case r.Action == ssa.ConfiguredAction && sameDigest:
		o.Action, o.Fields = Drift, r.Fields
		o.Drift = &drift.Item{Kind: u.GetKind(), Name: u.GetName(), Fields: r.Fields}
	case r.Action == ssa.ConfiguredAction:
		o.Action, o.Fields = Change, r.Fields
		return
	default:
		return
	}
	o.Correct = CorrectDrift(u, in.Placements, in.Pools)
}

// CorrectDrift says whether drift of u is corrected: a StorageClass (and a VolumeSnapshotClass
// a VolumeGroupSnapshotClass and a VolumeAttributesClass)
// follows the driftPolicy of its Placement's pool, a Store its own (the pool's), and Agents are
// always corrected.
func CorrectDrift(u *unstructured.Unstructured, places map[string]*policyv1.Placement, pools map[string]*policyv1.StoragePool) bool {
	switch u.GetKind() {
	case "Agent":
		return true
	case "Store":
		dp, _, _ := unstructured.NestedString(u.Object, "spec", "driftPolicy")
		return dp == string(policyv1.DriftPolicyCorrect)
	case "StorageClass", policyv1.SnapshotClassKind, policyv1.GroupSnapshotClassKind, render.AttributesClassKind:
		pl := places[u.GetLabels()[policyv1.LabelPlacement]]
		if pl == nil {
			return false
		}
		p := pools[pl.Spec.PoolRef.Name]
		return p != nil && p.Spec.DriftPolicy == policyv1.DriftPolicyCorrect
	}
	return false
}

// prune decides every object of the previous inventory that left the rendered set — from the
// inventory only (never by labels), never in use. Objects already gone are left out.
func (p *Plan) prune(ctx context.Context, in Input, src Source) error {
	keptNodes := map[string]bool{}
	for _, e := range in.Previous.Stale(p.Rendered) {
		live, err := src.Get(ctx, e.GroupVersionKind(), e.Name)
		if err != nil {
			return fmt.Errorf("get %s: %w", e, err)
		}
		if live == nil {
			continue
		}
		pr := Prune{Entry: e, Live: live, Owners: OwnersFromLabels(live), Usage: Usage{Known: true}}
		pr.Node, _, _ = unstructured.NestedString(live.Object, "spec", "nodeName")
		switch e.Kind {
		case "StorageClass":
			pr.Usage, err = src.ClassUsage(ctx, e.Name)
		case render.AttributesClassKind:
			pr.Usage, err = src.AttributesClassUsage(ctx, e.Name)
		case "Store":
			pr.Usage, err = src.StoreUsage(ctx, e.Name)
		}
		if err != nil {
			return err
		}
		pr.Verdict = DecidePrune(live, pr.Usage.PVCs+pr.Usage.PVs, pr.Usage.Volumes, keptNodes)
		if pr.Verdict == PruneKeepDraining && e.Kind == "Store" {
			keptNodes[pr.Node] = true
		}
		p.Prunes = append(p.Prunes, pr)
	}
	return nil
}

// OwnersFromLabels names the policy objects of a live rendered object from its labels (the
// policy may be gone from the render).
func OwnersFromLabels(u *unstructured.Unstructured) []string {
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

// UsageText is "in use by N PVCs[ and M PVs]".
func UsageText(pvcs, pvs int) string {
	s := fmt.Sprintf("in use by %d PVCs", pvcs)
	if pvs > 0 {
		s += fmt.Sprintf(" and %d PVs", pvs)
	}
	return s
}
