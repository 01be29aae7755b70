package render

import (
	"fmt"
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
	Agents                []storev1.Agent
	Stores                []storev1.Store
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
		p := &in.Pools[i]
		if p.Spec.NodeSelector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
		if err != nil {
			errs = append(errs, &Error{Kind: "StoragePool", Name: p.Name, Field: "spec.nodeSelector", Message: err.Error()})
			continue
		}
		if sel.Empty() {
			continue // an empty selector selects no node: a pool must say where it lives
		}
		for j := range nodes {
			if sel.Matches(labels.Set(nodes[j].Labels)) {
				poolNodes[p.Name] = append(poolNodes[p.Name], nodes[j].Name)
			}
		}
	}

	// Endpoint per pool: the NVMe-oF protocol of the placements that use it.
	poolEndpoint := map[string]*storev1.NVMeoFEndpoint{}
	poolEndpointFrom := map[string]string{}
	// pools served by a Protocol with DH-HMAC-CHAP: their nodes' agents need target auth
	poolAuth := map[string]bool{}
	// and the keyGeneration they rotate the hosts' secrets to (the highest, as controllers/nvmeauth)
	poolKeyGeneration := map[string]int64{}
	for i := range in.Placements {
		pl := &in.Placements[i]
		proto := protocols[pl.Spec.ProtocolRef.Name]
		if proto == nil || proto.Spec.NVMeoFTCP == nil {
			continue
		}
		if proto.Spec.NVMeoFTCP.Auth.Enabled() {
			poolAuth[pl.Spec.PoolRef.Name] = true
			poolKeyGeneration[pl.Spec.PoolRef.Name] = max(poolKeyGeneration[pl.Spec.PoolRef.Name], proto.Spec.NVMeoFTCP.Auth.KeyGeneration)
		}
		ep := &storev1.NVMeoFEndpoint{Port: portOrDefault(proto.Spec.NVMeoFTCP.Port), BindCIDR: proto.Spec.NVMeoFTCP.BindCIDR}
		if prev, ok := poolEndpoint[pl.Spec.PoolRef.Name]; ok && *prev != *ep {
			errs = append(errs, &Error{Kind: "Placement", Name: pl.Name, Field: "spec.protocolRef",
				Message: fmt.Sprintf("pool %q is already served over NVMe-oF by Protocol %q with another endpoint (%s:%d); one pool has one endpoint per node",
					pl.Spec.PoolRef.Name, poolEndpointFrom[pl.Spec.PoolRef.Name], prev.BindCIDR, prev.Port)})
			continue
		}
		poolEndpoint[pl.Spec.PoolRef.Name] = ep
		poolEndpointFrom[pl.Spec.PoolRef.Name] = proto.Name
	}

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
			if ep := poolEndpoint[pn]; ep != nil {
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
		a := storev1.Agent{
			TypeMeta: metav1.TypeMeta{APIVersion: storev1.GroupVersion.String(), Kind: "Agent"},
			ObjectMeta: metav1.ObjectMeta{
				Name:        n.Name,
				Labels:      map[string]string{policyv1.LabelManagedBy: ManagedBy, policyv1.LabelNode: storev1.NameLabelValue(n.Name)},
				Annotations: map[string]string{AnnotationPools: strings.Join(sortedUnique(agentPools[n.Name]), ",")},
			},
			Spec: storev1.AgentSpec{NodeName: n.Name, Stores: storesOf},
		}
		if ep := agentEndpoint[n.Name]; ep != nil {
			c := *ep
			for _, p := range agentPools[n.Name] {
				c.Auth = c.Auth || poolAuth[p]
				c.AuthKeyGeneration = max(c.AuthKeyGeneration, poolKeyGeneration[p])
			}
			a.Spec.NVMeoF = &c
		}
		out.Agents = append(out.Agents, a)
		var src []string
		for _, p := range agentPools[n.Name] {
			src = append(src, "StoragePool/"+p)
		}
		out.Sources["Agent/"+a.Name] = sortedUnique(src)
	}

	sort.Slice(out.StorageClasses, func(i, j int) bool { return out.StorageClasses[i].Name < out.StorageClasses[j].Name })
	sort.Slice(out.VolumeSnapshotClasses, func(i, j int) bool {
		return out.VolumeSnapshotClasses[i].GetName() < out.VolumeSnapshotClasses[j].GetName()
	})
	sort.Slice(out.Stores, func(i, j int) bool { return out.Stores[i].Name < out.Stores[j].Name })
	if len(errs) > 0 {
		return out, joinErrors(errs)
	}
	return out, nil
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
		// otherwise look like drift on an immutable field (field case B40).
		ReclaimPolicy:        &reclaim,
		VolumeBindingMode:    &binding,
		AllowVolumeExpansion: &expand,
		MountOptions:         append([]string(nil), pl.Spec.Filesystem.MountOptions...),
	}
	if k := pl.Spec.SpreadAcross; k != "" {
		// Only when set: classes of placements without it keep the parameters they had.
		sc.Parameters[policyv1.ParamSpreadAcross] = k
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
