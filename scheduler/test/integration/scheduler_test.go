// Package integration runs plinth-scheduler's PlinthCapacity plugin inside the real
// kube-scheduler (in-process: app.Setup + app.Run) against the real kube-apiserver and etcd
// built by `make testbin`, with Plinth's CRDs installed from schema/crd/bases.
//
// No kubelet runs here: Node objects are created by the test, standing in for kubelet.
// No CSI provisioner runs either: the scheduler's decision is read from the PVC annotation
// volume.kubernetes.io/selected-node, which VolumeBinding's PreBind writes after Reserve
// (the pod itself stays in PreBind, waiting for a provisioner).
package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/configz"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/scheduler/plugin/capacity"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

const (
	GiB          = int64(1) << 30
	annSelected  = "volume.kubernetes.io/selected-node"
	ns           = "default"
	pluginWeight = 50
	zone         = "topology.kubernetes.io/zone"
)

var (
	crdGVR       = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	storesGVR    = storev1.GroupVersion.WithResource("stores")
	protocolsGVR = policyv1.GroupVersion.WithResource("protocols")
	placementGVR = policyv1.GroupVersion.WithResource("placements")
)

type env struct {
	t   testing.TB
	ctx context.Context
	cs  kubernetes.Interface
	dyn dynamic.Interface
	// apiserverPID is kube-apiserver's process, whose CPU BenchmarkRealScheduler reads.
	apiserverPID int
}

