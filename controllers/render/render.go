package render

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// ManagedBy is the value of app.kubernetes.io/managed-by on everything Plinth renders.
const ManagedBy = "plinth"

// AnnotationPools lists, comma-separated and sorted, the StoragePools an Agent serves.
const AnnotationPools = "plinth.dev/pools"

// defaultClassAnnotation is the annotation Kubernetes reads to pick the default StorageClass.
const defaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"

// Input is what render reads: the policy objects (already vetted) and the Nodes.
type Input struct {
	Pools      []policyv1.StoragePool
	Protocols  []policyv1.Protocol
	Placements []policyv1.Placement
	Nodes      []corev1.Node
}

// Output is what render produces, each slice sorted by name.
type Output struct {
	StorageClasses []storagev1.StorageClass
	// VolumeSnapshotClasses are the classes of the Placements that ask for one
	// (spec.snapshotClass): snapshot.storage.k8s.io/v1 objects, unstructured because their
	// types belong to external-snapshotter (snapshotclass.go).
	VolumeSnapshotClasses []unstructured.Unstructured
	// VolumeGroupSnapshotClasses are the group classes of the Placements whose
	// spec.snapshotClass asks for one (group), groupsnapshot.storage.k8s.io/v1, sorted by name.
	VolumeGroupSnapshotClasses []unstructured.Unstructured
	// VolumeAttributesClasses are the tiers of the Placements (spec.attributesClasses,
	// attributesclass.go).
	VolumeAttributesClasses []storagev1.VolumeAttributesClass
	Agents                  []storev1.Agent
	Stores                  []storev1.Store
	// Sources maps "<Kind>/<name>" of each produced object to the policy objects that produced
	// it, as "<Kind>/<name>" strings, sorted.
	Sources map[string][]string
}

// Error is a render failure tied to one policy object, such as an invalid label selector or
// two protocols that need different NVMe-oF endpoints on one node.
type Error struct {
	Kind, Name string
	Field      string
	Message    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s/%s: %s: %s", e.Kind, e.Name, e.Field, e.Message)
}

