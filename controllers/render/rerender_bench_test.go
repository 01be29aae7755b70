package render_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/plan"
	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

// liveFleet is the benchmark fleet (render.Fleet: 10,000 policy documents over 1,000 nodes) as
// the policy controller reads it: typed objects with a UID and a resourceVersion.
var liveFleet = sync.OnceValues(func() (*vet.Policies, []corev1.Node) {
	data, nodes := render.Fleet(10000, 1000)
	v, err := vet.NewVetter()
	if err != nil {
		panic(err)
	}
	pol, problems := v.Vet(vet.LoadBytes("fleet.yaml", data))
	if len(problems) > 0 {
		panic(problems[0].String())
	}
	for i := range pol.Pools {
		pol.Pools[i].UID, pol.Pools[i].ResourceVersion = types.UID("pool-"+strconv.Itoa(i)), "1"
	}
	for i := range pol.Protocols {
		pol.Protocols[i].UID, pol.Protocols[i].ResourceVersion = types.UID("proto-"+strconv.Itoa(i)), "1"
	}
	for i := range pol.Placements {
		pol.Placements[i].UID, pol.Placements[i].ResourceVersion = types.UID("place-"+strconv.Itoa(i)), "1"
	}
	return pol, nodes
})

func cpuNow(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// BenchmarkRerenderOneOf10kPolicies1kNodes measures the policy controller's vet + render after
// one policy object changed among 10,000 over 1,000 nodes, with the verdicts and renders of
// the unchanged ones kept (policy.KeptVetter, render.Renderer). Each op edits one object at
// random — a StoragePool's reserve, a Placement's allowVolumeExpansion, a Protocol's
// maxQueueSize (NVMe-oF) or labels (local) — with a new resourceVersion, then vets and renders
// the whole set. Reports p50-ms, p99-ms and mean-ms of the vet + render of each op (wall clock),
// cpu-p50-ms, cpu-p99-ms and cpu-mean-ms (the process's CPU time over the same span, garbage
// collection included: on a shared machine the wall clock also waits for other processes' turns
// on the core) — run with -benchtime 300x: at least 200 samples, or no percentiles are
// reported — and cpu-ms/op (CPU per op, the edit included); measured once in the same run:
// cold-ms and cold-cpu-ms (the same vet + render with nothing kept, as the controller did
// before: the peer), kept-vet-heap-mib and kept-render-heap-mib (heap the kept verdicts and
// the Renderer hold), and what a reconcile does
// beyond render over the 37,673 rendered objects: convert-ms (Output.Unstructured),
// digest-ms (inventory.EntryOf of each) and copy-ms (deep copies of the policy objects and
// Nodes, as the informer cache's List and the reconciler's status tracking make).
func BenchmarkRerenderOneOf10kPolicies1kNodes(b *testing.B) {
	pol, nodes := liveFleet()
	pools := slices.Clone(pol.Pools)
	protos := slices.Clone(pol.Protocols)
	places := slices.Clone(pol.Placements)
	v, err := vet.NewVetter()
	if err != nil {
		b.Fatal(err)
	}
	render1 := func(p *vet.Policies, problems []vet.Problem, r func(render.Input) (*render.Output, error)) *render.Output {
		if len(problems) > 0 {
			b.Fatalf("fleet has problems: %v", problems[0])
		}
		out, err := r(render.Input{Pools: p.Pools, Protocols: p.Protocols, Placements: p.Placements, Nodes: nodes})
		if err != nil {
			b.Fatal(err)
		}
		if len(out.StorageClasses) != 3333 || len(out.Stores) != 33340 || len(out.Agents) != 1000 {
			b.Fatalf("rendered %d classes, %d stores, %d agents", len(out.StorageClasses), len(out.Stores), len(out.Agents))
		}
		return out
	}

	// The peer: vet + render with nothing kept.
	heap0 := heapMiB()
	t0, c0 := time.Now(), cpuNow(b)
	p, problems := policy.VetObjects(v, pools, protos, places)
	cold := render1(p, problems, render.Render)
	coldWall, coldCPU := time.Since(t0), cpuNow(b)-c0

	// What a reconcile does beyond render, over every rendered object.
	t0 = time.Now()
	us, err := cold.Unstructured()
	if err != nil {
		b.Fatal(err)
	}
	convert := time.Since(t0)
	t0 = time.Now()
	for _, u := range us {
		if _, err := inventory.EntryOf(u); err != nil {
			b.Fatal(err)
		}
	}
	digest := time.Since(t0)
	t0 = time.Now()
	for range 2 { // the cache's List, then the reconciler's copy before any change
		for i := range pools {
			_ = pools[i].DeepCopy()
		}
		for i := range protos {
			_ = protos[i].DeepCopy()
		}
		for i := range places {
			_ = places[i].DeepCopy()
		}
	}
	for i := range nodes {
		_ = nodes[i].DeepCopy()
	}
	copying := time.Since(t0)
	p, cold, us = nil, nil, nil

	// Prime the kept state: the first reconcile.
	kv := policy.NewKeptVetter(v)
	var r render.Renderer
	p, problems = kv.VetObjects(pools, protos, places)
	keptVet := heapMiB() - heap0
	render1(p, problems, r.Render)
	p = nil
	keptRender := heapMiB() - heap0 - keptVet

	rng := rand.New(rand.NewPCG(uint64(b.N), 21))
	rv := 1
	samples := make([]time.Duration, 0, b.N)
	cpuSamples := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuNow(b)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		rv++
		switch j := rng.IntN(len(pools) + len(protos) + len(places)); {
		case j < len(pools):
			o := pools[j].DeepCopy()
			o.Spec.Reserve = fmt.Sprintf("%d%%", 1+rv%50)
			o.ResourceVersion = strconv.Itoa(rv)
			pools[j] = *o
		case j < len(pools)+len(protos):
			o := protos[j-len(pools)].DeepCopy()
			if o.Spec.NVMeoFTCP != nil {
				o.Spec.NVMeoFTCP.MaxQueueSize = int32(32 + rv%64)
			} else {
				o.Labels = map[string]string{"edit": strconv.Itoa(rv)}
			}
			o.ResourceVersion = strconv.Itoa(rv)
			protos[j-len(pools)] = *o
		default:
			o := places[j-len(pools)-len(protos)].DeepCopy()
			o.Spec.StorageClass.AllowVolumeExpansion = !o.Spec.StorageClass.AllowVolumeExpansion
			o.ResourceVersion = strconv.Itoa(rv)
			places[j-len(pools)-len(protos)] = *o
		}
		b.StartTimer()
		t, c := time.Now(), cpuNow(b)
		p, problems := kv.VetObjects(pools, protos, places)
		render1(p, problems, r.Render)
		samples = append(samples, time.Since(t))
		cpuSamples = append(cpuSamples, cpuNow(b)-c)
	}
	b.StopTimer()
	cpu := cpuNow(b) - cpu0
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	if len(samples) >= 200 {
		for _, m := range []struct {
			unit    string
			samples []time.Duration
		}{{"", samples}, {"cpu-", cpuSamples}} {
			slices.Sort(m.samples)
			q := func(f float64) time.Duration {
				return m.samples[min(max(int(f*float64(len(m.samples))+0.5)-1, 0), len(m.samples)-1)]
			}
			var sum time.Duration
			for _, s := range m.samples {
				sum += s
			}
			b.ReportMetric(ms(q(0.5)), m.unit+"p50-ms")
			b.ReportMetric(ms(q(0.99)), m.unit+"p99-ms")
			b.ReportMetric(ms(sum/time.Duration(len(m.samples))), m.unit+"mean-ms")
		}
	}
	b.ReportMetric(ms(coldWall), "cold-ms")
	b.ReportMetric(ms(coldCPU), "cold-cpu-ms")
	b.ReportMetric(cpu.Seconds()*1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(keptVet, "kept-vet-heap-mib")
	b.ReportMetric(keptRender, "kept-render-heap-mib")
	b.ReportMetric(ms(convert), "convert-ms")
	b.ReportMetric(ms(digest), "digest-ms")
	b.ReportMetric(ms(copying), "copy-ms")
}

// liveCache stands in for the controller's informer cache (plan.Cluster.Cache): typed objects
// by "Kind/name", handed out as controller-runtime's cache reader does — a deep copy, or with
// client.UnsafeDisableDeepCopy a shallow one; copyAlways copies even then (the reads before
// plan.Cluster asked for no copy). Only Get and Scheme are called.
type liveCache struct {
	client.Client
	scheme     *kruntime.Scheme
	objs       map[string]client.Object
	copyAlways bool
}

func (c *liveCache) Scheme() *kruntime.Scheme { return c.scheme }

func (c *liveCache) Get(_ context.Context, key client.ObjectKey, out client.Object, opts ...client.GetOption) error {
	kind := reflect.TypeOf(out).Elem().Name()
	obj, ok := c.objs[kind+"/"+key.Name]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Resource: kind}, key.Name)
	}
	var o client.GetOptions
	o.ApplyOptions(opts)
	if c.copyAlways || o.UnsafeDisableDeepCopy == nil || !*o.UnsafeDisableDeepCopy {
		obj = obj.DeepCopyObject().(client.Object)
	}
	reflect.ValueOf(out).Elem().Set(reflect.ValueOf(obj).Elem())
	return nil
}

