package integration

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/component-base/metrics/legacyregistry"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/plinth-storage/plinth/scheduler/plugin/capacity"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// benchQPS is the scheduler's client limit in both configurations. kube-scheduler's default
// (50 QPS, burst 100) caps VolumeBinding's PreBind, one PVC write per pod, at 50 pods/s
// whichever plugins run: both would measure the client's limiter, not the scheduling cycle.
// PlinthCapacity itself makes no API request while scheduling (its caches are informers).
const benchQPS = 1000

// benchExtensionPoints are the extension points the benchmark reports per cycle, from
// scheduler_framework_extension_point_duration_seconds (all plugins of the profile) and, for
// PlinthCapacity alone, scheduler_plugin_execution_duration_seconds. PreBind is not among
// them: VolumeBinding's PreBind writes selected-node and then waits for a PV that no
// provisioner creates here, so it only ends when the round's scheduler stops.
var benchExtensionPoints = []string{"PreFilter", "Filter", "PreScore", "Score", "Reserve"}

// BenchmarkRealScheduler: the real kube-scheduler (in process, as
// TestPlinthCapacityWithRealScheduler runs it) on the real kube-apiserver schedules the same
// PLINTH_BENCH_SCHED_PODS pods (default 1,000; one 1 GiB claim each of a WaitForFirstConsumer
// class of csi.plinth.dev) on the same PLINTH_BENCH_SCHED_NODES Nodes (default 500, each with
// a Store reporting capacity), with the default plugins only (sub-benchmark "default", the
// peer) and with PlinthCapacity added at every extension point it implements ("plinth").
//
// Rounds: one warm-up round ("plinth", discarded: the API server's and this process's first
// requests, caches and heap growth), then PLINTH_BENCH_SCHED_REPEATS (default 3) blocks of
// default, plinth, plinth, default, so that a drift over the run (the machine's load, rounds
// getting faster with their position) weighs on both configurations alike. Each round starts
// a scheduler of its own with every pod already pending and ends with its pods and claims
// deleted and a garbage collection, so every round starts from the same cluster and heap.
//
// Reported per configuration, the median over its rounds of: pods/s ((N−1) over the first →
// last claim carrying volume.kubernetes.io/selected-node, which VolumeBinding's PreBind writes
// after Reserve; no provisioner runs, so pods stay in PreBind), cycle-ms (mean of
// scheduler_scheduling_algorithm_duration_seconds, PreFilter through Score, plus the Reserve
// extension point: the serial part of a scheduling cycle), <ExtensionPoint>-ms (the mean per
// cycle of each of benchExtensionPoints, all plugins), cpu-ms/pod (CPU of this process, i.e.
// the in-process scheduler, over first → last placement, getrusage), apiserver-cpu-ms/pod
// (kube-apiserver's, /proc), allocs/pod and B/pod (this process, same window); for "plinth"
// also plugin-ms and plugin-<ExtensionPoint>-ms (PlinthCapacity's time per cycle: the mean of
// its calls timed in the 10 % of cycles the scheduler samples for its plugin metrics, times
// its calls per cycle, counted; see countedCapacity. Filter and Score run on 16 goroutines, so
// this is time spent in the plugin, not wall time), plugin-%-of-cycle, and the ratios of
// medians pods/s-ratio (plinth/default: the target is ≥ 0.9), cycle-speed-ratio (default
// cycle-ms / plinth cycle-ms, comparable with pods/s-ratio) and cpu-ratio (plinth/default
// cpu-ms/pod). Every round is printed and logged in order with the load average. With PLINTH_BENCH_OUT set, each round's CPU
// profile of this process over first → last placement goes to
// $PLINTH_BENCH_OUT/scheduler-real-<round>-<configuration>.pprof.
//
// It fails when PlinthCapacity did not run each of its extension points (countedPoints) for
// every pod of its rounds, or a round ran fewer cycles than pods. b.N is ignored: run it with -benchtime 1x.
// Without the test binaries it skips, under CI=true it fails.
func BenchmarkRealScheduler(b *testing.B) {
	nodes := controlplane.BenchKnob(b, "PLINTH_BENCH_SCHED_NODES", 500, 2)
	pods := controlplane.BenchKnob(b, "PLINTH_BENCH_SCHED_PODS", 1000, 2)
	repeats := controlplane.BenchKnob(b, "PLINTH_BENCH_SCHED_REPEATS", 3, 1)
	cp := controlplane.ForTest(b, controlplane.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := rest.CopyConfig(cp.Admin.Config)
	cfg.QPS, cfg.Burst = benchQPS, 2*benchQPS // setup only: the scheduler has its own client
	e := &env{t: b, ctx: ctx, apiserverPID: apiserverPID(b, cp)}
	var err error
	if e.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		b.Fatal(err)
	}
	if e.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		b.Fatal(err)
	}
	e.installCRDs()
	e.protocol("local", map[string]any{"local": map[string]any{}})
	e.placement("bench", "Spreadout", "local")
	e.class("bench", "bench", "bench", "local")
	for i := range nodes {
		n := fmt.Sprintf("bench-%04d", i)
		e.node(n, nil)
		free := int64(100+i%400) * GiB // nodes differ, so that Score has something to rank
		e.store("bench", n, &storev1.Capacity{Total: 1 << 40, Allocatable: 1 << 40, Provisioned: 1<<40 - free, Available: free})
	}
	schedule := []string{"plinth"} // the warm-up round, discarded
	for range repeats {
		schedule = append(schedule, "default", "plinth", "plinth", "default")
	}
	results := map[string][]roundResult{}
	var order []string
	for i, config := range schedule {
		r := e.schedulerRound(i, config, cp.Admin.Kubeconfig, pods)
		what := config
		if i == 0 {
			what = "warm-up (" + config + ", discarded)"
		} else {
			results[config] = append(results[config], r)
		}
		line := fmt.Sprintf("round %d %s: %.1f pods/s, cycle %.3f ms, CPU %.2f ms/pod, kube-apiserver CPU %.2f ms/pod, %.0f allocs/pod, load %s\n  %s",
			i, what, r.podsPerSec, r.cycleMS, r.cpuMS, r.apiserverCPUMS, r.allocs, r.load, r.log)
		order = append(order, line)
		// on stdout as well: the testing package truncates a benchmark's long log
		fmt.Println(line)
	}
	med := func(config string, f func(r roundResult) float64) float64 {
		var v []float64
		for _, r := range results[config] {
			v = append(v, f(r))
		}
		return median(v)
	}
	podsPerSec := func(r roundResult) float64 { return r.podsPerSec }
	cycleMS := func(r roundResult) float64 { return r.cycleMS }
	cpuMS := func(r roundResult) float64 { return r.cpuMS }
	for _, config := range []string{"default", "plinth"} {
		b.Run(config, func(b *testing.B) {
			b.ReportMetric(med(config, podsPerSec), "pods/s")
			b.ReportMetric(med(config, cycleMS), "cycle-ms")
			for _, ext := range benchExtensionPoints {
				b.ReportMetric(med(config, func(r roundResult) float64 { return r.extMS[ext] }), ext+"-ms")
			}
			b.ReportMetric(med(config, cpuMS), "cpu-ms/pod")
			b.ReportMetric(med(config, func(r roundResult) float64 { return r.apiserverCPUMS }), "apiserver-cpu-ms/pod")
			b.ReportMetric(med(config, func(r roundResult) float64 { return r.allocs }), "allocs/pod")
			b.ReportMetric(med(config, func(r roundResult) float64 { return r.bytes }), "B/pod")
			if config != "plinth" {
				return
			}
			pl := med(config, func(r roundResult) float64 { return r.pluginMS })
			b.ReportMetric(pl, "plugin-ms")
			b.ReportMetric(100*pl/med(config, cycleMS), "plugin-%-of-cycle")
			for _, ext := range countedPoints {
				b.ReportMetric(med(config, func(r roundResult) float64 { return r.pluginExtMS[ext] }), "plugin-"+ext+"-ms")
			}
			ratio := med("plinth", podsPerSec) / med("default", podsPerSec)
			speed := med("default", cycleMS) / med("plinth", cycleMS)
			cpu := med("plinth", cpuMS) / med("default", cpuMS)
			b.ReportMetric(ratio, "pods/s-ratio")
			b.ReportMetric(speed, "cycle-speed-ratio")
			b.ReportMetric(cpu, "cpu-ratio")
			// logged here: a benchmark with sub-benchmarks prints no log of its own
			b.Logf("%d nodes, %d pods per round, rounds in order:\n%s\nratios of medians over %d rounds each: pods/s %.3f, cycle speed %.3f, CPU per pod %.3f",
				nodes, pods, strings.Join(order, "\n"), len(results[config]), ratio, speed, cpu)
		})
	}
}

