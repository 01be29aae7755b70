package policy_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// BenchmarkControllerMemory measures the memory of `plinth controller` (a process of its own,
// as deployed) on the benchmark's own etcd + kube-apiserver: PLINTH_BENCH_NODES Nodes (default
// 1000) with the fleet's policies applied (a StoragePool on every node, an NVMe-oF Protocol, a
// Placement: 2N+1 rendered objects), then PLINTH_BENCH_VOLUMES VolumeStates (default 10000)
// spread over the fleet's Stores, which the controller's informer cache holds. Reports, each
// read once the controller is quiet: fleet-rss-mib and fleet-heap-mib (VmRSS, and the Go heap
// in use from its go_memstats_heap_inuse_bytes) with the fleet alone; rss-mib and heap-mib with
// the VolumeStates too; hwm-mib, the peak RSS (VmHWM) over the whole run. One run (b.N is
// ignored: -benchtime 1x).
func BenchmarkControllerMemory(b *testing.B) {
	env(b) // skips or fails as the suite does when the binaries are missing
	n := controlplane.BenchKnob(b, "PLINTH_BENCH_NODES", 1000, 1)
	volumes := controlplane.BenchKnob(b, "PLINTH_BENCH_VOLUMES", 10000, 1)
	fe := startFleetControlPlane(b, true) // a default API server; no limit flags, as deployed
	c := fe.c
	createFleetNodes(b, c, n)
	plinth := buildPlinth(b)
	ports := freePorts(b, 2)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0])
	pc, err := fe.cp.StartProcess(ctx, controlplane.ProcessSpec{Name: "memory-plinth-controller", Binary: plinth,
		Args: []string{"controller", "--kubeconfig=" + fe.cp.Admin.Kubeconfig, "--namespace=" + namespace,
			fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[0]), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[1]),
			"--resync-interval=0", "--log-format=console"},
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), nil)})
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Stop() //nolint:errcheck

	p, proto, pl := fleetPolicies()
	createPoliciesReady(b, c, p, proto, pl)
	fleetApplied(b, c, n)
	quiet(b, pc.PID(), metricsURL)
	fleetRSS, fleetHeap := memory(b, pc.PID(), metricsURL)

	createVolumeStates(b, c, p, proto, pl, n, volumes)
	quiet(b, pc.PID(), metricsURL)
	rss, heap := memory(b, pc.PID(), metricsURL)
	_, hwm := procStat(b, pc.PID())

	b.ReportMetric(fleetRSS, "fleet-rss-mib")
	b.ReportMetric(fleetHeap, "fleet-heap-mib")
	b.ReportMetric(rss, "rss-mib")
	b.ReportMetric(heap, "heap-mib")
	b.ReportMetric(hwm, "hwm-mib")
	b.Logf("plinth controller, %d nodes: RSS %.0f MiB (heap %.0f MiB); with %d VolumeStates: RSS %.0f MiB (heap %.0f MiB); peak RSS %.0f MiB; load average %s",
		n, fleetRSS, fleetHeap, volumes, rss, heap, hwm, controlplane.LoadAverage())
}

// createVolumeStates creates count VolumeStates of the fleet's placement, round-robin over the
// Stores of its n nodes, each with one publication, 8 at a time.
func createVolumeStates(b *testing.B, c client.Client, p *policyv1.StoragePool, proto *policyv1.Protocol, pl *policyv1.Placement, n, count int) {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < count; i += 8 {
				node := fmt.Sprintf("fleet-%05d", i%n)
				csiName := fmt.Sprintf("pvc-%08d", i)
				v := &storev1.VolumeState{
					ObjectMeta: metav1.ObjectMeta{Name: storev1.VolumeID(csiName),
						Labels: map[string]string{policyv1.LabelPool: p.Name, policyv1.LabelNode: storev1.NameLabelValue(node)}},
					Spec: storev1.VolumeStateSpec{CSIName: csiName, StoreName: storev1.StoreName(p.Name, node), CapacityBytes: 1 << 30,
						VolumeMode: "Filesystem",
						Policy: storev1.FrozenPolicy{Placement: pl.Name, Pool: p.Name, Protocol: proto.Name, Backend: p.Spec.Backend,
							ProtocolSpec: proto.Spec, Filesystem: pl.Spec.Filesystem},
						Publications: []storev1.Publication{{NodeName: fmt.Sprintf("fleet-%05d", (i+1)%n),
							HostNQN: "nqn.2014-08.org.nvmexpress:uuid:" + strconv.Itoa(i), AccessMode: "SINGLE_NODE_WRITER"}},
						PublicationGeneration: 1},
				}
				if err := c.Create(ctx, v); err != nil {
					errs <- fmt.Errorf("create VolumeState %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// quiet waits until the controller finishes no reconcile and its RSS grows by less than 1 %
// over two seconds.
func quiet(b *testing.B, pid int, metricsURL string) {
	var count float64
	var rss float64
	poll(b, 10*time.Minute, "controller quiet", func() error {
		_, cnt := reconcileSeconds(b, metricsURL, "policy")
		now, _ := memory(b, pid, metricsURL)
		if cnt != count || now > rss*1.01 {
			count, rss = cnt, now
			time.Sleep(2 * time.Second)
			return fmt.Errorf("still reconciling or growing: %v reconciles, RSS %.0f MiB", cnt, now)
		}
		return nil
	})
}

// memory reads a process's resident set (VmRSS of /proc/<pid>/status) and the Go heap in use
// its metrics report (go_memstats_heap_inuse_bytes), both in MiB.
func memory(b *testing.B, pid int, metricsURL string) (rssMiB, heapMiB float64) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				b.Fatalf("VmRSS %q: %v", v, err)
			}
			rssMiB = kb / 1024
		}
	}
	resp, err := http.Get(metricsURL)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok {
			bytes, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("go_memstats_heap_inuse_bytes %q: %v", v, err)
			}
			return rssMiB, bytes / (1 << 20)
		}
	}
	b.Fatalf("%s: no go_memstats_heap_inuse_bytes", metricsURL)
	return 0, 0
}
