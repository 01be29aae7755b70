package capacity

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

const (
	KiB = int64(1) << 10
	MiB = int64(1) << 20
	GiB = int64(1) << 30
	TiB = int64(1) << 40
)

// cycleState is a minimal fwk.CycleState: only Read and Write are used by the plugin.
type cycleState struct {
	fwk.CycleState
	data map[fwk.StateKey]fwk.StateData
}

func newCycleState() *cycleState { return &cycleState{data: map[fwk.StateKey]fwk.StateData{}} }

func (c *cycleState) Read(k fwk.StateKey) (fwk.StateData, error) {
	if d, ok := c.data[k]; ok {
		return d, nil
	}
	return nil, fwk.ErrNotFound
}

func (c *cycleState) Write(k fwk.StateKey, d fwk.StateData) { c.data[k] = d }

// nodeInfo is a minimal fwk.NodeInfo: the plugin only calls Node() and GetPods().
type nodeInfo struct {
	fwk.NodeInfo
	node *corev1.Node
	pods *[]fwk.PodInfo
}

func (n nodeInfo) Node() *corev1.Node { return n.node }

func (n nodeInfo) GetPods() []fwk.PodInfo {
	if n.pods == nil {
		return nil
	}
	return *n.pods
}

// podInfo is a minimal fwk.PodInfo: the plugin only calls GetPod().
type podInfo struct {
	fwk.PodInfo
	pod *corev1.Pod
}

func (p podInfo) GetPod() *corev1.Pod { return p.pod }

// assume puts pod on node n as the scheduler's cache does for a pod in flight or bound.
func (n nodeInfo) assume(pod *corev1.Pod) { *n.pods = append(*n.pods, podInfo{pod: pod}) }

func mkNode(name string, labels map[string]string) nodeInfo {
	return nodeInfo{node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, pods: &[]fwk.PodInfo{}}
}

// fixture builds a Plugin over in-memory listers (what the informers would hold).
type fixture struct {
	t       *testing.T
	p       *Plugin
	pvcs    cache.Indexer
	pvs     cache.Indexer
	classes cache.Indexer
	pods    cache.Indexer
	nodes   map[string]bool
}

func newFixture(t testing.TB) *fixture {
	f := &fixture{
		pvcs:    cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		pvs:     cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		classes: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		pods:    cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		nodes:   map[string]bool{},
	}
	f.p = &Plugin{
		args:      DefaultArgs(),
		cache:     newView(300e9),
		pvcs:      corelisters.NewPersistentVolumeClaimLister(f.pvcs),
		pvs:       corelisters.NewPersistentVolumeLister(f.pvs),
		classes:   storagelisters.NewStorageClassLister(f.classes),
		pods:      corelisters.NewPodLister(f.pods),
		nodeLabel: storev1.NameLabelValue,
		nodeGone:  func(n string) bool { return len(f.nodes) > 0 && !f.nodes[n] },
	}
	f.p.cache.setProtocol("local", protoLocal)
	f.p.cache.setProtocol("nvme", protoNVMeoF)
	f.p.cache.setStrategy("fast-binpack", policyv1.StrategyBinpack, false)
	f.p.cache.setStrategy("fast-spread", policyv1.StrategySpreadout, false)
	f.class("binpack", "fast-binpack", "pool-a", "local")
	f.class("spread", "fast-spread", "pool-a", "local")
	f.class("remote", "fast-binpack", "pool-r", "nvme")
	return f
}

func (f *fixture) class(name, placement, pool, proto string) {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	_ = f.classes.Add(&storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name},
		Provisioner:       policyv1.DriverName,
		VolumeBindingMode: &wffc,
		Parameters:        map[string]string{policyv1.ParamPlacement: placement, policyv1.ParamPool: pool, policyv1.ParamProtocol: proto},
	})
}

// store records a Store of pool on node with the given capacity (nil: never reported).
func (f *fixture) store(pool, node string, c *storev1.Capacity) {
	f.p.cache.upsertStore(&storev1.Store{
		ObjectMeta: metav1.ObjectMeta{Name: storev1.StoreName(pool, node), Labels: map[string]string{
			policyv1.LabelPool: storev1.NameLabelValue(pool), policyv1.LabelNode: storev1.NameLabelValue(node)}},
		Spec:   storev1.StoreSpec{Pool: pool, NodeName: node},
		Status: storev1.StoreStatus{Capacity: c},
	})
}

// avail is a consistent capacity with the given available bytes.
func avail(b int64) *storev1.Capacity {
	return &storev1.Capacity{Total: 2 * TiB, Allocatable: 2 * TiB, Provisioned: 2*TiB - b, Available: b}
}

// pod creates a pod with one unbound claim per size, all of class sc.
func (f *fixture) pod(name, sc string, sizes ...int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
	for i, sz := range sizes {
		cn := fmt.Sprintf("%s-c%d", name, i)
		scName := sc
		_ = f.pvcs.Add(&corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: cn, Namespace: "default"},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &scName,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(sz, resource.BinarySI)}}},
		})
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: fmt.Sprintf("v%d", i),
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cn}}})
	}
	return p
}

// cycle runs PreFilter, Filter on every node, PreScore, Score and NormalizeScore as the
// framework does; it returns the per-node filter statuses and the normalized scores of the
// nodes that passed (nil when scoring was skipped).
type result struct {
	state   fwk.CycleState
	pre     *fwk.Status
	filter  map[string]*fwk.Status
	scores  map[string]int64
	skipped bool
}

func (f *fixture) cycle(pod *corev1.Pod, nodes ...nodeInfo) result {
	ctx := context.Background()
	r := result{state: newCycleState(), filter: map[string]*fwk.Status{}}
	all := make([]fwk.NodeInfo, len(nodes))
	for i, n := range nodes {
		all[i] = n
	}
	_, r.pre = f.p.PreFilter(ctx, r.state, pod, all)
	if !r.pre.IsSuccess() {
		return r
	}
	var passed []nodeInfo
	for _, n := range nodes {
		s := f.p.Filter(ctx, r.state, pod, n)
		r.filter[n.node.Name] = s
		if s.IsSuccess() {
			passed = append(passed, n)
		}
	}
	if s := f.p.PreScore(ctx, r.state, pod, nil); s.IsSkip() {
		r.skipped = true
		return r
	}
	var list fwk.NodeScoreList
	for _, n := range passed {
		sc, s := f.p.Score(ctx, r.state, pod, n)
		if !s.IsSuccess() {
			panic(s.AsError())
		}
		list = append(list, fwk.NodeScore{Name: n.node.Name, Score: sc})
	}
	if s := f.p.NormalizeScore(ctx, r.state, pod, list); !s.IsSuccess() {
		panic(s.AsError())
	}
	r.scores = map[string]int64{}
	for _, s := range list {
		if s.Score < fwk.MinNodeScore || s.Score > fwk.MaxNodeScore {
			panic(fmt.Sprintf("score %d out of range", s.Score))
		}
		r.scores[s.Name] = s.Score
	}
	return r
}
