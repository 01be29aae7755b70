package agent_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// BenchmarkAgentMemory is the memory of `plinth agent` — the binary of this tree (or
// $PLINTH_BINARY) in a process of its own, so that the benchmark's own memory is not
// counted, with its default flags and the default 30 s refresh — holding
// PLINTH_BENCH_MEMORY_VOLUMES (default 1,000) file volumes on the host's loop devices,
// against the real API server. Reported, in MiB: rss-0-mib (VmRSS of the agent once it has
// reported its Store, no volume yet: the floor of the same run), rss-mib (VmRSS holding the
// N volumes, after a hold of PLINTH_BENCH_MEMORY_HOLD_SECONDS, default 35: one refresh at
// least), hwm-mib (VmHWM, the peak through the create burst and the hold), rss-anon-0-mib and
// rss-anon-mib (RssAnon: heap, stacks and runtime, without the file-backed pages of the
// binary itself, which are most of its RSS and shared with any other process mapping it) and
// heap-mib (go_memstats_heap_inuse_bytes of its /metrics at the end of the hold). Then every volume is
// deleted; whatever stays attached under the benchmark's folder is detached, also on
// failure. One run (b.N is ignored: run it with -benchtime 1x).
func BenchmarkAgentMemory(b *testing.B) {
	requireLoop(b)
	n := controlplane.BenchKnob(b, "PLINTH_BENCH_MEMORY_VOLUMES", 1000, 1)
	hold := time.Duration(controlplane.BenchKnob(b, "PLINTH_BENCH_MEMORY_HOLD_SECONDS", 35, 1)) * time.Second
	cp := controlplane.ForTest(b, controlplane.Options{})
	e := newEnvFor(b, cp)
	plinth := plinthBinary(b)
	ctx := context.Background()
	dir := b.TempDir()
	const node = "bench-memory"
	storeName := node + "-store"
	decl := policyv1.Backend{File: &policyv1.FileBackend{Directory: filepath.Join(dir, "vols")}}
	s := &storev1.Store{}
	s.Name = storeName
	s.Labels = nodeLabels(node, pool)
	s.Spec = storev1.StoreSpec{Pool: pool, NodeName: node, Backend: decl, Reserve: "1Mi", DriftPolicy: policyv1.DriftPolicyReport}
	if err := e.c.Create(ctx, s); err != nil {
		b.Fatal(err)
	}

	port, err := controlplane.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	p, err := cp.StartProcess(ctx, controlplane.ProcessSpec{
		Name: "plinth-agent-memory", Binary: plinth,
		Args: []string{"agent", "--node", node, "--kubeconfig", e.kubeconfig, "--state-dir", filepath.Join(dir, "state"),
			"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", port), "--health-probe-bind-address", "0",
			"--host-nqn-file", filepath.Join(dir, "no-hostnqn")},
		Ready: controlplane.HTTPReady(metricsURL, nil),
	})
	if err != nil {
		b.Fatal(err)
	}
	// the agent stops first, then nothing it attached stays bound (also when b fails)
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("agent log, last lines:\n%s", p.Tail(40))
		}
		p.Stop() //nolint:errcheck // its exit status says nothing here
		detachUnder(b, dir)
	})
	controlplane.Eventually(b, 2*time.Minute, 100*time.Millisecond, "the agent reports its Store's capacity", func() error {
		var st storev1.Store
		if err := e.c.Get(ctx, client.ObjectKey{Name: storeName}, &st); err != nil {
			return err
		}
		if st.Status.Capacity == nil || st.Status.Capacity.Available <= 0 {
			return fmt.Errorf("no capacity yet: %+v", st.Status.Capacity)
		}
		return nil
	})
	b.ReportMetric(controlplane.ProcStatusMiB(b, p.PID(), "VmRSS"), "rss-0-mib")
	b.ReportMetric(controlplane.ProcStatusMiB(b, p.PID(), "RssAnon"), "rss-anon-0-mib")

	wc, err := client.NewWithWatch(e.cfg, client.Options{Scheme: agent.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	w, err := wc.Watch(ctx, &storev1.VolumeStateList{}, client.MatchingLabels(nodeLabels(node, pool)))
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	ready, gone := map[string]bool{}, map[string]bool{}
	allReady, allGone := make(chan struct{}), make(chan struct{})
	go func() {
		for ev := range w.ResultChan() {
			vs, ok := ev.Object.(*storev1.VolumeState)
			if !ok {
				continue
			}
			mu.Lock()
			switch {
			case ev.Type == watch.Deleted && !gone[vs.Name]:
				if gone[vs.Name] = true; len(gone) == n {
					close(allGone)
				}
			case vs.Status.Phase == storev1.VolumeReady && apimeta.IsStatusConditionTrue(vs.Status.Conditions, agent.CondReady) && !ready[vs.Name]:
				if ready[vs.Name] = true; len(ready) == n {
					close(allReady)
				}
			}
			mu.Unlock()
		}
	}()
	names := make([]string, n)
	controlplane.Parallel(n, 8, func(i int) {
		vs := newVolumeState(fmt.Sprintf("%s-pvc-%04d", node, i), node, pool, storeName, mib, policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}, decl)
		names[i] = vs.Name
		if err := e.c.Create(ctx, vs); err != nil {
			b.Error(err)
		}
	})
	wait(b, allReady, 30*time.Minute, fmt.Sprintf("%d VolumeStates Ready", n))
	holdTimer := time.NewTimer(hold) // the agent holds the volumes through a refresh
	<-holdTimer.C
	b.ReportMetric(controlplane.ProcStatusMiB(b, p.PID(), "VmRSS"), "rss-mib")
	b.ReportMetric(controlplane.ProcStatusMiB(b, p.PID(), "VmHWM"), "hwm-mib")
	b.ReportMetric(controlplane.ProcStatusMiB(b, p.PID(), "RssAnon"), "rss-anon-mib")
	b.ReportMetric(heapInUseMiB(b, metricsURL), "heap-mib")

	controlplane.Parallel(n, 8, func(i int) {
		vs := &storev1.VolumeState{}
		vs.Name = names[i]
		if err := e.c.Delete(ctx, vs); err != nil {
			b.Error(err)
		}
	})
	wait(b, allGone, 30*time.Minute, fmt.Sprintf("%d VolumeStates gone", n))
	if err := e.c.Delete(ctx, s); err != nil {
		b.Error(err)
	}
}

// heapInUseMiB reads go_memstats_heap_inuse_bytes (the Go heap's spans in use) from the
// agent's /metrics, in MiB.
func heapInUseMiB(b *testing.B, url string) float64 {
	b.Helper()
	resp, err := http.Get(url) //nolint:gosec,noctx // the agent's loopback metrics
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		b.Fatalf("parse %s: %v", url, err)
	}
	mf := mfs["go_memstats_heap_inuse_bytes"]
	if mf == nil || len(mf.GetMetric()) != 1 {
		b.Fatalf("%s: no go_memstats_heap_inuse_bytes", url)
	}
	return mf.GetMetric()[0].GetGauge().GetValue() / (1 << 20)
}

// plinthBinary returns $PLINTH_BINARY, or builds ./cmd/plinth of this tree into b's
// temporary folder.
func plinthBinary(b *testing.B) string {
	b.Helper()
	if p := os.Getenv("PLINTH_BINARY"); p != "" {
		return p
	}
	root, err := controlplane.ModuleRoot()
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "plinth")
	cmd := exec.Command("go", "build", "-o", path, "./cmd/plinth")
	cmd.Dir = root // the test's environment: the build cache serves it
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build ./cmd/plinth: %v\n%s", err, out)
	}
	return path
}