// TestPlinthCapacityWithRealScheduler: one control plane and one scheduler for all cases;
// each case uses its own pool and nodes so they do not interfere.
func TestPlinthCapacityWithRealScheduler(t *testing.T) {
	// The real StatefulSet controller creates the pods and claims of the spreadAcross case;
	// no other controller runs (nothing provisions or binds volumes).
	cp := controlplane.ForTest(t, controlplane.Options{ControllerManager: true, Controllers: []string{"statefulset-controller"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := &env{t: t, ctx: ctx}
	var err error
	if e.cs, err = kubernetes.NewForConfig(cp.Admin.Config); err != nil {
		t.Fatal(err)
	}
	if e.dyn, err = dynamic.NewForConfig(cp.Admin.Config); err != nil {
		t.Fatal(err)
	}
	e.installCRDs()
	e.protocol("local", map[string]any{"local": map[string]any{}})
	e.protocol("nvme", map[string]any{"nvmeofTcp": map[string]any{"bindCIDR": "10.0.0.0/8"}})

	done := startScheduler(t, ctx, cp.Admin.Kubeconfig)
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Log("scheduler did not stop within 30s")
		}
	}()

	t.Run("binpack picks the fullest node that fits", func(t *testing.T) {
		e := e.with(t)
		e.pool("bp", "Binpack", map[string]int64{"bp-a": 10 * GiB, "bp-b": 3 * GiB, "bp-c": 20 * GiB, "bp-d": GiB / 2})
		if got := e.schedule("bp-1", "bp", GiB); got != "bp-b" {
			t.Fatalf("binpack chose %q, want bp-b", got)
		}
	})
	t.Run("spreadout picks the emptiest node", func(t *testing.T) {
		e := e.with(t)
		e.pool("sp", "Spreadout", map[string]int64{"sp-a": 10 * GiB, "sp-b": 3 * GiB, "sp-c": 20 * GiB})
		if got := e.schedule("sp-1", "sp", GiB); got != "sp-c" {
			t.Fatalf("spreadout chose %q, want sp-c", got)
		}
		// sp-c has 19 GiB left (booked), still the emptiest; the next 10 GiB pod leaves
		// it at 9 while sp-a would keep 0: still sp-c. Then sp-a (10) beats sp-c (9).
		if got := e.schedule("sp-2", "sp", 10*GiB); got != "sp-c" {
			t.Fatalf("second spreadout pod chose %q, want sp-c", got)
		}
		if got := e.schedule("sp-3", "sp", GiB); got != "sp-a" {
			t.Fatalf("third spreadout pod chose %q, want sp-a (bookings of in-flight pods counted)", got)
		}
	})
	t.Run("exact boundary", func(t *testing.T) {
		e := e.with(t)
		e.pool("bd", "Binpack", map[string]int64{"bd-a": 117 * GiB})
		e.createClaimPod("bd-over", "bd", 117*GiB+1)
		if got := e.schedule("bd-exact", "bd", 117*GiB); got != "bd-a" {
			t.Fatalf("exact fit chose %q", got)
		}
		e.expectUnschedulable("bd-over", capacity.FilterReasonInsufficient)
	})
	t.Run("nodes without capacity and vanished nodes are never chosen", func(t *testing.T) {
		e := e.with(t)
		e.pool("nc", "Spreadout", map[string]int64{"nc-ok": 2 * GiB})
		e.node("nc-nostore", nil)
		e.node("nc-nocap", nil)
		e.store("nc", "nc-nocap", nil)
		e.store("nc", "nc-gone", &storev1.Capacity{Total: 1 << 50, Allocatable: 1 << 50, Available: 1 << 50}) // no Node
		for i := range 3 {
			e.createClaimPod(fmt.Sprintf("nc-%d", i), "nc", GiB)
		}
		placed := e.waitPlaced([]string{"nc-0", "nc-1", "nc-2"}, 2)
		for p, n := range placed {
			if n != "nc-ok" {
				t.Errorf("%s placed on %s", p, n)
			}
		}
	})
	t.Run("twenty pods at once never overcommit", func(t *testing.T) {
		e := e.with(t)
		// 3 nodes × 5 GiB, 20 pods × 1 GiB: exactly 15 fit, at most 5 per node.
		e.pool("race", "Spreadout", map[string]int64{"race-a": 5 * GiB, "race-b": 5 * GiB, "race-c": 5 * GiB})
		var names []string
		for i := range 20 {
			names = append(names, fmt.Sprintf("race-%02d", i))
		}
		for _, n := range names {
			e.createClaim(n, "race", GiB)
		}
		start := time.Now()
		var wg sync.WaitGroup
		for _, n := range names {
			wg.Go(func() { e.createPod(n) })
		}
		wg.Wait()
		placed := e.waitPlaced(names, 15)
		elapsed := time.Since(start)
		per := map[string]int{}
		for _, n := range placed {
			per[n]++
		}
		for n, c := range per {
			if c > 5 {
				t.Errorf("node %s got %d pods of 1 GiB with 5 GiB free", n, c)
			}
		}
		t.Logf("15 of 20 pods placed in %v (%.1f pods/s): %v", elapsed.Round(time.Millisecond), 15/elapsed.Seconds(), per)
		// The 5 left over must stay Pending with our reason.
		for _, n := range names {
			if _, ok := placed[n]; !ok {
				e.expectUnschedulable(n, capacity.FilterReasonInsufficient)
			}
		}
	})
	t.Run("spreadAcross puts one volume of a StatefulSet per zone", func(t *testing.T) {
		e := e.with(t)
		// 3 zones × 2 nodes, Spreadout, and zone a the emptiest: without spreading every
		// replica would go to zone a. Zone c has room for one 1 GiB volume only (c1), and two
		// unlabelled nodes with the most room of all must never be chosen.
		e.placementSpec("zn", map[string]any{"strategy": "Spreadout", "spreadAcross": zone})
		e.class("zn", "zn", "zn", "local", policyv1.ParamSpreadAcross, zone)
		free := map[string]int64{"zn-a1": 90 * GiB, "zn-a2": 80 * GiB, "zn-b1": 40 * GiB, "zn-b2": 30 * GiB,
			"zn-c1": 3 * GiB / 2, "zn-c2": GiB / 2, "zn-bare1": 500 * GiB, "zn-bare2": 400 * GiB}
		for n, b := range free {
			var labels map[string]string
			if !strings.Contains(n, "bare") {
				labels = map[string]string{zone: n[3:4]}
			}
			e.node(n, labels)
			e.store("zn", n, &storev1.Capacity{Total: 1 << 40, Allocatable: 1 << 40, Provisioned: 1<<40 - b, Available: b})
		}
		claims := func(n int) []string {
			var cs []string
			for i := range n {
				cs = append(cs, fmt.Sprintf("data-zn-%d", i))
			}
			return cs
		}
		perZone := func(placed map[string]string) map[string]int {
			c := map[string]int{}
			for _, n := range placed {
				if strings.Contains(n, "bare") {
					t.Errorf("a volume was placed on unlabelled node %s", n)
					continue
				}
				c[n[3:4]]++
			}
			return c
		}
		e.statefulSet("zn", "zn", 3, GiB)
		placed := e.waitPlaced(claims(3), 3)
		if c := perZone(placed); c["a"] != 1 || c["b"] != 1 || c["c"] != 1 || placed["data-zn-0"] == "" {
			t.Fatalf("3 replicas: volumes per zone %v, want one in each of a, b, c (placed %v)", c, placed)
		}
		if n := placed[keyOfZone(placed, "c")]; n != "zn-c1" {
			t.Errorf("zone c's volume on %s, want zn-c1 (zn-c2 is too small)", n)
		}
		// The 4th may go to any zone; zone c is full, so Spreadout picks the emptiest node
		// of a and b.
		e.scale("zn", 4)
		placed = e.waitPlaced(claims(4), 4)
		if c := perZone(placed); c["a"]+c["b"] != 3 || c["c"] != 1 {
			t.Fatalf("4 replicas: volumes per zone %v, want 3 in a and b together, 1 in c", c)
		}
		e.scale("zn", 6)
		placed = e.waitPlaced(claims(6), 5)
		if c := perZone(placed); c["a"] != 2 || c["b"] != 2 || c["c"] != 1 {
			t.Fatalf("5 of 6 replicas: volumes per zone %v, want a 2, b 2, c 1 (placed %v)", c, placed)
		}
		// The 6th would put a third volume in a or b while c, the least-loaded zone, is full:
		// it stays Pending (DoNotSchedule), saying why.
		var pending string
		for _, cl := range claims(6) {
			if placed[cl] == "" {
				pending = strings.TrimPrefix(cl, "data-")
			}
		}
		e.expectUnschedulable(pending, capacity.FilterReasonSpreadSkew)
		e.expectUnschedulable(pending, capacity.FilterReasonNoSpreadLabel)
		t.Logf("volumes per zone with 6 replicas: %v, %s Pending", perZone(placed), pending)
	})
	t.Run("NVMe-oF needs the initiator label", func(t *testing.T) {
		e := e.with(t)
		e.placement("nv", "Binpack", "nvme")
		e.class("nv", "nv", "nv", "nvme")
		e.node("nv-plain", nil)
		e.node("nv-ini", map[string]string{policyv1.LabelNVMeInitiator: "true"})
		if got := e.schedule("nv-1", "nv", GiB); got != "nv-ini" {
			t.Fatalf("NVMe-oF pod chose %q, want nv-ini", got)
		}
	})
}

func (e *env) with(t testing.TB) *env { c := *e; c.t = t; return &c }

func startScheduler(t testing.TB, ctx context.Context, kubeconfig string) <-chan struct{} {
	// Only the one profile: the default plugins stay enabled (VolumeBinding writes
	// selected-node); PlinthCapacity is added at every point it implements.
	return runScheduler(t, ctx, fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: %q}
leaderElection: {leaderElect: false}
profiles:
- schedulerName: default-scheduler
%s`, kubeconfig, withCapacity), capacity.New)
}

// withCapacity is the part of a profile that adds PlinthCapacity at every extension point
// it implements, the default plugins staying enabled.
var withCapacity = fmt.Sprintf(`  plugins:
    preFilter: {enabled: [{name: %[1]s}]}
    filter: {enabled: [{name: %[1]s}]}
    preScore: {enabled: [{name: %[1]s}]}
    score: {enabled: [{name: %[1]s, weight: %[2]d}]}
    reserve: {enabled: [{name: %[1]s}]}
  pluginConfig:
  - name: %[1]s
    args: {reservationTimeoutSeconds: 600}
`, capacity.Name, pluginWeight)

// runScheduler runs the real kube-scheduler in process (app.Setup, app.Run) with the
// KubeSchedulerConfiguration cfg (YAML) and factory registered as PlinthCapacity, until
// ctx ends; the returned channel closes when it has stopped.
func runScheduler(t testing.TB, ctx context.Context, cfg string, factory frameworkruntime.PluginFactory) <-chan struct{} {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := options.NewOptions()
	opts.ConfigFile = conf
	opts.SecureServing.BindPort = 0
	var err error
	if opts.InformerName, err = cache.NewInformerName("kube-scheduler"); err != nil {
		t.Fatal(err)
	}
	cc, sched, err := app.Setup(ctx, opts, app.WithPlugin(capacity.Name, factory))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := app.Run(ctx, cc, sched); err != nil && ctx.Err() == nil {
			t.Errorf("kube-scheduler stopped: %v", err)
		}
		// what Run registered process-wide, so that the next scheduler may register it
		opts.InformerName.Release()
		configz.Delete("componentconfig")
	}()
	return done
}

func (e *env) installCRDs() {
	root, err := controlplane.ModuleRoot()
	if err != nil {
		e.t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "schema", "crd", "bases", "*.yaml"))
	if len(files) == 0 {
		e.t.Fatal("no CRDs in schema/crd/bases")
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			e.t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &u.Object); err != nil {
			e.t.Fatalf("%s: %v", f, err)
		}
		if _, err := e.dyn.Resource(crdGVR).Create(e.ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			e.t.Fatalf("create CRD %s: %v", u.GetName(), err)
		}
		names = append(names, u.GetName())
	}
	for _, n := range names {
		e.eventually("CRD "+n+" established", func() error {
			u, err := e.dyn.Resource(crdGVR).Get(e.ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("not established")
		})
	}
}

func (e *env) eventually(what string, fn func() error) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *env) create(gvr schema.GroupVersionResource, obj any) *unstructured.Unstructured {
	e.t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		e.t.Fatal(err)
	}
	got, err := e.dyn.Resource(gvr).Create(e.ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create %s: %v", gvr.Resource, err)
	}
	return got
}

func (e *env) protocol(name string, spec map[string]any) {
	e.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": policyv1.GroupVersion.String(), "kind": "Protocol",
		"metadata": map[string]any{"name": name}, "spec": spec}}
	if _, err := e.dyn.Resource(protocolsGVR).Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) placement(name, strategy, protocol string) {
	e.t.Helper()
	e.placementSpec(name, map[string]any{"strategy": strategy, "protocolRef": map[string]any{"name": protocol}})
}

// placementSpec creates Placement name of pool name and class name, local unless spec
// names another protocolRef; spec's fields are added to (or replace) those.
func (e *env) placementSpec(name string, spec map[string]any) {
	e.t.Helper()
	full := map[string]any{
		"poolRef": map[string]any{"name": name}, "protocolRef": map[string]any{"name": "local"},
		"storageClass": map[string]any{"name": name},
	}
	for k, v := range spec {
		full[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": policyv1.GroupVersion.String(), "kind": "Placement",
		"metadata": map[string]any{"name": name}, "spec": full}}
	if _, err := e.dyn.Resource(placementGVR).Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// class creates the StorageClass render would write for a placement; extra are more
// parameters as key, value pairs.
func (e *env) class(name, placement, pool, protocol string, extra ...string) {
	e.t.Helper()
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	params := map[string]string{policyv1.ParamPlacement: placement, policyv1.ParamPool: pool,
		policyv1.ParamProtocol: protocol, policyv1.ParamFSType: "ext4"}
	for i := 0; i+1 < len(extra); i += 2 {
		params[extra[i]] = extra[i+1]
	}
	_, err := e.cs.StorageV1().StorageClasses().Create(e.ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name},
		Provisioner:       policyv1.DriverName,
		VolumeBindingMode: &wffc,
		Parameters:        params,
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

// node creates a Node, standing in for kubelet's registration (no kubelet runs here).
func (e *env) node(name string, labels map[string]string) {
	e.t.Helper()
	rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi"), corev1.ResourcePods: resource.MustParse("110")}
	if labels == nil {
		labels = map[string]string{}
	}
	labels[corev1.LabelHostname] = name
	_, err := e.cs.CoreV1().Nodes().Create(e.ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Capacity: rl, Allocatable: rl,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

// store creates a Store of pool on node and writes its status as the node agent would.
func (e *env) store(pool, node string, c *storev1.Capacity) {
	e.t.Helper()
	got := e.create(storesGVR, &storev1.Store{
		TypeMeta: metav1.TypeMeta{APIVersion: storev1.GroupVersion.String(), Kind: "Store"},
		ObjectMeta: metav1.ObjectMeta{Name: storev1.StoreName(pool, node), Labels: map[string]string{
			policyv1.LabelPool: storev1.NameLabelValue(pool), policyv1.LabelNode: storev1.NameLabelValue(node)}},
		Spec: storev1.StoreSpec{Pool: pool, NodeName: node, Backend: policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth/" + pool}}},
	})
	if c == nil {
		return
	}
	st := map[string]any{"capacity": map[string]any{"total": c.Total, "allocatable": c.Allocatable, "provisioned": c.Provisioned, "available": c.Available}}
	if err := unstructured.SetNestedField(got.Object, st, "status"); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.dyn.Resource(storesGVR).UpdateStatus(e.ctx, got, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// pool creates a local Placement, its StorageClass (named like the pool) and, per node, a
// Node and a Store with that many bytes available.
func (e *env) pool(name, strategy string, free map[string]int64) {
	e.t.Helper()
	e.placement(name, strategy, "local")
	e.class(name, name, name, "local")
	for n, b := range free {
		e.node(n, nil)
		e.store(name, n, &storev1.Capacity{Total: 1 << 40, Allocatable: 1 << 40, Provisioned: 1<<40 - b, Available: b})
	}
}

func (e *env) createClaim(name, class string, bytes int64) {
	e.t.Helper()
	_, err := e.cs.CoreV1().PersistentVolumeClaims(ns).Create(e.ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(bytes, resource.BinarySI)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) createPod(name string) {
	_, err := e.cs.CoreV1().Pods(ns).Create(e.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Error(err)
	}
}

func (e *env) createClaimPod(name, class string, bytes int64) {
	e.t.Helper()
	e.createClaim(name, class, bytes)
	e.createPod(name)
}

// schedule creates a claim and a pod of the same name and returns the node the scheduler
// chose for it (the claim's selected-node annotation).
func (e *env) schedule(name, class string, bytes int64) string {
	e.t.Helper()
	e.createClaimPod(name, class, bytes)
	return e.waitPlaced([]string{name}, 1)[name]
}

// waitPlaced waits until want of the named claims carry selected-node and returns them.
func (e *env) waitPlaced(names []string, want int) map[string]string {
	e.t.Helper()
	placed := map[string]string{}
	e.eventually(fmt.Sprintf("%d of %d claims placed", want, len(names)), func() error {
		for _, n := range names {
			pvc, err := e.cs.CoreV1().PersistentVolumeClaims(ns).Get(e.ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if node := pvc.Annotations[annSelected]; node != "" {
				placed[n] = node
			}
		}
		if len(placed) < want {
			return fmt.Errorf("%d placed: %v", len(placed), placed)
		}
		return nil
	})
	if len(placed) > want {
		e.t.Fatalf("%d claims placed, want %d: %v", len(placed), want, placed)
	}
	return placed
}

// statefulSet creates a StatefulSet with Parallel pod management (no kubelet makes pods
// Ready, so OrderedReady would stop after the first) and one volumeClaimTemplate "data" of
// class; the real StatefulSet controller creates pods <name>-<i> and claims data-<name>-<i>.
func (e *env) statefulSet(name, class string, replicas int32, bytes int64) {
	e.t.Helper()
	labels := map[string]string{"app": name}
	_, err := e.cs.AppsV1().StatefulSets(ns).Create(e.ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            &replicas,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}}},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(bytes, resource.BinarySI)}},
				},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

// scale sets the StatefulSet's replicas.
func (e *env) scale(name string, replicas int32) {
	e.t.Helper()
	sc, err := e.cs.AppsV1().StatefulSets(ns).GetScale(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	sc.Spec.Replicas = replicas
	if _, err := e.cs.AppsV1().StatefulSets(ns).UpdateScale(e.ctx, name, sc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// keyOfZone returns a claim of placed whose node is in zone z (node names zn-<zone><i>).
func keyOfZone(placed map[string]string, z string) string {
	for cl, n := range placed {
		if n[3:4] == z {
			return cl
		}
	}
	return ""
}

// expectUnschedulable waits for the pod's PodScheduled=False condition naming reason.
func (e *env) expectUnschedulable(pod, reason string) {
	e.t.Helper()
	e.eventually("pod "+pod+" unschedulable: "+reason, func() error {
		p, err := e.cs.CoreV1().Pods(ns).Get(e.ctx, pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, reason) {
				return nil
			}
		}
		if p.Spec.NodeName != "" {
			e.t.Fatalf("pod %s bound to %s", pod, p.Spec.NodeName)
		}
		return fmt.Errorf("conditions %+v", p.Status.Conditions)
	})
}
