package csi_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// spreadEnv is a pool whose storage nodes carry zone labels, an NVMe-oF Placement that
// spreads across them, and a namespace for the workloads. The Nodes stand in for kubelet's
// registration; the real StatefulSet controller of the shared control plane makes the claims.
type spreadEnv struct {
	*env
	ns     string
	params map[string]string // the StorageClass parameters of the spreading Placement
	zoneOf map[string]string // store name → zone ("" when its Node has no label)
}

// spreadSetup makes the pool's Stores on nodes (node → its labels; 100 GiB available each,
// except those in small), labelled before the driver starts so its Node informer holds the
// labels from the first create, and the Placement <pool>-spread spreading across key.
func spreadSetup(t *testing.T, pool, key string, nodes map[string]map[string]string, small map[string]int64) *spreadEnv {
	t.Helper()
	avail := map[string]int64{}
	for n := range nodes {
		avail[n] = 100 * gib
		if b, ok := small[n]; ok {
			avail[n] = b
		}
	}
	cp := sharedControlPlane(t)
	c := kubeClient(t, cp.Admin.Config)
	e := &spreadEnv{env: setup(t, c, pool, avail), ns: pool}
	ctx := t.Context()
	for node, labels := range nodes {
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			t.Fatal(err)
		}
		maps.Copy(n.Labels, labels)
		if err := c.Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	e.agent = startFakeAgent(t, c)
	e.ctrl = csipb.NewControllerClient(startDriver(t, csi.Options{Mode: csi.ModeController, Config: cp.Admin.Config}))
	e.use(t, pool+"-spread", key, nodes)
	create(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}})
	return e
}

// use makes the NVMe-oF Placement placement of the pool spreading across key and points e at
// it: its StorageClass parameters and the zone of each Store (the Node's value of key, ""
// when it has none).
func (e *spreadEnv) use(t *testing.T, placement, key string, nodes map[string]map[string]string) {
	t.Helper()
	create(t, e.c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: placement}, Spec: policyv1.PlacementSpec{
		PoolRef:      policyv1.LocalObjectReference{Name: e.pool},
		ProtocolRef:  policyv1.LocalObjectReference{Name: e.pool + "-nvme"},
		StorageClass: policyv1.StorageClassTemplate{Name: placement, VolumeBindingMode: "Immediate"},
		Strategy:     policyv1.StrategyBinpack,
		SpreadAcross: key,
	}})
	// What render puts into the StorageClass (controllers/render).
	e.params = map[string]string{policyv1.ParamPlacement: placement, policyv1.ParamPool: e.pool,
		policyv1.ParamProtocol: e.pool + "-nvme", policyv1.ParamSpreadAcross: key}
	e.zoneOf = map[string]string{}
	for node, labels := range nodes {
		e.zoneOf[storev1.StoreName(e.pool, node)] = labels[key]
	}
}

// statefulSet creates a StatefulSet of replicas (podManagementPolicy Parallel: every claim at
// once, as the provisioner then creates them) with the volumeClaimTemplate "data" of class,
// and returns its claims' names once the StatefulSet controller made them all.
func (e *spreadEnv) statefulSet(t *testing.T, name string, replicas int, class string, retention ...appsv1.PersistentVolumeClaimRetentionPolicyType) []string {
	t.Helper()
	labels := map[string]string{"app": name}
	n := int32(replicas)
	set := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            &n,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			ServiceName:         name,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app",
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}}},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &class,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				},
			}},
		},
	}
	if len(retention) > 0 { // the StatefulSet then owns its claims
		set.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{WhenDeleted: retention[0], WhenScaled: appsv1.RetainPersistentVolumeClaimRetentionPolicyType}
	}
	create(t, e.c, set)
	var claims []string
	for i := range replicas {
		claims = append(claims, fmt.Sprintf("data-%s-%d", name, i))
	}
	e.waitClaims(t, claims, len(retention) > 0)
	return claims
}

