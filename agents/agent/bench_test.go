package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/internal/clientlimit"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// quantile is the q-quantile (nearest rank) of sorted samples.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// cpuTime is the user+system CPU this process used so far (getrusage).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAgentFileVolumes is the agent alone under a burst: N VolumeStates
// (PLINTH_BENCH_VOLUMES, default 300) created at once on a file Store on the
// host's real loop devices, against the real kube-apiserver. It reports, per
// worker count, the create → Ready latency of each volume (p50/p99 of N samples,
// raw samples written to $PLINTH_BENCH_OUT/agent-<name>.txt when set), the
// burst's rate, then the CPU of the idle agent holding them over
// PLINTH_BENCH_IDLE_SECONDS (default 65: two default 30 s Store refreshes;
// the CPU profile of that window goes to $PLINTH_BENCH_OUT/agent-idle-<name>.pprof),
// and the delete → gone latency of all. One run per benchmark (b.N is ignored:
// run it with -benchtime 1x).
func BenchmarkAgentFileVolumes(b *testing.B) {
	requireLoop(b)
	n := controlplane.BenchKnob(b, "PLINTH_BENCH_VOLUMES", 300, 1)
	idle := time.Duration(controlplane.BenchKnob(b, "PLINTH_BENCH_IDLE_SECONDS", 65, 1)) * time.Second
	e := newEnvFor(b, controlplane.ForTest(b, controlplane.Options{}))
	for _, workers := range []int{1, 0} {
		name := "workers=" + strconv.Itoa(workers)
		if workers == 0 {
			name = "workers=default"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			benchBurst(b, e, "bench-"+strconv.Itoa(workers), workers, n, idle)
		})
	}
}

func benchBurst(b *testing.B, e *env, nodeName string, workers, n int, idle time.Duration) {
	ctx := context.Background()
	dir := b.TempDir()
	b.Cleanup(func() { detachUnder(b, dir) })
	state := b.TempDir()
	storeName := nodeName + "-store"
	decl := policyv1.Backend{File: &policyv1.FileBackend{Directory: filepath.Join(dir, "vols")}}
	s := &storev1.Store{}
	s.Name = storeName
	s.Labels = nodeLabels(nodeName, pool)
	s.Spec = storev1.StoreSpec{Pool: pool, NodeName: nodeName, Backend: decl, Reserve: "1Mi", DriftPolicy: policyv1.DriftPolicyReport}
	if err := e.c.Create(ctx, s); err != nil {
		b.Fatal(err)
	}
	// the client limits of `plinth agent` given no limit flag (on this API server, which runs
	// API Priority and Fairness: none)
	cfg := rest.CopyConfig(e.cfg)
	mode, err := clientlimit.Apply(ctx, cfg, clientlimit.Limits{QPS: agent.DefaultKubeAPIQPS, Burst: agent.DefaultKubeAPIBurst}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("client-side rate limit: %s (QPS %g, burst %d)", mode, cfg.QPS, cfg.Burst)
	mgr, err := agent.NewManager(cfg, agent.Options{
		NodeName: nodeName, StateDir: state, MetricsAddr: "0", ProbeAddr: "0", VolumeWorkers: workers,
		HostNQNFile: filepath.Join(state, "hostnqn"), NVMetRoot: filepath.Join(state, "nvmet"),
	})
	if err != nil {
		b.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(actx) }()
	defer func() {
		cancel()
		<-done
	}()

	wc, err := client.NewWithWatch(e.cfg, client.Options{Scheme: agent.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	w, err := wc.Watch(ctx, &storev1.VolumeStateList{}, client.MatchingLabels(nodeLabels(nodeName, pool)))
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	readyAt, goneAt := map[string]time.Time{}, map[string]time.Time{}
	allReady, allGone := make(chan struct{}), make(chan struct{})
	go func() {
		for ev := range w.ResultChan() {
			vs, ok := ev.Object.(*storev1.VolumeState)
			if !ok {
				continue
			}
			now := time.Now()
			mu.Lock()
			switch {
			case ev.Type == watch.Deleted:
				if _, seen := goneAt[vs.Name]; !seen {
					goneAt[vs.Name] = now
					if len(goneAt) == n {
						close(allGone)
					}
				}
			case vs.Status.Phase == storev1.VolumeReady && apimeta.IsStatusConditionTrue(vs.Status.Conditions, agent.CondReady):
				if _, seen := readyAt[vs.Name]; !seen {
					readyAt[vs.Name] = now
					if len(readyAt) == n {
						close(allReady)
					}
				}
			}
			mu.Unlock()
		}
	}()

	names := make([]string, n)
	started := make([]time.Time, n)
	par := func(f func(i int)) {
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < n; i += 8 {
					f(i)
				}
			}()
		}
		wg.Wait()
	}
	b.ResetTimer()
	burst := time.Now()
	par(func(i int) {
		vs := newVolumeState(fmt.Sprintf("%s-pvc-%04d", nodeName, i), nodeName, pool, storeName, mib, policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}, decl)
		names[i] = vs.Name
		started[i] = time.Now()
		if err := e.c.Create(ctx, vs); err != nil {
			b.Error(err)
		}
	})
	wait(b, allReady, 20*time.Minute, "all VolumeStates Ready")
	mu.Lock()
	lat := make([]time.Duration, n)
	last := burst
	for i, name := range names {
		lat[i] = readyAt[name].Sub(started[i])
		last = maxTime(last, readyAt[name])
	}
	mu.Unlock()
	b.StopTimer()
	logMetrics(b, "burst")
	report(b, "ready", lat)
	b.ReportMetric(float64(n)/last.Sub(burst).Seconds(), "vol/s")
	writeSamples(b, "agent-create-"+nodeName, lat)

	// idle: the agent holds n volumes and nothing changes
	var prof *os.File
	if out := os.Getenv("PLINTH_BENCH_OUT"); out != "" {
		if prof, err = os.Create(filepath.Join(out, "agent-idle-"+nodeName+".pprof")); err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(prof); err != nil {
			b.Fatal(err)
		}
	}
	c0, t0 := cpuTime(b), time.Now()
	idleWait := time.NewTimer(idle)
	<-idleWait.C
	c1, t1 := cpuTime(b), time.Now()
	if prof != nil {
		pprof.StopCPUProfile()
		prof.Close()
	}
	b.ReportMetric(100*(c1-c0).Seconds()/t1.Sub(t0).Seconds(), "idle-cpu-%")

	started = make([]time.Time, n)
	par(func(i int) {
		vs := &storev1.VolumeState{}
		vs.Name = names[i]
		started[i] = time.Now()
		if err := e.c.Delete(ctx, vs); err != nil {
			b.Error(err)
		}
	})
	wait(b, allGone, 20*time.Minute, "all VolumeStates gone")
	mu.Lock()
	for i, name := range names {
		lat[i] = goneAt[name].Sub(started[i])
	}
	mu.Unlock()
	logMetrics(b, "delete")
	report(b, "delete", lat)
	if err := e.c.Delete(ctx, s); err != nil {
		b.Error(err)
	}
}

