package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// bench is the environment BenchmarkPodWithVolumeRunning's runs share: the
// testing package calls a benchmark once with b.N = 1 before the measured
// run, and bringing three nodes up twice would only cost time. TestMain
// stops it.
var bench struct {
	env    *devenv.Env
	walk   *devenv.Walk
	dir    string
	cancel context.CancelFunc
	failed bool
}

// benchWalk returns the shared environment, bringing it up on first use:
// control plane, three real nodes, Plinth deployed, the quickstart policy Ready.
func benchWalk(b *testing.B) *devenv.Walk {
	b.Helper()
	if bench.walk != nil {
		return bench.walk
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	bench.cancel = cancel
	dir, err := os.MkdirTemp("", "plinth-bench-")
	if err != nil {
		b.Fatal(err)
	}
	bench.dir = dir
	up := time.Now()
	env, err := devenv.Up(ctx, devenv.Options{Dir: dir, Images: os.Getenv("PLINTH_IMAGES"), NoPrometheus: true})
	if err != nil {
		bench.failed = true
		b.Fatalf("up: %v", err)
	}
	bench.env = env
	walk := devenv.NewWalk(env)
	sum := &devenv.Summary{}
	if err := walk.Policy(ctx, sum); err != nil {
		bench.failed = true
		b.Fatal(err)
	}
	if err := walk.ShowRendered(ctx, sum); err != nil {
		bench.failed = true
		b.Fatal(err)
	}
	b.Logf("environment up (control plane, 3 nodes, Plinth rolled out, policy Ready) in %s", time.Since(up).Round(time.Millisecond))
	bench.walk = walk
	return walk
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bench.env != nil {
		if err := bench.env.Down(); err != nil {
			fmt.Fprintf(os.Stderr, "benchmark environment down: %v\n", err)
			code = 1
		}
		if !bench.failed && code == 0 {
			os.RemoveAll(bench.dir)
		}
		bench.cancel()
	}
	os.Exit(code)
}

// BenchmarkPodWithVolumeRunning measures, on three real kubelets with Plinth
// deployed from its manifests, the time from a PVC's creation to its pod
// Running with the volume mounted (the quickstart class: file backend,
// WaitForFirstConsumer, plinth-scheduler), one PVC at a time, and as its
// floor the same pod without a volume; each volume is deleted (and waited
// for) and the floor measured outside the timed part. It reports p50 and
// p99 over the b.N samples (make bench runs it with -benchtime 30x).
func BenchmarkPodWithVolumeRunning(b *testing.B) {
	gate(b, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubeControllerManager,
		controlplane.BinPlinthScheduler, controlplane.BinKubectl, controlplane.BinKubelet, controlplane.BinKubeProxy)
	walk := benchWalk(b)
	// One unmeasured volume first: the first pod on a node pays for things
	// later pods do not (kubelet's first CSI call, the container image's first unpack).
	ctx := context.Background()
	if _, err := walk.PodWithVolume(ctx, fmt.Sprintf("warm-up-%d", b.N), devenv.QuickstartClass); err != nil {
		bench.failed = true
		b.Fatal(err)
	}
	samples := make([]time.Duration, 0, b.N)
	floor := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		d, err := walk.PodWithVolume(ctx, fmt.Sprintf("bench-%d-%d", b.N, i), devenv.QuickstartClass)
		if err != nil {
			bench.failed = true
			b.Fatal(err)
		}
		samples = append(samples, d)
		// The floor, in the same run: the same pod without a volume.
		b.StopTimer()
		d, err = walk.PodWithoutVolume(ctx, fmt.Sprintf("floor-%d-%d", b.N, i))
		if err != nil {
			bench.failed = true
			b.Fatal(err)
		}
		floor = append(floor, d)
		b.StartTimer()
	}
	b.StopTimer()
	p50, p99, max := quantiles(samples)
	f50, f99, fmax := quantiles(floor)
	b.ReportMetric(float64(p50.Milliseconds()), "p50-ms")
	b.ReportMetric(float64(p99.Milliseconds()), "p99-ms")
	b.ReportMetric(float64(f50.Milliseconds()), "floor-p50-ms")
	b.ReportMetric(float64(f99.Milliseconds()), "floor-p99-ms")
	b.Logf("PVC created → pod Running, %d samples: p50 %s, p99 %s, max %s", len(samples), p50, p99, max)
	b.Logf("floor, pod without a volume → Running, %d samples: p50 %s, p99 %s, max %s", len(floor), f50, f99, fmax)
}

// quantiles returns the p50, p99 and maximum of samples (sorted in place).
func quantiles(samples []time.Duration) (p50, p99, max time.Duration) {
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	q := func(p float64) time.Duration { return samples[int(p*float64(len(samples)-1))] }
	return q(0.5), q(0.99), samples[len(samples)-1]
}