// put records obj as the live object, as the watch would after an apply: a new UID the first
// time, a new resourceVersion each time.
func (c *liveCache) put(obj client.Object, rv int) {
	obj.SetUID(types.UID("uid-" + obj.GetName()))
	obj.SetResourceVersion(strconv.Itoa(rv))
	c.objs[reflect.TypeOf(obj).Elem().Name()+"/"+obj.GetName()] = obj
}

// apiReader stands in for the API server's reads (plan.Cluster.Reader): the live object
// converted to unstructured form, as the client decodes a GET.
type apiReader struct{ c *liveCache }

func (r apiReader) Get(ctx context.Context, key client.ObjectKey, out client.Object, _ ...client.GetOption) error {
	u := out.(*unstructured.Unstructured)
	typed, err := r.c.scheme.New(u.GroupVersionKind())
	if err != nil {
		return err
	}
	obj := typed.(client.Object)
	if err := r.c.Get(ctx, key, obj); err != nil {
		return err
	}
	m, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	gvk := u.GroupVersionKind()
	u.Object = m
	u.SetGroupVersionKind(gvk)
	return nil
}

func (apiReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("apiReader: no List")
}

// dryRunCluster is plan.Cluster with the dry-run answered as the API server would for a
// rendered object whose live copy differs: the apply changes it. Usage is none.
type dryRunCluster struct{ *plan.Cluster }