// median of v (the mean of the middle two for an even count); 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// apiserverPID finds the control plane's kube-apiserver among its processes (/proc/<pid>/comm).
func apiserverPID(b *testing.B, cp *controlplane.ControlPlane) int {
	for _, pid := range cp.PIDs() {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(comm)) == controlplane.BinKubeAPIServer {
			return pid
		}
	}
	b.Fatalf("no %s among the control plane's processes %v", controlplane.BinKubeAPIServer, cp.PIDs())
	return 0
}

// selfCPU is this process's user+system CPU time (getrusage).
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// roundResult is what one round measured (see BenchmarkRealScheduler); times per cycle in ms.
type roundResult struct {
	podsPerSec, cycleMS, pluginMS, allocs, bytes float64
	cpuMS, apiserverCPUMS                        float64 // per pod
	extMS, pluginExtMS                           map[string]float64
	load                                         string
	log                                          string // where the cycle's time went
}

// benchRounds makes each round's namespace and scheduler name unique when b.N > 1 reruns it.
var benchRounds atomic.Int64

// schedulerRound creates n claims and pods in a namespace of their own, runs a scheduler
// (config "plinth": with PlinthCapacity) until every claim carries selected-node, stops the
// scheduler, deletes the pods and claims and returns what it measured.
func (e *env) schedulerRound(round int, config, kubeconfig string, n int) (res roundResult) {
	b := e.t.(*testing.B)
	name := fmt.Sprintf("bench-%d-%s-%d", round, config, benchRounds.Add(1))
	if _, err := e.cs.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	class := "bench"
	controlplane.Parallel(n, 8, func(i int) {
		c := fmt.Sprintf("c-%04d", i)
		if _, err := e.cs.CoreV1().PersistentVolumeClaims(name).Create(e.ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: c},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(GiB, resource.BinarySI)}},
			},
		}, metav1.CreateOptions{}); err != nil {
			b.Error(err)
			return
		}
		if _, err := e.cs.CoreV1().Pods(name).Create(e.ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: c},
			Spec: corev1.PodSpec{
				SchedulerName: name,
				Containers:    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}}},
			},
		}, metav1.CreateOptions{}); err != nil {
			b.Error(err)
		}
	})
	if b.Failed() {
		b.FailNow()
	}
	w := e.watchPlaced(name, n)
	defer w.stop()

	profile := ""
	factory := capacity.New
	counted := &countedCapacity{}
	if config == "plinth" {
		profile = withCapacity
		factory = counted.factory
	}
	goruntime.GC()
	before := gatherHistograms(b)
	sctx, stop := context.WithCancel(e.ctx)
	defer stop()
	done := runScheduler(b, sctx, fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: %q, qps: %d, burst: %d}