// Render produces the objects for in. It returns an *Error (possibly several, joined) when a
// policy cannot be rendered; it never panics on vetted input and is deterministic.
func Render(in Input) (*Output, error) {
	out := &Output{Sources: map[string][]string{}}
	protocols := make(map[string]*policyv1.Protocol, len(in.Protocols))
	for i := range in.Protocols {
		protocols[in.Protocols[i].Name] = &in.Protocols[i]
	}
	pools := make(map[string]*policyv1.StoragePool, len(in.Pools))
	for i := range in.Pools {
		pools[in.Pools[i].Name] = &in.Pools[i]
	}

	// Nodes by pool: each selector is evaluated once per node.
	nodes := append([]corev1.Node(nil), in.Nodes...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	poolNodes := make(map[string][]string, len(in.Pools))
	var errs []error
	for i := range in.Pools {
		names, err := selectNodes(&in.Pools[i], nodes)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if names != nil {
			poolNodes[in.Pools[i].Name] = names
		}
	}

	eps, epErrs := endpoints(in.Placements, protocols)
	errs = append(errs, epErrs...)

	// StorageClasses.
	for i := range in.Placements {
		pl := &in.Placements[i]
		sc := storageClass(pl)
		out.StorageClasses = append(out.StorageClasses, sc)
		out.Sources["StorageClass/"+sc.Name] = sortedUnique([]string{
			"Placement/" + pl.Name, "StoragePool/" + pl.Spec.PoolRef.Name, "Protocol/" + pl.Spec.ProtocolRef.Name})
		if pl.Spec.SnapshotClass != nil {
			vsc := snapshotClass(pl)
			out.VolumeSnapshotClasses = append(out.VolumeSnapshotClasses, vsc)
			out.Sources[policyv1.SnapshotClassKind+"/"+vsc.GetName()] = []string{"Placement/" + pl.Name}
			if pl.Spec.SnapshotClass.Group {
				gc := groupSnapshotClass(pl)
				out.VolumeGroupSnapshotClasses = append(out.VolumeGroupSnapshotClasses, gc)
				out.Sources[policyv1.GroupSnapshotClassKind+"/"+gc.GetName()] = []string{"Placement/" + pl.Name}
			}
		}
		for _, vac := range attributesClasses(pl) {
			out.VolumeAttributesClasses = append(out.VolumeAttributesClasses, vac)
			out.Sources[AttributesClassKind+"/"+vac.Name] = []string{"Placement/" + pl.Name}
		}
	}

	// Stores and Agents.
	agentStores := map[string][]string{}
	agentPools := map[string][]string{}
	agentEndpoint := map[string]*storev1.NVMeoFEndpoint{}
	agentEndpointPool := map[string]string{}
	poolNames := make([]string, 0, len(in.Pools))
	for i := range in.Pools {
		poolNames = append(poolNames, in.Pools[i].Name)
	}
	sort.Strings(poolNames)
	for _, pn := range poolNames {
		p := pools[pn]
		for _, node := range poolNodes[pn] {
			st := store(p, node)
			out.Stores = append(out.Stores, st)
			out.Sources["Store/"+st.Name] = []string{"StoragePool/" + pn}
			agentStores[node] = append(agentStores[node], st.Name)
			agentPools[node] = append(agentPools[node], pn)
			if ep := eps.endpoint[pn]; ep != nil {
				if prev, ok := agentEndpoint[node]; ok && *prev != *ep {
					errs = append(errs, &Error{Kind: "StoragePool", Name: pn, Field: "spec.nodeSelector",
						Message: fmt.Sprintf("node %q would serve NVMe-oF on %s:%d for this pool and on %s:%d for pool %q; an agent has one NVMe-oF endpoint",
							node, ep.BindCIDR, ep.Port, prev.BindCIDR, prev.Port, agentEndpointPool[node])})
					continue
				}
				agentEndpoint[node] = ep
				agentEndpointPool[node] = pn
			}
		}
	}
	for _, n := range nodes {
		storesOf, ok := agentStores[n.Name]
		if !ok {
			continue
		}
		sort.Strings(storesOf)
		a := newAgent(n.Name, storesOf, agentPools[n.Name], agentEndpoint[n.Name], &eps)
		out.Agents = append(out.Agents, a)
		out.Sources["Agent/"+a.Name] = agentSources(agentPools[n.Name])
	}

	sort.Slice(out.StorageClasses, func(i, j int) bool { return out.StorageClasses[i].Name < out.StorageClasses[j].Name })
	sort.Slice(out.VolumeGroupSnapshotClasses, func(i, j int) bool {
		return out.VolumeGroupSnapshotClasses[i].GetName() < out.VolumeGroupSnapshotClasses[j].GetName()
	})
	sort.Slice(out.VolumeSnapshotClasses, func(i, j int) bool {
		return out.VolumeSnapshotClasses[i].GetName() < out.VolumeSnapshotClasses[j].GetName()
	})
	sort.Slice(out.VolumeAttributesClasses, func(i, j int) bool {
		return out.VolumeAttributesClasses[i].Name < out.VolumeAttributesClasses[j].Name
	})
	sort.Slice(out.Stores, func(i, j int) bool { return out.Stores[i].Name < out.Stores[j].Name })
	if len(errs) > 0 {
		return out, joinErrors(errs)
	}
	return out, nil
}

// selectNodes returns the names of the nodes (sorted by name) that p's selector selects, in
// that order; nil when it has no selector or an empty one (a pool must say where it lives). The
// error is an *Error naming a selector that does not parse.
func selectNodes(p *policyv1.StoragePool, nodes []corev1.Node) ([]string, error) {
	if p.Spec.NodeSelector == nil {
		return nil, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
	if err != nil {
		return nil, &Error{Kind: "StoragePool", Name: p.Name, Field: "spec.nodeSelector", Message: err.Error()}
	}
	if sel.Empty() {
		return nil, nil
	}
	var names []string
	for j := range nodes {
		if sel.Matches(labels.Set(nodes[j].Labels)) {
			names = append(names, nodes[j].Name)
		}
	}
	return names, nil
}

// poolEndpoints is what the Placements and their Protocols say of each pool's NVMe-oF endpoint,
// keyed by pool name.
type poolEndpoints struct {
	endpoint map[string]*storev1.NVMeoFEndpoint
	// auth: pools served by a Protocol with DH-HMAC-CHAP (their nodes' agents need target
	// auth). Their keyGeneration is controllers/nvmeauth's alone: it reaches the agents through
	// the key server.
	auth map[string]bool
	// from names the Protocol that set each endpoint.
	from map[string]string
}

// endpoints reads the endpoint of each pool from the NVMe-oF Protocols of the placements that
// use it, in placement order; a pool served with two endpoints is an *Error on the later
// placement.
func endpoints(placements []policyv1.Placement, protocols map[string]*policyv1.Protocol) (poolEndpoints, []error) {
	var eps poolEndpoints
	errs := eps.read(placements, protocols)
	return eps, errs
}

// read fills e (emptied first, its maps kept) as endpoints does.
func (e *poolEndpoints) read(placements []policyv1.Placement, protocols map[string]*policyv1.Protocol) []error {
	if e.endpoint == nil {
		*e = poolEndpoints{endpoint: map[string]*storev1.NVMeoFEndpoint{}, auth: map[string]bool{}, from: map[string]string{}}
	}
	clear(e.endpoint)
	clear(e.auth)
	clear(e.from)
	eps, from := e, e.from
	var errs []error
	for i := range placements {
		pl := &placements[i]
		proto := protocols[pl.Spec.ProtocolRef.Name]
		if proto == nil || proto.Spec.NVMeoFTCP == nil {
			continue
		}
		pool := pl.Spec.PoolRef.Name
		if proto.Spec.NVMeoFTCP.Auth.Enabled() {
			eps.auth[pool] = true
		}
		ep := &storev1.NVMeoFEndpoint{Port: portOrDefault(proto.Spec.NVMeoFTCP.Port), BindCIDR: proto.Spec.NVMeoFTCP.BindCIDR}
		if prev, ok := eps.endpoint[pool]; ok && *prev != *ep {
			errs = append(errs, &Error{Kind: "Placement", Name: pl.Name, Field: "spec.protocolRef",
				Message: fmt.Sprintf("pool %q is already served over NVMe-oF by Protocol %q with another endpoint (%s:%d); one pool has one endpoint per node",
					pool, from[pool], prev.BindCIDR, prev.Port)})
			continue
		}
		eps.endpoint[pool] = ep
		from[pool] = proto.Name
	}
	return errs
}

// same reports whether pool's endpoint and auth are the same in e and o.
func (e *poolEndpoints) same(o *poolEndpoints, pool string) bool {
	a, b := e.endpoint[pool], o.endpoint[pool]
	return (a == nil) == (b == nil) && (a == nil || *a == *b) &&
		e.auth[pool] == o.auth[pool]
}

// newAgent renders the Agent of node, which serves stores (sorted) of pools (in name order)
// with NVMe-oF endpoint ep (nil: none).
func newAgent(node string, stores, pools []string, ep *storev1.NVMeoFEndpoint, eps *poolEndpoints) storev1.Agent {
	a := storev1.Agent{
		TypeMeta: metav1.TypeMeta{APIVersion: storev1.GroupVersion.String(), Kind: "Agent"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        node,
			Labels:      map[string]string{policyv1.LabelManagedBy: ManagedBy, policyv1.LabelNode: storev1.NameLabelValue(node)},
			Annotations: map[string]string{AnnotationPools: strings.Join(sortedUnique(append([]string(nil), pools...)), ",")},
		},
		Spec: storev1.AgentSpec{NodeName: node, Stores: stores},
	}
	if ep != nil {
		c := *ep
		for _, p := range pools {
			c.Auth = c.Auth || eps.auth[p]
		}
		a.Spec.NVMeoF = &c
	}
	return a
}

// agentSources names the pools of an Agent as its Sources entry.
func agentSources(pools []string) []string {
	src := make([]string, 0, len(pools))
	for _, p := range pools {
		src = append(src, "StoragePool/"+p)
	}
	return sortedUnique(src)
}

func storageClass(pl *policyv1.Placement) storagev1.StorageClass {
	t := pl.Spec.StorageClass
	reclaim := corev1.PersistentVolumeReclaimPolicy(orDefault(t.ReclaimPolicy, "Delete"))
	binding := storagev1.VolumeBindingMode(orDefault(t.VolumeBindingMode, "WaitForFirstConsumer"))
	expand := t.AllowVolumeExpansion
	protoName := pl.Spec.ProtocolRef.Name
	sc := storagev1.StorageClass{
		TypeMeta: metav1.TypeMeta{APIVersion: "storage.k8s.io/v1", Kind: "StorageClass"},
		ObjectMeta: metav1.ObjectMeta{
			Name: t.Name,
			Labels: map[string]string{
				policyv1.LabelManagedBy: ManagedBy,
				policyv1.LabelPlacement: pl.Name,
				policyv1.LabelPool:      pl.Spec.PoolRef.Name,
				policyv1.LabelProtocol:  protoName,
			},
		},
		Provisioner: policyv1.DriverName,
		Parameters: map[string]string{
			policyv1.ParamPlacement: pl.Name,
			policyv1.ParamPool:      pl.Spec.PoolRef.Name,
			policyv1.ParamProtocol:  protoName,
			policyv1.ParamFSType:    orDefault(pl.Spec.Filesystem.FSType, "ext4"),
		},
		// Written explicitly, never left to server defaults: a later explicit value would
		// otherwise look like drift on an immutable field.
		ReclaimPolicy:        &reclaim,
		VolumeBindingMode:    &binding,
		AllowVolumeExpansion: &expand,
		MountOptions:         append([]string(nil), pl.Spec.Filesystem.MountOptions...),
	}
	if k := pl.Spec.SpreadAcross; k != "" {
		// Only when set: classes of placements without it keep the parameters they had.
		sc.Parameters[policyv1.ParamSpreadAcross] = k
	}
	if e := pl.Spec.Encryption; e != nil {
		// kubelet reads the Secret these name (under the Node authorizer) and hands it to
		// NodeStage: the node plugin itself holds no Secret permission.
		ref := policyv1.VolumeKeySecretRef(e, "${pv.name}")
		sc.Parameters[policyv1.ParamNodeStageSecretName] = ref.Name
		sc.Parameters[policyv1.ParamNodeStageSecretNamespace] = ref.Namespace
		// the same Secret at every publish: kubelet republishes mounted volumes (CSIDriver
		// requiresRepublish) with the Secret read afresh, and the node plugin re-wraps the
		// header of a staged volume whose key was rotated (keyGeneration, never a parameter:
		// raising it must not replace the class)
		sc.Parameters[policyv1.ParamNodePublishSecretName] = ref.Name
		sc.Parameters[policyv1.ParamNodePublishSecretNamespace] = ref.Namespace
	}
	if t.IsDefault {
		sc.Annotations = map[string]string{defaultClassAnnotation: "true"}
	}
	return sc
}

func store(p *policyv1.StoragePool, node string) storev1.Store {
	over := int32(100)
	if p.Spec.OvercommitPercent != nil {
		over = *p.Spec.OvercommitPercent
	}
	// Only when set: Stores of pools that evacuate nothing and keep the default concurrency
	// keep the spec they had.
	var parallel int32
	if p.Spec.MaxParallelMovesPerStore > policyv1.DefaultMaxParallelMovesPerStore {
		parallel = p.Spec.MaxParallelMovesPerStore
	}
	return storev1.Store{
		TypeMeta: metav1.TypeMeta{APIVersion: storev1.GroupVersion.String(), Kind: "Store"},
		ObjectMeta: metav1.ObjectMeta{
			Name: storev1.StoreName(p.Name, node),
			Labels: map[string]string{
				policyv1.LabelManagedBy: ManagedBy,
				policyv1.LabelPool:      p.Name,
				policyv1.LabelNode:      storev1.NameLabelValue(node),
			},
		},
		Spec: storev1.StoreSpec{
			Pool:              p.Name,
			NodeName:          node,
			Backend:           *p.Spec.Backend.DeepCopy(),
			Reserve:           orDefault(p.Spec.Reserve, "0"),
			OvercommitPercent: over,
			DriftPolicy:       policyv1.DriftPolicy(orDefault(string(p.Spec.DriftPolicy), string(policyv1.DriftPolicyReport))),
			Evacuate:          slices.Contains(p.Spec.EvacuateNodes, node),
			MaxParallelMoves:  parallel,
		},
	}
}

func portOrDefault(p int32) int32 {
	if p == 0 {
		return 4420
	}
	return p
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func sortedUnique(in []string) []string {
	sort.Strings(in)
	out := in[:0]
	for i, s := range in {
		if i == 0 || s != in[i-1] {
			out = append(out, s)
		}
	}
	return out
}