// waitClaims waits until the claims exist (made by a controller), and, when owned, until
// each carries an owner reference.
func (e *spreadEnv) waitClaims(t *testing.T, claims []string, owned bool) {
	t.Helper()
	ctx := t.Context()
	if err := wait.Poll(ctx, time.Minute, 50*time.Millisecond, func() error {
		for _, c := range claims {
			pvc := &corev1.PersistentVolumeClaim{}
			if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: c}, pvc); err != nil {
				return fmt.Errorf("PVC %s: %w", c, err)
			}
			if owned && len(pvc.OwnerReferences) == 0 {
				return fmt.Errorf("PVC %s has no owner yet", c)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("claims %v: %v", claims, err)
	}
}

// ephemeralPods creates n Pods controlled by one ReplicaSet (made with no replicas: no
// ReplicaSet controller runs here, so the test makes its pods, as that controller would),
// each with a generic ephemeral volume of class; the ephemeral volume controller makes their
// claims (<pod>-data, controlled by the Pod). It returns the claims' names.
func (e *spreadEnv) ephemeralPods(t *testing.T, name string, n int, class string) []string {
	t.Helper()
	labels := map[string]string{"app": name}
	zero := int32(0)
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: appsv1.ReplicaSetSpec{Replicas: &zero,
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app"}}}}}}
	create(t, e.c, rs)
	yes := true
	var claims []string
	for i := range n {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i), Namespace: e.ns, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: &yes}}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
					VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{
						AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
						StorageClassName: &class,
						Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
					}}}}}}}}
		create(t, e.c, pod)
		claims = append(claims, pod.Name+"-data")
	}
	e.waitClaims(t, claims, true)
	return claims
}

// createFor is the CreateVolume csi-provisioner sends for claim (--extra-create-metadata),
// with the consumer node as preferred topology when node is set (WaitForFirstConsumer).
func (e *spreadEnv) createFor(ctx context.Context, claim, node string) (*csipb.CreateVolumeResponse, error) {
	params := maps.Clone(e.params)
	params[csi.ParamPVCName], params[csi.ParamPVCNamespace] = claim, e.ns
	req := &csipb.CreateVolumeRequest{Name: "pvc-" + e.ns + "-" + claim, VolumeCapabilities: mountCap(rwo), Parameters: params,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: gib}}
	if node != "" {
		req.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: topology(node), Preferred: topology(node)}
	}
	return e.ctrl.CreateVolume(ctx, req)
}

// zones returns how many of the volumes ids lie in each zone ("" = a Store on a Node
// without the label).
func (e *spreadEnv) zones(t *testing.T, ids []string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, id := range ids {
		vs := &storev1.VolumeState{}
		if err := e.c.Get(t.Context(), client.ObjectKey{Name: id}, vs); err != nil {
			t.Fatal(err)
		}
		out[e.zoneOf[vs.Spec.StoreName]]++
	}
	return out
}

