package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/internal/devenv"
	"github.com/plinth-storage/plinth/test/controlplane"
)

// BenchmarkPodWithVolumeRunning measures, on three real kubelets with Plinth
// deployed from its manifests, the time from a PVC's creation to its pod
// Running with the volume mounted (the quickstart class: file backend,
// WaitForFirstConsumer, plinth-scheduler), one PVC at a time; each volume is
// deleted (and waited for) outside the measured time. It reports p50 and
// p99 over the b.N samples (make bench runs it with -benchtime 30x).
func BenchmarkPodWithVolumeRunning(b *testing.B) {
	gate(b, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubeControllerManager,
		controlplane.BinPlinthScheduler, controlplane.BinKubectl, controlplane.BinKubelet, controlplane.BinKubeProxy)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "plinth-bench-")
	if err != nil {
		b.Fatal(err)
	}
	up := time.Now()
	env, err := devenv.Up(ctx, devenv.Options{Dir: dir, Images: os.Getenv("PLINTH_IMAGES")})
	if err != nil {
		b.Fatalf("up: %v", err)
	}
	b.Cleanup(func() {
		if err := env.Down(); err != nil {
			b.Errorf("down: %v", err)
		}
		if !b.Failed() {
			os.RemoveAll(dir)
		}
	})
	walk := devenv.NewWalk(env)
	sum := &devenv.Summary{}
	if err := walk.Policy(ctx, sum); err != nil {
		b.Fatal(err)
	}
	if err := walk.ShowRendered(ctx, sum); err != nil {
		b.Fatal(err)
	}
	b.Logf("environment up (control plane, 3 nodes, Plinth rolled out, policy Ready) in %s", time.Since(up).Round(time.Millisecond))
	// One unmeasured volume first: the first pod on a node pays for things
	// later pods do not (kubelet's first CSI call, the container image's first unpack).
	if _, err := walk.PodWithVolume(ctx, "warm-up", devenv.QuickstartClass); err != nil {
		b.Fatal(err)
	}
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		d, err := walk.PodWithVolume(ctx, fmt.Sprintf("bench-%d", i), devenv.QuickstartClass)
		if err != nil {
			b.Fatal(err)
		}
		samples = append(samples, d)
	}
	b.StopTimer()
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	q := func(p float64) time.Duration { return samples[int(p*float64(len(samples)-1))] }
	b.ReportMetric(float64(q(0.5).Milliseconds()), "p50-ms")
	b.ReportMetric(float64(q(0.99).Milliseconds()), "p99-ms")
	b.Logf("PVC created → pod Running, %d samples: p50 %s, p99 %s, max %s", len(samples), q(0.5), q(0.99), samples[len(samples)-1])
}