// wait waits for ch to close: the benchmarks' progress comes from a watch, never from sleeps.
func wait(b *testing.B, ch <-chan struct{}, timeout time.Duration, what string) {
	b.Helper()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
		b.Fatalf("%s: not within %s", what, timeout)
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func report(b *testing.B, what string, lat []time.Duration) {
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	b.ReportMetric(float64(quantile(s, 0.50).Microseconds())/1000, what+"-p50-ms")
	b.ReportMetric(float64(quantile(s, 0.99).Microseconds())/1000, what+"-p99-ms")
}

// writeSamples keeps the raw samples (one duration in seconds a line) under
// $PLINTH_BENCH_OUT when it is set.
func writeSamples(b *testing.B, name string, lat []time.Duration) {
	out := os.Getenv("PLINTH_BENCH_OUT")
	if out == "" {
		return
	}
	var sb strings.Builder
	for _, d := range lat {
		fmt.Fprintf(&sb, "%.6f\n", d.Seconds())
	}
	if err := os.WriteFile(filepath.Join(out, name+".txt"), []byte(sb.String()), 0o644); err != nil {
		b.Error(err)
	}
}

// detachUnder frees every loop device still bound to a file under dir, so that an
// interrupted benchmark does not hold the host's loop devices.
func detachUnder(b *testing.B, dir string) {
	m, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range m {
		p, err := os.ReadFile(bf)
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(p)), dir) {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(bf)))
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil {
			b.Logf("detach %s: %v", dev, err)
		}
		unix.Close(fd)
	}
}

// logMetrics logs where the agent's time went so far (sums and counts of its histograms and
// controller-runtime's, client-go's rate limiter included): cumulative over the process.
func logMetrics(b *testing.B, when string) {
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "plinth_agent_operation") && name != "controller_runtime_reconcile_time_seconds" &&
			name != "rest_client_rate_limiter_duration_seconds" && name != "workqueue_queue_duration_seconds" && name != "rest_client_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			if h == nil || h.GetSampleCount() == 0 {
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			fmt.Fprintf(&sb, "  %s{%s}: count %d, sum %.2fs\n", name, strings.Join(labels, ","), h.GetSampleCount(), h.GetSampleSum())
		}
	}
	b.Logf("after %s:\n%s", when, sb.String())
}