// createAll runs CreateVolume for every claim at once, as the provisioner's workers do, and
// returns the volume ids.
func (e *spreadEnv) createAll(t *testing.T, claims []string, node string) []string {
	t.Helper()
	ids := make([]string, len(claims))
	errs := make([]error, len(claims))
	var wg sync.WaitGroup
	for i, c := range claims {
		wg.Go(func() {
			resp, err := e.createFor(t.Context(), c, node)
			ids[i], errs[i] = resp.GetVolume().GetVolumeId(), err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("CreateVolume for %s: %v", claims[i], err)
		}
	}
	return ids
}

// The claims of one StatefulSet on an NVMe-oF class with spreadAcross land at most one apart
// across the storage nodes' values of the label, created all at once: three claims over two
// zones 2+1, six over three zones 2+2+2 (that one with the consumer node of
// WaitForFirstConsumer in the request, which an NVMe-oF volume does not follow). A Store on a
// Node without the label takes none, even when binpack would prefer it; two workloads do
// not count each other's volumes.
func TestCreateVolumeSpreadsWorkloadAcrossZones(t *testing.T) {
	pool := fresh("spread")
	const zone, pairKey = "topology.kubernetes.io/zone", "test.plinth.dev/pair"
	nodes := map[string]map[string]string{
		pool + "-a1":   {zone: "a", pairKey: "x"},
		pool + "-a2":   {zone: "a", pairKey: "x"},
		pool + "-b1":   {zone: "b", pairKey: "y"},
		pool + "-c1":   {zone: "c"},
		pool + "-none": {},
	}
	// The unlabelled node is the fullest: binpack would choose it first.
	e := spreadSetup(t, pool, zone, nodes, map[string]int64{pool + "-none": 10 * gib})
	// A second Placement of the same pool spreads across a key with two values.
	pair := &spreadEnv{env: e.env, ns: e.ns}
	pair.use(t, pool+"-pair", pairKey, nodes)

	t0 := time.Now()
	web := pair.statefulSet(t, "web", 3, pool+"-pair")
	db := e.statefulSet(t, "db", 6, pool+"-spread")
	// Claims the StatefulSet owns (retention policy Delete), and the generic ephemeral
	// volumes of one ReplicaSet's pods.
	owned := e.statefulSet(t, "owned", 3, pool+"-spread", appsv1.DeletePersistentVolumeClaimRetentionPolicyType)
	eph := e.ephemeralPods(t, "cache", 3, pool+"-spread")
	t.Logf("TIMING claims made by the controllers %s", time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	var webIDs, dbIDs, ownedIDs, ephIDs []string
	var wg sync.WaitGroup
	wg.Go(func() { webIDs = pair.createAll(t, web, "") })
	wg.Go(func() { dbIDs = e.createAll(t, db, pool+"-none") })
	wg.Go(func() { ownedIDs = e.createAll(t, owned, "") })
	wg.Go(func() { ephIDs = e.createAll(t, eph, pool+"-a1") })
	wg.Wait()
	t.Logf("TIMING 15 CreateVolume calls of 4 workloads at once %s", time.Since(t0).Round(time.Millisecond))
	if t.Failed() {
		return
	}
	if got := pair.zones(t, webIDs); !maps.Equal(got, map[string]int{"x": 2, "y": 1}) {
		t.Errorf("StatefulSet web (3 claims, 2 values of %s): volumes per value %v, want x:2 y:1", pairKey, got)
	}
	if got := e.zones(t, dbIDs); !maps.Equal(got, map[string]int{"a": 2, "b": 2, "c": 2}) {
		t.Errorf("StatefulSet db (6 claims, 3 zones): volumes per zone %v, want a:2 b:2 c:2", got)
	}
	if got := e.zones(t, ownedIDs); !maps.Equal(got, map[string]int{"a": 1, "b": 1, "c": 1}) {
		t.Errorf("StatefulSet owned (3 claims it owns, 3 zones): volumes per zone %v, want one in each", got)
	}
	if got := e.zones(t, ephIDs); !maps.Equal(got, map[string]int{"a": 1, "b": 1, "c": 1}) {
		t.Errorf("ReplicaSet cache (3 pods' ephemeral claims, 3 zones): volumes per zone %v, want one in each", got)
	}
	// The VolumeStates name their workload: the StatefulSet the claims came from.
	set := &appsv1.StatefulSet{}
	if err := e.c.Get(t.Context(), client.ObjectKey{Namespace: e.ns, Name: "db"}, set); err != nil {
		t.Fatal(err)
	}
	var vss storev1.VolumeStateList
	if err := e.c.List(t.Context(), &vss, client.MatchingLabels{policyv1.LabelWorkload: string(set.UID)}); err != nil {
		t.Fatal(err)
	}
	if len(vss.Items) != 6 {
		t.Errorf("%d VolumeStates labelled %s=%s (StatefulSet db), want 6", len(vss.Items), policyv1.LabelWorkload, set.UID)
	}

	// A repeated CreateVolume (the provisioner's retry) answers the same volume, wherever the
	// counts stand now.
	resp, err := pair.createFor(t.Context(), web[0], "")
	if err != nil || resp.GetVolume().GetVolumeId() != webIDs[0] {
		t.Errorf("repeated CreateVolume for %s: %v, %v; want %s", web[0], resp.GetVolume().GetVolumeId(), err, webIDs[0])
	}
}

// A class whose pool has no Store on a Node with the label refuses with RESOURCE_EXHAUSTED
// naming the Placement and the key, and the claim stays unprovisioned (never placed on an
// unlabelled node).
func TestCreateVolumeSpreadNeedsLabelledStore(t *testing.T) {
	pool := fresh("spreadnolabel")
	e := spreadSetup(t, pool, "test.plinth.dev/rack", map[string]map[string]string{pool + "-n1": {}}, nil)
	claims := e.statefulSet(t, "solo", 1, pool+"-spread")
	_, err := e.createFor(t.Context(), claims[0], "")
	wantCode(t, "CreateVolume without a labelled store", err, codes.ResourceExhausted)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, pool+"-spread") || !strings.Contains(msg, "test.plinth.dev/rack") {
		t.Errorf("message %q names neither the Placement nor the key", msg)
	}
}

// Two CreateVolume calls for claims of one workload at the same time: the first holds the
// workload's lock from its count to its VolumeState create. The interleaving is injected, not
// left to timing: when the first has counted and chosen (failpoint csi.create.spread-counted),
// the second is started and must queue behind it (csi.create.spread-queued) instead of
// counting the same VolumeStates and choosing the same zone. Run with -race as well.
func TestCreateVolumeSpreadSerializesWorkload(t *testing.T) {
	pool := fresh("spreadrace")
	const zone = "topology.kubernetes.io/zone"
	e := spreadSetup(t, pool, zone, map[string]map[string]string{pool + "-x": {zone: "x"}, pool + "-y": {zone: "y"}}, nil)
	claims := e.statefulSet(t, "pair", 2, pool+"-spread")

	var mu sync.Mutex
	counted, queued := 0, 0
	secondQueued := make(chan struct{})
	secondCounted := make(chan struct{})
	var second struct {
		id  string
		err error
	}
	secondDone := make(chan struct{})
	defer failpoint.Enable(failpoint.CSICreateSpreadQueued, func() {
		mu.Lock()
		queued++
		mu.Unlock()
		close(secondQueued)
	})()
	defer failpoint.Enable(failpoint.CSICreateSpreadCounted, func() {
		mu.Lock()
		counted++
		c := counted
		mu.Unlock()
		if c != 1 {
			if c == 2 {
				close(secondCounted)
			}
			return
		}
		// The first create holds the lock here: start the second and wait until it either
		// queues (right) or counts too (two creates counted the same VolumeStates).
		go func() {
			defer close(secondDone)
			resp, err := e.createFor(context.Background(), claims[1], "")
			second.id, second.err = resp.GetVolume().GetVolumeId(), err
		}()
		select {
		case <-secondQueued:
		case <-secondCounted:
		case <-time.After(time.Minute):
		}
	})()
	resp, err := e.createFor(t.Context(), claims[0], "")
	if err != nil {
		t.Fatalf("first CreateVolume: %v", err)
	}
	<-secondDone
	if second.err != nil {
		t.Fatalf("second CreateVolume: %v", second.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if queued != 1 || counted != 2 {
		t.Errorf("second create queued %d times, %d counts in all; want it queued once behind the first, 2 counts", queued, counted)
	}
	if got := e.zones(t, []string{resp.GetVolume().GetVolumeId(), second.id}); !maps.Equal(got, map[string]int{"x": 1, "y": 1}) {
		t.Errorf("volumes per zone %v, want x:1 y:1 (raceEnabled=%v)", got, raceEnabled)
	}
}
