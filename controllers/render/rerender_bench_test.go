package render_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/controllers/render"
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
