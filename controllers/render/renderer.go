package render

import (
	"maps"
	"reflect"
	"sort"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Renderer renders as Render does and keeps, between calls, what each policy object and node
// rendered to, so that a call after a few policy objects changed costs in proportion to what
// they touch, plus one pass over the set: each StoragePool's and Placement's UID and
// resourceVersion (or, without them, its spec) compared with the kept ones, and the NVMe-oF
// endpoints read again. The StorageClass of an unchanged Placement, the Stores of an unchanged
// StoragePool over unchanged Nodes, and the Agents of nodes whose pools and endpoints did not
// change are not rendered again; a change of the Nodes (names or labels) renders every pool's
// Stores again.
//
// Its Output equals Render's for the same Input (TestRendererMatchesRender holds the two equal
// over random sequences of edits, additions and deletions). When the input does not render
// (an *Error) or names two pools, placements or nodes alike, it returns Render's own output and
// error and drops what it kept. The Output shares its slices and maps with the Renderer: it is
// valid, and must not be modified, until the next call. A Renderer must not be used from
// several goroutines at once; the zero value is ready to use.
type Renderer struct {
	pass   uint64
	valid  bool
	nodes  []corev1.Node                // name and labels only, sorted by name
	labels map[string]map[string]string // node name → labels
	pools  map[string]*keptPool
	places map[string]*keptPlacement
	// eps are the endpoints of the last call; spare is the buffer of the next.
	eps, spare poolEndpoints
	protocols  map[string]*policyv1.Protocol
	dirty      map[string]bool
	seen       map[string]struct{}
	// nodePools are the pools that select each node, sorted.
	nodePools map[string][]string
	out       Output
	// last is the Output the last call returned from the kept render (nil after a cold one);
	// conv holds the unstructured form of its objects converted since they were rendered,
	// by kind, then name: an object rendered anew (or dropped) leaves conv.
	last *Output
	conv map[string]map[string]*unstructured.Unstructured
}

type keptPool struct {
	version
	spec  policyv1.StoragePoolSpec
	nodes []string // the nodes it selects, sorted
	pass  uint64
}

type keptPlacement struct {
	version
	spec policyv1.PlacementSpec
	sc   storagev1.StorageClass
	vsc  *unstructured.Unstructured
	vgsc *unstructured.Unstructured
	vacs []storagev1.VolumeAttributesClass
	pass uint64
}

// Render renders in (see Render), reusing what the previous call kept.
func (r *Renderer) Render(in Input) (*Output, error) {
	if out, ok := r.update(in); ok {
		r.last = out
		return out, nil
	}
	*r = Renderer{pass: r.pass}
	return Render(in)
}

// Unstructured returns out's objects as out.Unstructured does — equal maps, in the order of
// Objects — converting only the objects rendered anew since the Renderer last converted them;
// the others are the same *unstructured.Unstructured values as the last call returned. out
// must be the Output of the last Render call (any other Output is converted whole, nothing
// kept). The objects are shared with the Renderer: valid, and not to be modified, until an
// object is rendered anew (the caller may key its own kept state, such as digests, by their
// pointers). The error is a conversion's.
func (r *Renderer) Unstructured(out *Output) ([]*unstructured.Unstructured, error) {
	if out == nil || out != r.last {
		return out.Unstructured()
	}
	if r.conv == nil {
		r.conv = map[string]map[string]*unstructured.Unstructured{}
	}
	objs := make([]*unstructured.Unstructured, 0, len(out.StorageClasses)+len(out.VolumeSnapshotClasses)+len(out.VolumeAttributesClasses)+len(out.Agents)+len(out.Stores))
	var err error
	add := func(kind, name string, obj runtime.Object) {
		if err != nil {
			return
		}
		m := r.conv[kind]
		if m == nil {
			m = map[string]*unstructured.Unstructured{}
			r.conv[kind] = m
		}
		u := m[name]
		if u == nil {
			if u, err = ToUnstructured(obj); err != nil {
				return
			}
			m[name] = u
		}
		objs = append(objs, u)
	}
	for i := range out.StorageClasses {
		add("StorageClass", out.StorageClasses[i].Name, &out.StorageClasses[i])
	}
	for i := range out.VolumeSnapshotClasses {
		add(policyv1.SnapshotClassKind, out.VolumeSnapshotClasses[i].GetName(), &out.VolumeSnapshotClasses[i])
	}
	for i := range out.VolumeGroupSnapshotClasses {
		add(policyv1.GroupSnapshotClassKind, out.VolumeGroupSnapshotClasses[i].GetName(), &out.VolumeGroupSnapshotClasses[i])
	}
	for i := range out.VolumeAttributesClasses {
		add(AttributesClassKind, out.VolumeAttributesClasses[i].Name, &out.VolumeAttributesClasses[i])
	}
	for i := range out.Agents {
		add("Agent", out.Agents[i].Name, &out.Agents[i])
	}
	for i := range out.Stores {
		add("Store", out.Stores[i].Name, &out.Stores[i])
	}
	if err != nil {
		clear(r.conv)
		return nil, err
	}
	return objs, nil
}

// forget drops the kept conversions of the objects of kind named in names.
func (r *Renderer) forget(kind string, names ...string) {
	if m := r.conv[kind]; m != nil {
		for _, n := range names {
			delete(m, n)
		}
	}
}

// update brings the kept render up to in; false when in does not render or is outside what
// the kept render handles (names given twice): the caller renders from scratch.
func (r *Renderer) update(in Input) (*Output, bool) {
	r.pass++
	if !r.valid {
		*r = Renderer{pass: r.pass, valid: true, labels: map[string]map[string]string{}, pools: map[string]*keptPool{},
			places: map[string]*keptPlacement{}, nodePools: map[string][]string{}, out: Output{Sources: map[string][]string{}}}
	}
	nodesChanged, ok := r.updateNodes(in.Nodes)
	if !ok {
		return nil, false
	}
	if r.protocols == nil {
		r.protocols, r.dirty = map[string]*policyv1.Protocol{}, map[string]bool{}
	}
	clear(r.protocols)
	for i := range in.Protocols {
		r.protocols[in.Protocols[i].Name] = &in.Protocols[i]
	}
	eps := &r.spare // this call's endpoints; the kept ones are r.eps
	if errs := eps.read(in.Placements, r.protocols); len(errs) > 0 {
		return nil, false
	}
	clear(r.protocols) // no pointers into in kept

	var d delta
	if !r.updatePools(in.Pools, nodesChanged, eps, &d) {
		return nil, false
	}
	r.eps, r.spare = r.spare, r.eps
	if !r.updateAgents(&d) || !r.updatePlacements(in.Placements, &d) {
		return nil, false
	}
	r.updateSources(&d)
	if !r.patch(&d) {
		return nil, false
	}
	out := r.out
	return &out, true
}

// delta is what one update changes in the kept render: per kind, the names of the objects
// dropped and the objects rendered anew (an object rendered again under its name is both).
type delta struct {
	dropClasses, dropSnapClasses, dropGroupClasses, dropAttrClasses, dropStores, dropAgents []string

	addClasses                      []storagev1.StorageClass
	addSnapClasses, addGroupClasses []unstructured.Unstructured
	addAttrClasses                  []storagev1.VolumeAttributesClass
	addStores                       []storev1.Store
	addAgents                       []storev1.Agent
}

// updatePools renders the Stores of the StoragePools that changed (or all of them, when the
// Nodes' labels changed) into d and marks in r.dirty the nodes whose Agent must be rendered
// again: those of a changed pool and those whose pool's NVMe-oF endpoints (eps, this call's)
// changed. False when a pool is named twice or selects no valid nodes.
func (r *Renderer) updatePools(pools []policyv1.StoragePool, nodesChanged bool, eps *poolEndpoints, d *delta) bool {
	dirty := r.dirty
	clear(dirty)
	changed := func(name string, kp *keptPool) {
		for _, n := range kp.nodes {
			dirty[n] = true
			r.nodePools[n] = remove(r.nodePools[n], name)
			d.dropStores = append(d.dropStores, storev1.StoreName(name, n))
		}
	}
	for i := range pools {
		p := &pools[i]
		kp := r.pools[p.Name]
		if kp != nil && kp.pass == r.pass {
			return false // a pool named twice
		}
		if kp != nil && !nodesChanged && (kp.same(&p.ObjectMeta) || reflect.DeepEqual(&kp.spec, &p.Spec)) {
			kp.version = versionOf(&p.ObjectMeta)
			kp.pass = r.pass
			if !eps.same(&r.eps, p.Name) {
				for _, n := range kp.nodes {
					dirty[n] = true
				}
			}
			continue
		}
		names, err := selectNodes(p, r.nodes)
		if err != nil {
			return false
		}
		if kp != nil {
			changed(p.Name, kp)
		}
		kp = &keptPool{version: versionOf(&p.ObjectMeta), spec: *p.Spec.DeepCopy(), nodes: names, pass: r.pass}
		r.pools[p.Name] = kp
		for _, n := range names {
			dirty[n] = true
			r.nodePools[n] = insert(r.nodePools[n], p.Name)
			d.addStores = append(d.addStores, store(p, n))
		}
	}
	for name, kp := range r.pools {
		if kp.pass != r.pass {
			changed(name, kp)
			delete(r.pools, name)
		}
	}
	return true
}

// updateAgents renders into d the Agent of every node updatePools marked dirty, from the
// kept endpoints; false when one node would get two different NVMe-oF endpoints (Render
// says which).
func (r *Renderer) updateAgents(d *delta) bool {
	eps := &r.eps
	for n := range r.dirty {
		if _, ok := r.out.Sources["Agent/"+n]; ok {
			d.dropAgents = append(d.dropAgents, n)
		}
		pools := r.nodePools[n]
		if len(pools) == 0 {
			delete(r.nodePools, n)
			continue
		}
		stores := make([]string, len(pools))
		var ep *storev1.NVMeoFEndpoint
		for i, p := range pools {
			stores[i] = storev1.StoreName(p, n)
			if e := eps.endpoint[p]; e != nil {
				if ep != nil && *ep != *e {
					return false
				}
				ep = e
			}
		}
		sort.Strings(stores)
		d.addAgents = append(d.addAgents, newAgent(n, stores, pools, ep, eps))
	}
	return true
}

// updatePlacements renders into d the classes of the Placements that changed: the
// StorageClass, the VolumeSnapshotClass and VolumeGroupSnapshotClass when asked for, and the
// VolumeAttributesClasses; false when a Placement is named twice.
func (r *Renderer) updatePlacements(placements []policyv1.Placement, d *delta) bool {
	gone := func(kp *keptPlacement) {
		d.dropClasses = append(d.dropClasses, kp.sc.Name)
		if kp.vsc != nil {
			d.dropSnapClasses = append(d.dropSnapClasses, kp.vsc.GetName())
		}
		if kp.vgsc != nil {
			d.dropGroupClasses = append(d.dropGroupClasses, kp.vgsc.GetName())
		}
		for i := range kp.vacs {
			d.dropAttrClasses = append(d.dropAttrClasses, kp.vacs[i].Name)
		}
	}
	for i := range placements {
		pl := &placements[i]
		kp := r.places[pl.Name]
		if kp != nil && kp.pass == r.pass {
			return false // a placement named twice
		}
		if kp != nil && (kp.same(&pl.ObjectMeta) || reflect.DeepEqual(&kp.spec, &pl.Spec)) {
			kp.version = versionOf(&pl.ObjectMeta)
			kp.pass = r.pass
			continue
		}
		if kp != nil {
			gone(kp)
		}
		kp = &keptPlacement{version: versionOf(&pl.ObjectMeta), spec: *pl.Spec.DeepCopy(), sc: storageClass(pl), pass: r.pass}
		d.addClasses = append(d.addClasses, kp.sc)
		if pl.Spec.SnapshotClass != nil {
			vsc := snapshotClass(pl)
			kp.vsc = &vsc
			d.addSnapClasses = append(d.addSnapClasses, vsc)
			if pl.Spec.SnapshotClass.Group {
				gc := groupSnapshotClass(pl)
				kp.vgsc = &gc
				d.addGroupClasses = append(d.addGroupClasses, gc)
			}
		}
		kp.vacs = attributesClasses(pl)
		d.addAttrClasses = append(d.addAttrClasses, kp.vacs...)
		r.places[pl.Name] = kp
	}
	for name, kp := range r.places {
		if kp.pass != r.pass {
			gone(kp)
			delete(r.places, name)
		}
	}
	return true
}

// updateSources brings the kept Sources and conversions up to d: every dropped key first,
// then the added ones (a name may move between objects).
func (r *Renderer) updateSources(d *delta) {
	src := r.out.Sources
	for _, drop := range []struct {
		kind  string
		names []string
	}{
		{"StorageClass", d.dropClasses}, {policyv1.SnapshotClassKind, d.dropSnapClasses},
		{policyv1.GroupSnapshotClassKind, d.dropGroupClasses}, {AttributesClassKind, d.dropAttrClasses},
		{"Store", d.dropStores}, {"Agent", d.dropAgents},
	} {
		for _, n := range drop.names {
			delete(src, drop.kind+"/"+n)
		}
		// Every object rendered anew replaces one dropped under its name or takes a new name
		// (a name in the kept render that is neither dropped nor new would be rendered twice,
		// which patchSorted refuses): forgetting the dropped names forgets every stale
		// conversion.
		r.forget(drop.kind, drop.names...)
	}
	for i := range d.addClasses {
		sc := &d.addClasses[i]
		src["StorageClass/"+sc.Name] = sortedUnique([]string{"Placement/" + sc.Labels[policyv1.LabelPlacement],
			"StoragePool/" + sc.Labels[policyv1.LabelPool], "Protocol/" + sc.Labels[policyv1.LabelProtocol]})
	}
	for i := range d.addSnapClasses {
		vsc := &d.addSnapClasses[i]
		src[policyv1.SnapshotClassKind+"/"+vsc.GetName()] = []string{"Placement/" + vsc.GetLabels()[policyv1.LabelPlacement]}
	}
	for i := range d.addGroupClasses {
		gc := &d.addGroupClasses[i]
		src[policyv1.GroupSnapshotClassKind+"/"+gc.GetName()] = []string{"Placement/" + gc.GetLabels()[policyv1.LabelPlacement]}
	}
	for i := range d.addAttrClasses {
		src[AttributesClassKind+"/"+d.addAttrClasses[i].Name] = []string{"Placement/" + d.addAttrClasses[i].Labels[policyv1.LabelPlacement]}
	}
	for i := range d.addStores {
		src["Store/"+d.addStores[i].Name] = []string{"StoragePool/" + d.addStores[i].Spec.Pool}
	}
	for i := range d.addAgents {
		src["Agent/"+d.addAgents[i].Name] = agentSources(r.nodePools[d.addAgents[i].Name])
	}
}

// patch applies d to the kept Output's sorted object lists; false when d would leave a name
// twice in a list (see patchSorted).
func (r *Renderer) patch(d *delta) bool {
	var ok bool
	if r.out.StorageClasses, ok = patchSorted(r.out.StorageClasses, func(sc *storagev1.StorageClass) string { return sc.Name }, d.dropClasses, d.addClasses); !ok {
		return false
	}
	if r.out.VolumeSnapshotClasses, ok = patchSorted(r.out.VolumeSnapshotClasses, unstructuredName, d.dropSnapClasses, d.addSnapClasses); !ok {
		return false
	}
	if r.out.VolumeGroupSnapshotClasses, ok = patchSorted(r.out.VolumeGroupSnapshotClasses, unstructuredName, d.dropGroupClasses, d.addGroupClasses); !ok {
		return false
	}
	if r.out.VolumeAttributesClasses, ok = patchSorted(r.out.VolumeAttributesClasses, func(v *storagev1.VolumeAttributesClass) string { return v.Name }, d.dropAttrClasses, d.addAttrClasses); !ok {
		return false
	}
	if r.out.Stores, ok = patchSorted(r.out.Stores, func(st *storev1.Store) string { return st.Name }, d.dropStores, d.addStores); !ok {
		return false
	}
	r.out.Agents, ok = patchSorted(r.out.Agents, func(a *storev1.Agent) string { return a.Name }, d.dropAgents, d.addAgents)
	return ok
}

func unstructuredName(u *unstructured.Unstructured) string { return u.GetName() }

// version is the UID and resourceVersion of a policy object as the API server gave them ("" for
// objects read from files). The API server changes the resourceVersion on every write, so an
// object whose UID and resourceVersion are the kept ones has the kept spec: it is not compared.
type version struct{ uid, resourceVersion string }

func versionOf(m *metav1.ObjectMeta) version { return version{string(m.UID), m.ResourceVersion} }

// same reports whether m is the kept object at the kept resourceVersion.
func (v version) same(m *metav1.ObjectMeta) bool {
	return v.uid != "" && v.resourceVersion != "" && v.uid == string(m.UID) && v.resourceVersion == m.ResourceVersion
}

// updateNodes records the Nodes' names and labels; changed is true when they differ from the
// kept ones. It is false when a node is named twice.
func (r *Renderer) updateNodes(nodes []corev1.Node) (changed, ok bool) {
	if r.seen == nil {
		r.seen = make(map[string]struct{}, len(nodes))
	}
	seen := r.seen
	clear(seen)
	changed = len(nodes) != len(r.labels)
	for i := range nodes {
		n := &nodes[i]
		if _, dup := seen[n.Name]; dup {
			return false, false
		}
		seen[n.Name] = struct{}{}
		if l, ok := r.labels[n.Name]; !changed && (!ok || !maps.Equal(l, n.Labels)) {
			changed = true
		}
	}
	if !changed {
		return false, true
	}
	r.labels = make(map[string]map[string]string, len(nodes))
	r.nodes = make([]corev1.Node, len(nodes))
	for i := range nodes {
		l := maps.Clone(nodes[i].Labels)
		r.labels[nodes[i].Name] = l
		r.nodes[i].Name, r.nodes[i].Labels = nodes[i].Name, l
	}
	sort.Slice(r.nodes, func(i, j int) bool { return r.nodes[i].Name < r.nodes[j].Name })
	return true, true
}

// patchSorted returns sorted (ascending by name, names unique) without the items named in drop
// and with add merged in. When add renders exactly the names dropped, they are replaced in
// place; otherwise a new slice is made. It is false when the result would name an item twice.
// An empty result is nil, as Render leaves it.
func patchSorted[T any](sorted []T, name func(*T) string, drop []string, add []T) ([]T, bool) {
	if len(drop) == 0 && len(add) == 0 {
		return sorted, true
	}
	sort.Slice(add, func(i, j int) bool { return name(&add[i]) < name(&add[j]) })
	sort.Strings(drop)
	same := len(drop) == len(add)
	for i := 0; same && i < len(add); i++ {
		same = drop[i] == name(&add[i])
	}
	if same {
		for i := range add {
			n := drop[i]
			j := sort.Search(len(sorted), func(j int) bool { return name(&sorted[j]) >= n })
			if j == len(sorted) || name(&sorted[j]) != n || i > 0 && drop[i-1] == n {
				return nil, false
			}
			sorted[j] = add[i]
		}
		return sorted, true
	}
	dropped := make(map[string]bool, len(drop))
	for _, n := range drop {
		dropped[n] = true
	}
	out := make([]T, 0, max(len(sorted)-len(drop), 0)+len(add))
	a := 0
	for i := range sorted {
		n := name(&sorted[i])
		if dropped[n] {
			continue
		}
		for a < len(add) && name(&add[a]) < n {
			out = append(out, add[a])
			a++
		}
		out = append(out, sorted[i])
	}
	out = append(out, add[a:]...)
	for i := 1; i < len(out); i++ {
		if name(&out[i-1]) >= name(&out[i]) {
			return nil, false
		}
	}
	if len(out) == 0 {
		return nil, true
	}
	return out, true
}

// insert adds s to the sorted list l (once).
func insert(l []string, s string) []string {
	i := sort.SearchStrings(l, s)
	if i < len(l) && l[i] == s {
		return l
	}
	return append(l[:i], append([]string{s}, l[i:]...)...)
}

// remove takes s out of the sorted list l.
func remove(l []string, s string) []string {
	i := sort.SearchStrings(l, s)
	if i < len(l) && l[i] == s {
		return append(l[:i:i], l[i+1:]...)
	}
	return l
}