leaderElection: {leaderElect: false}
profiles:
- schedulerName: %s
%s`, kubeconfig, benchQPS, 2*benchQPS, name, profile), factory)
	wait := func(ch <-chan struct{}, what string) {
		select {
		case <-ch:
		case <-done:
			b.Fatalf("the scheduler stopped before %s of %d claims were placed", what, n)
		case <-time.After(20 * time.Minute):
			b.Fatalf("not %s of %d claims placed within 20 minutes", what, n)
		}
	}
	wait(w.first, "the first")
	var m0, m1 goruntime.MemStats
	goruntime.ReadMemStats(&m0)
	cpu0, api0 := selfCPU(b), controlplane.ProcCPU(b, e.apiserverPID)
	var prof *os.File
	if out := os.Getenv("PLINTH_BENCH_OUT"); out != "" {
		f, err := os.Create(filepath.Join(out, fmt.Sprintf("scheduler-real-%d-%s.pprof", round, config)))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Logf("round %d: no CPU profile: %v", round, err) // -cpuprofile holds the profiler
		} else {
			prof = f
		}
	}
	wait(w.all, "all")
	if prof != nil {
		pprof.StopCPUProfile()
	}
	res.cpuMS = float64((selfCPU(b) - cpu0).Milliseconds()) / float64(n-1)
	res.apiserverCPUMS = float64((controlplane.ProcCPU(b, e.apiserverPID) - api0).Milliseconds()) / float64(n-1)
	res.load = controlplane.LoadAverage()
	goruntime.ReadMemStats(&m1)
	res.allocs = float64(m1.Mallocs-m0.Mallocs) / float64(n-1)
	res.bytes = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n-1)
	stop()
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.Fatal("scheduler did not stop within a minute")
	}
	// The scheduler's plugin metrics reach the registry through a buffer flushed every second:
	// the last second's samples may be missing, which leaves the means as they are.
	after := gatherHistograms(b)

	var first, last time.Time
	for claim, p := range w.placed() {
		if !strings.HasPrefix(p.node, "bench-") {
			b.Errorf("claim %s placed on %q, not a bench node", claim, p.node)
		}
		at := p.at
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	res.podsPerSec = float64(n-1) / last.Sub(first).Seconds()
	cycles, cycleSum := after.delta(before, "scheduler_scheduling_algorithm_duration_seconds", "")
	if cycles < float64(n) {
		b.Errorf("round %d: %.0f scheduling cycles for %d pods", round, cycles, n)
	}
	res.extMS = map[string]float64{}
	var parts []string
	for _, ext := range benchExtensionPoints {
		c, s := after.delta(before, "scheduler_framework_extension_point_duration_seconds", `extension_point="`+ext+`",profile="`+name+`"`)
		if c > 0 {
			res.extMS[ext] = 1000 * s / c
			parts = append(parts, fmt.Sprintf("%s %.3f ms", ext, res.extMS[ext]))
		}
	}
	res.cycleMS = 1000*cycleSum/cycles + res.extMS["Reserve"]
	res.log = fmt.Sprintf("%s: %d pods in %s; per cycle (all plugins): %s", name, n, last.Sub(first).Round(time.Millisecond), strings.Join(parts, ", "))
	if config == "plinth" {
		res.pluginExtMS = map[string]float64{}
		parts = parts[:0]
		for _, ext := range countedPoints {
			calls, ms := counted.perCycle(ext, cycles)
			if calls < int64(n) {
				b.Errorf("round %d: PlinthCapacity %s ran %d times for %d pods", round, ext, calls, n)
			}
			res.pluginExtMS[ext] = ms
			res.pluginMS += ms
			parts = append(parts, fmt.Sprintf("%s %.3f ms (%d calls)", ext, ms, calls))
		}
		res.log += fmt.Sprintf("; PlinthCapacity %.3f ms of %.3f ms: %s", res.pluginMS, res.cycleMS, strings.Join(parts, ", "))
	}
	for _, del := range []func() error{
		func() error {
			return e.cs.CoreV1().Pods(name).DeleteCollection(e.ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		},
		func() error {
			return e.cs.CoreV1().PersistentVolumeClaims(name).DeleteCollection(e.ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		},
	} {
		if err := del(); err != nil {
			b.Error(err)
		}
	}
	return res
}

// placement is where and when the scheduler placed a claim (selected-node first seen).
type placement struct {
	node string
	at   time.Time
}

// placedWatch is what watchPlaced returns: placed gives where and when each placed claim was
// placed, by claim name; first closes at the first placement, all when all n are placed;
// stop ends the watch.
type placedWatch struct {
	placed     func() map[string]placement
	first, all <-chan struct{}
	stop       func()
}

// watchPlaced watches the namespace's claims and records when each first carries
// selected-node.
func (e *env) watchPlaced(ns string, n int) placedWatch {
	b := e.t
	list, err := e.cs.CoreV1().PersistentVolumeClaims(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	// a watch that resumes where a loaded API server ended it
	w, err := watchtools.NewRetryWatcherWithContext(e.ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return e.cs.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, o)
		}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.Stop)
	var mu sync.Mutex
	placed := map[string]placement{}
	first, all := make(chan struct{}), make(chan struct{})
	go func() {
		for ev := range w.ResultChan() {
			pvc, ok := ev.Object.(*corev1.PersistentVolumeClaim)
			if !ok || pvc.Annotations[annSelected] == "" {
				continue
			}
			mu.Lock()
			if _, seen := placed[pvc.Name]; !seen {
				placed[pvc.Name] = placement{node: pvc.Annotations[annSelected], at: time.Now()}
				switch len(placed) {
				case 1:
					close(first)
				case n:
					close(all)
				}
			}
			mu.Unlock()
		}
	}()
	return placedWatch{
		placed: func() map[string]placement {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(placed)
		},
		first: first, all: all, stop: w.Stop,
	}
}

// countedCapacity is PlinthCapacity counting its calls per extension point and timing them
// in the cycles the scheduler samples for its own plugin metrics (10 %,
// CycleState.ShouldRecordPluginMetrics). The scheduler's scheduler_plugin_execution_duration_seconds
// cannot serve: its buffer takes 1,000 samples a second and drops the rest, and a sampled cycle
// on 500 nodes fills it with Filter samples before Score's arrive.
type countedCapacity struct {
	*capacity.Plugin
	ext [len(countedPoints)]struct {
		calls, sampled, sampledNanos atomic.Int64
	}
}

// countedPoints are the extension points countedCapacity counts, in the order of its ext.
var countedPoints = [...]string{"PreFilter", "Filter", "PreScore", "Score", "NormalizeScore", "Reserve"}

const (
	cPreFilter = iota
	cFilter
	cPreScore
	cScore
	cNormalizeScore
	cReserve
)

func (c *countedCapacity) factory(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	p, err := capacity.New(ctx, obj, h)
	if err != nil {
		return nil, err
	}
	c.Plugin = p.(*capacity.Plugin)
	return c, nil
}

// track counts a call of extension point i and returns the function that ends it: it times
// the call when the cycle is sampled.
func (c *countedCapacity) track(i int, cs fwk.CycleState) func() {
	e := &c.ext[i]
	e.calls.Add(1)
	if !cs.ShouldRecordPluginMetrics() {
		return func() {}
	}
	start := time.Now()
	return func() {
		e.sampled.Add(1)
		e.sampledNanos.Add(int64(time.Since(start)))
	}
}

// perCycle returns the calls of extension point ext and PlinthCapacity's time in it per cycle,
// ms: the mean of its sampled calls × its calls / cycles (0 when none was sampled).
func (c *countedCapacity) perCycle(ext string, cycles float64) (calls int64, ms float64) {
	for i, name := range countedPoints {
		if name != ext {
			continue
		}
		e := &c.ext[i]
		calls = e.calls.Load()
		if n := e.sampled.Load(); n > 0 {
			ms = float64(e.sampledNanos.Load()) / 1e6 / float64(n) * float64(calls) / cycles
		}
		return calls, ms
	}
	panic("no extension point " + ext)
}

func (c *countedCapacity) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	defer c.track(cPreFilter, cs)()
	return c.Plugin.PreFilter(ctx, cs, pod, nodes)
}

func (c *countedCapacity) Filter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	defer c.track(cFilter, cs)()
	return c.Plugin.Filter(ctx, cs, pod, ni)
}

func (c *countedCapacity) PreScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	defer c.track(cPreScore, cs)()
	return c.Plugin.PreScore(ctx, cs, pod, nodes)
}

func (c *countedCapacity) Score(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	defer c.track(cScore, cs)()
	return c.Plugin.Score(ctx, cs, pod, ni)
}

// ScoreExtensions returns c, so that NormalizeScore is counted too.
func (c *countedCapacity) ScoreExtensions() fwk.ScoreExtensions { return c }

func (c *countedCapacity) NormalizeScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	defer c.track(cNormalizeScore, cs)()
	return c.Plugin.NormalizeScore(ctx, cs, pod, scores)
}

func (c *countedCapacity) Reserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, node string) *fwk.Status {
	defer c.track(cReserve, cs)()
	return c.Plugin.Reserve(ctx, cs, pod, node)
}

// histograms maps `name{label="value",...}` (labels sorted) to count and sum, from the
// scheduler's metrics registry: what its /metrics serves.
type histograms map[string][2]float64

func gatherHistograms(b testing.TB) histograms {
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		b.Fatal(err)
	}
	h := histograms{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "scheduler_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hist := m.GetHistogram(); hist != nil {
				h[mf.GetName()+"{"+labelString(m.GetLabel())+"}"] = [2]float64{float64(hist.GetSampleCount()), hist.GetSampleSum()}
			}
		}
	}
	return h
}

func labelString(ls []*dto.LabelPair) string {
	var s []string
	for _, l := range ls {
		s = append(s, l.GetName()+"="+strconv.Quote(l.GetValue()))
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

// delta is the count and sum added since before, over the series of name whose labels
// contain every label of match (`a="x",b="y"`, "" for all).
func (h histograms) delta(before histograms, name, match string) (count, sum float64) {
	for k, v := range h {
		labels, ok := strings.CutPrefix(k, name+"{")
		if !ok || !containsLabels(strings.TrimSuffix(labels, "}"), match) {
			continue
		}
		count += v[0] - before[k][0]
		sum += v[1] - before[k][1]
	}
	return count, sum
}

func containsLabels(labels, match string) bool {
	for l := range strings.SplitSeq(match, ",") {
		if l != "" && !strings.Contains(","+labels+",", ","+l+",") {
			return false
		}
	}
	return true
}

// extensionPoints says the mean time per call of each extension point of the profile
// (scheduler_framework_extension_point_duration_seconds, all plugins together).
func (h histograms) extensionPoints(before histograms, profile string) string {
	var parts []string
	for _, ext := range []string{"PreFilter", "Filter", "PreScore", "Score", "Reserve", "PreBind"} {
		c, s := h.delta(before, "scheduler_framework_extension_point_duration_seconds", `extension_point="`+ext+`",profile="`+profile+`"`)
		if c > 0 {
			parts = append(parts, fmt.Sprintf("%s %.3f ms", ext, 1000*s/c))
		}
	}
	return strings.Join(parts, ", ")
}
