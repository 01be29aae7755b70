package integration

import (
	"context"
	"fmt"
	"maps"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/plinth-storage/plinth/test/controlplane"
)

// benchQPS is the scheduler's client limit in both rounds. kube-scheduler's default (50 QPS,
// burst 100) caps VolumeBinding's PreBind, one PVC write per pod, at 50 pods/s whichever
// plugins run: both rounds would measure the client's limiter, not the scheduling cycle.
const benchQPS = 1000

// BenchmarkRealScheduler: the real kube-scheduler (in process, as
// TestPlinthCapacityWithRealScheduler runs it) on the real kube-apiserver schedules the same
// PLINTH_BENCH_SCHED_PODS pods (default 1,000; one 1 GiB claim each of a WaitForFirstConsumer
// class of csi.plinth.dev) on the same PLINTH_BENCH_SCHED_NODES Nodes (default 500, each with
// a Store reporting capacity) in four rounds, A B B A so that neither configuration gains
// from going second: with the default plugins only (sub-benchmark "default", the peer) and
// with PlinthCapacity added at every extension point it implements ("plinth"). Each round
// starts a scheduler of its own with every pod already pending. Reported per configuration,
// the mean of its two rounds: pods/s ((N−1) over the first → last claim carrying
// volume.kubernetes.io/selected-node, which VolumeBinding's PreBind writes after Reserve; no
// provisioner runs, so pods stay in PreBind), cycle-ms (mean of
// scheduler_scheduling_algorithm_duration_seconds: PreFilter through Score), and for
// "plinth" plugin-ms (PlinthCapacity's time per cycle: the mean of each extension point in
// scheduler_plugin_execution_duration_seconds, which samples 10 % of cycles, times its calls
// per cycle, counted; Filter and Score calls run on 16 goroutines, so this is time spent in
// the plugin, not wall time) and plugin-%-of-cycle; allocs/pod and B/pod are the process's
// allocations (the in-process scheduler's, mostly) per pod. It fails when PlinthCapacity did
// not run PreFilter, Filter and Score for every pod. One run per round (b.N is ignored: run it with
// -benchtime 1x); without the test binaries it skips, under CI=true it fails.
func BenchmarkRealScheduler(b *testing.B) {
	nodes := controlplane.BenchKnob(b, "PLINTH_BENCH_SCHED_NODES", 500, 2)
	pods := controlplane.BenchKnob(b, "PLINTH_BENCH_SCHED_PODS", 1000, 2)
	cp := controlplane.ForTest(b, controlplane.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := rest.CopyConfig(cp.Admin.Config)
	cfg.QPS, cfg.Burst = benchQPS, 2*benchQPS // setup only: the scheduler has its own client
	e := &env{t: b, ctx: ctx}
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
	results := map[string][]roundResult{}
	for _, round := range []string{"default", "plinth", "plinth", "default"} {
		results[round] = append(results[round], e.schedulerRound(round, cp.Admin.Kubeconfig, pods))
	}
	for _, round := range []string{"default", "plinth"} {
		b.Run(round, func(b *testing.B) {
			rs := results[round]
			mean := func(f func(r roundResult) float64) float64 { return (f(rs[0]) + f(rs[1])) / 2 }
			b.Logf("%s rounds: %.1f and %.1f pods/s\n%s\n%s", round, rs[0].podsPerSec, rs[1].podsPerSec, rs[0].log, rs[1].log)
			b.ReportMetric(mean(func(r roundResult) float64 { return r.podsPerSec }), "pods/s")
			b.ReportMetric(mean(func(r roundResult) float64 { return r.cycleMS }), "cycle-ms")
			b.ReportMetric(mean(func(r roundResult) float64 { return r.allocs }), "allocs/pod")
			b.ReportMetric(mean(func(r roundResult) float64 { return r.bytes }), "B/pod")
			if round == "plinth" {
				pl := mean(func(r roundResult) float64 { return r.pluginMS })
				b.ReportMetric(pl, "plugin-ms")
				b.ReportMetric(100*pl/mean(func(r roundResult) float64 { return r.cycleMS }), "plugin-%-of-cycle")
			}
		})
	}
}

// roundResult is what one round measured (see BenchmarkRealScheduler).
type roundResult struct {
	podsPerSec, cycleMS, pluginMS, allocs, bytes float64
	log                                          string // where the cycle's time went
}

// benchRounds makes each round's namespace and scheduler name unique when b.N > 1 reruns it.
var benchRounds atomic.Int64

// schedulerRound creates n claims and pods in a namespace of their own, runs a scheduler
// (round "plinth": with PlinthCapacity) until every claim carries selected-node, stops the
// scheduler, deletes the pods and returns what it measured.
func (e *env) schedulerRound(round, kubeconfig string, n int) (res roundResult) {
	b := e.t
	name := fmt.Sprintf("bench-%s-%d", round, benchRounds.Add(1))
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
	placed, allPlaced := e.watchPlaced(name, n)

	profile := ""
	factory := capacity.New
	counted := &countedCapacity{}
	if round == "plinth" {
		profile = withCapacity
		factory = counted.factory
	}
	before := gatherHistograms(b)
	var m0, m1 goruntime.MemStats
	goruntime.ReadMemStats(&m0)
	sctx, stop := context.WithCancel(e.ctx)
	defer stop()
	done := runScheduler(b, sctx, fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: %q, qps: %d, burst: %d}
leaderElection: {leaderElect: false}
profiles:
- schedulerName: %s
%s`, kubeconfig, benchQPS, 2*benchQPS, name, profile), factory)
	select {
	case <-allPlaced:
	case <-done:
		b.Fatalf("the scheduler stopped before every claim of %d was placed", n)
	case <-time.After(20 * time.Minute):
		b.Fatalf("not every claim of %d placed within 20 minutes", n)
	}
	goruntime.ReadMemStats(&m1)
	res.allocs = float64(m1.Mallocs-m0.Mallocs) / float64(n)
	res.bytes = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n)
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
	for claim, p := range placed() {
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
		b.Errorf("%.0f scheduling cycles for %d pods", cycles, n)
	}
	res.cycleMS = 1000 * cycleSum / cycles
	res.log = fmt.Sprintf("%s: %d pods in %s; per cycle (all plugins): %s", name, n, last.Sub(first).Round(time.Millisecond), after.extensionPoints(before, name))
	if round == "plinth" {
		pluginMS := 0.0
		var parts []string
		for _, ext := range []string{"PreFilter", "Filter", "PreScore", "Score", "Reserve"} {
			calls := counted.calls(ext)
			if calls < int64(n) {
				b.Errorf("PlinthCapacity %s ran %d times for %d pods", ext, calls, n)
			}
			c, s := after.delta(before, "scheduler_plugin_execution_duration_seconds", `plugin="PlinthCapacity",extension_point="`+ext+`"`)
			if c == 0 {
				continue
			}
			perCycle := 1000 * s / c * float64(calls) / cycles
			pluginMS += perCycle
			parts = append(parts, fmt.Sprintf("%s %.3f ms (%d calls)", ext, perCycle, calls))
		}
		res.log += fmt.Sprintf("; PlinthCapacity %.3f ms of %.3f ms: %s", pluginMS, res.cycleMS, strings.Join(parts, ", "))
		res.pluginMS = pluginMS
	}
	if err := e.cs.CoreV1().Pods(name).DeleteCollection(e.ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Error(err)
	}
	return res
}

// placement is where and when the scheduler placed a claim (selected-node first seen).
type placement struct {
	node string
	at   time.Time
}

// watchPlaced watches the namespace's claims and records when each first carries
// selected-node; the returned function gives those of every placed claim, by claim name,
// the channel closes when all n are placed.
func (e *env) watchPlaced(ns string, n int) (func() map[string]placement, <-chan struct{}) {
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
	all := make(chan struct{})
	go func() {
		for ev := range w.ResultChan() {
			pvc, ok := ev.Object.(*corev1.PersistentVolumeClaim)
			if !ok || pvc.Annotations[annSelected] == "" {
				continue
			}
			mu.Lock()
			if _, seen := placed[pvc.Name]; !seen {
				placed[pvc.Name] = placement{node: pvc.Annotations[annSelected], at: time.Now()}
				if len(placed) == n {
					close(all)
				}
			}
			mu.Unlock()
		}
	}()
	return func() map[string]placement {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(placed)
	}, all
}

// countedCapacity is PlinthCapacity counting its calls per extension point: its execution
// time metric samples 10 % of cycles, the counts say how often it ran in all of them.
type countedCapacity struct {
	*capacity.Plugin
	preFilter, filter, preScore, score, reserve atomic.Int64
}

func (c *countedCapacity) factory(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	p, err := capacity.New(ctx, obj, h)
	if err != nil {
		return nil, err
	}
	c.Plugin = p.(*capacity.Plugin)
	return c, nil
}

func (c *countedCapacity) calls(ext string) int64 {
	return map[string]*atomic.Int64{"PreFilter": &c.preFilter, "Filter": &c.filter, "PreScore": &c.preScore, "Score": &c.score, "Reserve": &c.reserve}[ext].Load()
}

func (c *countedCapacity) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	c.preFilter.Add(1)
	return c.Plugin.PreFilter(ctx, cs, pod, nodes)
}

func (c *countedCapacity) Filter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	c.filter.Add(1)
	return c.Plugin.Filter(ctx, cs, pod, ni)
}

func (c *countedCapacity) PreScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	c.preScore.Add(1)
	return c.Plugin.PreScore(ctx, cs, pod, nodes)
}

func (c *countedCapacity) Score(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	c.score.Add(1)
	return c.Plugin.Score(ctx, cs, pod, ni)
}

func (c *countedCapacity) Reserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, node string) *fwk.Status {
	c.reserve.Add(1)
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