func (dryRunCluster) DryRun(_ context.Context, objs []*unstructured.Unstructured) ([]plan.DryRun, error) {
	out := make([]plan.DryRun, len(objs))
	for i := range out {
		out[i] = plan.DryRun{Action: ssa.ConfiguredAction}
	}
	return out, nil
}

type noUsage struct{}

func (noUsage) ClassUsage(context.Context, string) (plan.Usage, error) {
	return plan.Usage{Known: true}, nil
}
func (noUsage) AttributesClassUsage(context.Context, string) (plan.Usage, error) {
	return plan.Usage{Known: true}, nil
}
func (noUsage) StoreUsage(context.Context, string) (plan.Usage, error) {
	return plan.Usage{Known: true}, nil
}

// BenchmarkReconcileAfterOneChange measures what the policy controller does after render when
// one policy object changed among 10,000 over 1,000 nodes (37,673 rendered objects): convert
// the render to unstructured form (Renderer.Unstructured), plan it (plan.Make: digests, the
// StorageClass immutable-field check, the informer-cache comparison of every object, the
// stale-object pass) and the inventory the reconciler then records (the next inventory, its
// comparison with the previous one, its sorted entries for the metrics), against a stand-in
// for the informer cache and the API server that holds every rendered object as last applied
// (liveCache; the GETs of the API server are conversions from it, the dry-run answers
// "changed"). Each op edits one policy object at random as BenchmarkRerenderOneOf10kPolicies1kNodes
// does and vets and renders it with the kept state, untimed for the post-render figures; the
// objects the plan applies are then put into the stand-in with a new resourceVersion, as the
// watch would, untimed. Reports post-p50-ms / post-p99-ms / post-mean-ms (wall) and
// post-cpu-p50-ms / post-cpu-p99-ms (process CPU) of the post-render step with everything
// kept, applied/op (objects the plan applies, per op: the edit's own), and measured in the
// same run, coldpost-ms and coldpost-cpu-ms: the median of 5 ops of the same step with nothing
// kept (Output.Unstructured, plan.Make without Kept, cache reads with a deep copy: the code
// before) — the peer. Run with -benchtime 300x (at least 200 samples, or no percentiles).
func BenchmarkReconcileAfterOneChange(b *testing.B) {
	pol, nodes := liveFleet()
	pools := slices.Clone(pol.Pools)
	protos := slices.Clone(pol.Protocols)
	places := slices.Clone(pol.Placements)
	v, err := vet.NewVetter()
	if err != nil {
		b.Fatal(err)
	}
	scheme := kruntime.NewScheme()
	if err := errors.Join(storev1.AddToScheme(scheme), storagev1.AddToScheme(scheme)); err != nil {
		b.Fatal(err)
	}
	live := &liveCache{scheme: scheme, objs: map[string]client.Object{}}
	kv := policy.NewKeptVetter(v)
	var r render.Renderer
	rv := 1
	vetRender := func() *render.Output {
		p, problems := kv.VetObjects(pools, protos, places)
		if len(problems) > 0 {
			b.Fatalf("fleet has problems: %v", problems[0])
		}
		out, err := r.Render(render.Input{Pools: p.Pools, Protocols: p.Protocols, Placements: p.Placements, Nodes: nodes})
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	input := func(p *vet.Policies, desired []*unstructured.Unstructured, out *render.Output, prev *inventory.Inventory, kept *plan.Kept) plan.Input {
		in := plan.Input{Desired: desired, Sources: out.Sources, Previous: prev, Kept: kept,
			Placements: map[string]*policyv1.Placement{}, Pools: map[string]*policyv1.StoragePool{}}
		for i := range p.Placements {
			in.Placements[p.Placements[i].Name] = &p.Placements[i]
		}
		for i := range p.Pools {
			in.Pools[p.Pools[i].Name] = &p.Pools[i]
		}
		return in
	}
	ctx := context.Background()
	var kept plan.Kept
	// post is the step measured: conversion, plan, the inventory recorded. It returns the plan
	// and the next inventory.
	post := func(out *render.Output, prev *inventory.Inventory, cold bool) (*plan.Plan, *inventory.Inventory) {
		p, _ := kv.VetObjects(pools, protos, places) // kept: no work, the verdicts of this op
		var desired []*unstructured.Unstructured
		var err error
		k := &kept
		live.copyAlways = cold
		if cold {
			desired, err = out.Unstructured()
			k = nil
		} else {
			desired, err = r.Unstructured(out)
		}
		if err != nil {
			b.Fatal(err)
		}
		src := dryRunCluster{&plan.Cluster{Counter: noUsage{}, Reader: apiReader{live}, Cache: live, Kept: k}}
		pl, err := plan.Make(ctx, input(p, desired, out, prev, k), src)
		if err != nil {
			b.Fatal(err)
		}
		next := inventory.WithCapacity(len(pl.Objects))
		for i := range pl.Objects {
			next.Put(pl.Objects[i].Entry)
		}
		_ = prev.Equal(next)
		_ = next.KindCounts() // the applied-objects metric
		return pl, next
	}
	// applied puts what the plan applies into the live stand-in, as the watch would.
	applied := func(pl *plan.Plan, out *render.Output) int {
		n := 0
		typed := map[string]client.Object{}
		for i := range out.StorageClasses {
			typed["StorageClass/"+out.StorageClasses[i].Name] = &out.StorageClasses[i]
		}
		for i := range out.Agents {
			typed["Agent/"+out.Agents[i].Name] = &out.Agents[i]
		}
		for i := range out.Stores {
			typed["Store/"+out.Stores[i].Name] = &out.Stores[i]
		}
		for i := range pl.Objects {
			if o := &pl.Objects[i]; o.Apply() {
				rv++
				live.put(typed[o.Key()].DeepCopyObject().(client.Object), rv)
				n++
			}
		}
		return n
	}
	edit := func(rng *rand.Rand) {
		rv++
		switch j := rng.IntN(len(pools) + len(protos) + len(places)); {
		case j < len(pools):
			o := pools[j].DeepCopy()
			o.Spec.Reserve = fmt.Sprintf("%d%%", 1+rv%50)
			o.ResourceVersion = strconv.Itoa(rv)
			pools[j] = *o
		case j < len(pools)+len(protos):
			o := protos[j-len(pools)].DeepCopy()
			if o.Spec.NVMeoFTCP != nil {
				o.Spec.NVMeoFTCP.MaxQueueSize = int32(32 + rv%64)
			} else {
				o.Labels = map[string]string{"edit": strconv.Itoa(rv)}
			}
			o.ResourceVersion = strconv.Itoa(rv)
			protos[j-len(pools)] = *o
		default:
			o := places[j-len(pools)-len(protos)].DeepCopy()
			o.Spec.StorageClass.AllowVolumeExpansion = !o.Spec.StorageClass.AllowVolumeExpansion
			o.ResourceVersion = strconv.Itoa(rv)
			places[j-len(pools)-len(protos)] = *o
		}
	}

	// The first reconcile: everything is created; then the cluster holds every object.
	out := vetRender()
	pl, prev := post(out, inventory.New(), false)
	if n := applied(pl, out); n != 37673 {
		b.Fatalf("first plan applies %d objects, want 37673", n)
	}
	pl, prev = post(out, prev, false) // kept state primed against the live objects
	if n := applied(pl, out); n != 0 {
		b.Fatalf("a no-op plan applies %d objects", n)
	}

	rng := rand.New(rand.NewPCG(uint64(b.N), 22))
	// The peer: the same step with nothing kept, 5 ops.
	var coldWall, coldCPU []time.Duration
	for range 5 {
		edit(rng)
		out = vetRender()
		t, c := time.Now(), cpuNow(b)
		pl, prev = post(out, prev, true)
		coldWall, coldCPU = append(coldWall, time.Since(t)), append(coldCPU, cpuNow(b)-c)
		applied(pl, out)
	}
	pl, prev = post(out, prev, false) // the kept state catches up with the peer's ops

	samples := make([]time.Duration, 0, b.N)
	cpuSamples := make([]time.Duration, 0, b.N)
	appliedN := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		edit(rng)
		out = vetRender()
		b.StartTimer()
		t, c := time.Now(), cpuNow(b)
		pl, prev = post(out, prev, false)
		samples = append(samples, time.Since(t))
		cpuSamples = append(cpuSamples, cpuNow(b)-c)
		b.StopTimer()
		appliedN += applied(pl, out)
		b.StartTimer()
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	quantile := func(s []time.Duration, f float64) time.Duration {
		slices.Sort(s)
		return s[min(max(int(f*float64(len(s))+0.5)-1, 0), len(s)-1)]
	}
	if len(samples) >= 200 {
		var sum time.Duration
		for _, s := range samples {
			sum += s
		}
		b.ReportMetric(ms(quantile(samples, 0.5)), "post-p50-ms")
		b.ReportMetric(ms(quantile(samples, 0.99)), "post-p99-ms")
		b.ReportMetric(ms(sum/time.Duration(len(samples))), "post-mean-ms")
		b.ReportMetric(ms(quantile(cpuSamples, 0.5)), "post-cpu-p50-ms")
		b.ReportMetric(ms(quantile(cpuSamples, 0.99)), "post-cpu-p99-ms")
	}
	b.ReportMetric(float64(appliedN)/float64(b.N), "applied/op")
	b.ReportMetric(ms(quantile(coldWall, 0.5)), "coldpost-ms")
	b.ReportMetric(ms(quantile(coldCPU, 0.5)), "coldpost-cpu-ms")
}
