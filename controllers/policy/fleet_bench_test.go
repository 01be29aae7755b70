package policy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/cli-utils/pkg/flowcontrol"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// The fleet-apply benchmark: one policy set (a StoragePool selecting every node, an NVMe-oF
// Protocol, a Placement) rendered for N Nodes (N Stores, N Agents, one StorageClass), applied
// on one API server by two controllers in turn, each a process of its own started with the
// same client limits (--kube-api-qps, --kube-api-burst):
//   - kustomize-controller (Flux, the peer): the objects `plinth render` prints for those
//     policies and Nodes, committed to a Git repository served on loopback (git http-backend)
//     and fetched by source-controller, applied by a Kustomization (prune: true);
//   - plinth: `plinth controller`, rendering the same objects from the policy objects.
// Per controller: first apply (object creation → Ready, wall clock), a no-op re-apply (its
// reconcile time, from controller-runtime's controller_runtime_reconcile_time_seconds, and the
// writes it makes), the API server's requests for the applied kinds by verb (from its own
// apiserver_request_total), the API server's and the controller's CPU, and the controller's
// peak RSS. Between the two, the peer's objects are pruned by deleting its Kustomization.
//
// The API server is one of the benchmark's own (etcd + kube-apiserver), started with API
// Priority and Fairness off: Flux's controllers drop their client-side limiter altogether when
// the API server answers with APF's headers (fluxcd/pkg/runtime/client GetConfigOrDie sets QPS
// and burst to -1), so on a default API server --kube-api-qps and --kube-api-burst would bind
// Plinth and not the peer. Without APF both honour them; the benchmark checks the headers are
// absent before it starts.

// fleetKinds are the resources of the applied objects; requests to them are what is counted.
var fleetKinds = map[string]bool{"agents": true, "stores": true, "storageclasses": true}

// BenchmarkFleetApply: PLINTH_BENCH_NODES Nodes (default 1000), both controllers at
// PLINTH_BENCH_QPS / PLINTH_BENCH_BURST (default 50 / 300: the default of both). Reports per
// controller first-apply-s, noop-s (reconcile time of the no-op), noop-wall-s, noop-writes,
// first-requests, first-dryruns, first-writes, first-status-writes, noop-requests, apiserver-cpu-s (first apply),
// cpu-s and rss-mb (the controller process: CPU over both applies, peak RSS). One run per
// controller (b.N is ignored: run it with -benchtime 1x); -bench 'FleetApply/plinth' runs
// Plinth's side alone, PLINTH_BINARY names the plinth binary to run (default: this tree's).
func BenchmarkFleetApply(b *testing.B) {
	env(b) // skips or fails as the suite does when the binaries are missing
	n := controlplane.BenchKnob(b, "PLINTH_BENCH_NODES", 1000, 1)
	qps := controlplane.BenchKnob(b, "PLINTH_BENCH_QPS", 50, 1)
	burst := controlplane.BenchKnob(b, "PLINTH_BENCH_BURST", 300, 1)
	fe := startFleetControlPlane(b, false)
	b.Logf("fleet: %d nodes, %d objects, client limits %d QPS burst %d (API Priority and Fairness off), load average %s",
		n, 2*n+1, qps, burst, controlplane.LoadAverage())
	runFleetPair(b, fe, n, []string{"--kube-api-qps=" + strconv.Itoa(qps), "--kube-api-burst=" + strconv.Itoa(burst)})
}

// BenchmarkFleetApplyDefaults is BenchmarkFleetApply as a cluster runs both controllers: a
// default kube-apiserver (API Priority and Fairness on) and neither --kube-api-qps nor
// --kube-api-burst given. Both then drop their client-side limiter (Flux's
// runtime/client.GetConfigOrDie, Plinth's internal/clientlimit), so the API server paces
// them. PLINTH_BENCH_NODES as there; same metrics.
func BenchmarkFleetApplyDefaults(b *testing.B) {
	env(b)
	n := controlplane.BenchKnob(b, "PLINTH_BENCH_NODES", 1000, 1)
	fe := startFleetControlPlane(b, true)
	b.Logf("fleet: %d nodes, %d objects, no limit flags (API Priority and Fairness on), load average %s", n, 2*n+1, controlplane.LoadAverage())
	runFleetPair(b, fe, n, nil)
}

// runFleetPair renders the fleet of n Nodes and has kustomize-controller, then Plinth,
// apply it, both started with limits (extra flags).
func runFleetPair(b *testing.B, fe *fleetEnv, n int, limits []string) {
	createFleetNodes(b, fe.c, n)
	pool, proto, pl := fleetPolicies()
	objects := renderFleet(b, fe.c, pool, proto, pl)

	b.Run("kustomize-controller", func(b *testing.B) {
		b.ReportAllocs()
		runFluxFleet(b, fe, objects, limits, n)
	})
	b.Run("plinth", func(b *testing.B) {
		b.ReportAllocs()
		runPlinthFleet(b, fe, pool, proto, pl, limits, n, buildPlinth(b))
	})
	// A/B of Plinth's own changes beside the same peer run: each binary of
	// PLINTH_BENCH_AB_BINARIES (comma-separated paths) runs after, in turn, as "plinth-ab<i>".
	for i, bin := range strings.Split(os.Getenv("PLINTH_BENCH_AB_BINARIES"), ",") {
		if bin == "" {
			continue
		}
		b.Run(fmt.Sprintf("plinth-ab%d", i), func(b *testing.B) {
			b.ReportAllocs()
			b.Logf("binary %s", bin)
			runPlinthFleet(b, fe, pool, proto, pl, limits, n, bin)
		})
	}
}

// fleetEnv is the benchmark's own control plane and its admin clients.
type fleetEnv struct {
	cp *controlplane.ControlPlane
	c  client.Client
	cs kubernetes.Interface
}

// startFleetControlPlane starts etcd and kube-apiserver, with API Priority and Fairness on
// (its default) or off, with Plinth's CRDs installed, stopped when the benchmark ends; it
// fails b if the API server's answer does not say what was asked (with the headers present,
// the peer runs without a client-side limiter whatever its flags say).
func startFleetControlPlane(b *testing.B, apf bool) *fleetEnv {
	sctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var args []string
	if !apf {
		args = []string{"--enable-priority-and-fairness=false"}
	}
	cp, err := controlplane.Start(sctx, controlplane.Options{APIServerArgs: args})
	if err != nil {
		b.Fatalf("fleet control plane: %v", err)
	}
	b.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			b.Errorf("stop fleet control plane: %v", err)
		}
	})
	c, err := prepare(cp)
	if err != nil {
		b.Fatalf("fleet control plane: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		b.Fatal(err)
	}
	on, err := flowcontrol.IsEnabled(ctx, cp.Admin.Config) // the probe of Flux and internal/clientlimit
	if err != nil {
		b.Fatal(err)
	}
	if on != apf {
		b.Fatalf("kube-apiserver answers with API Priority and Fairness headers: %v, want %v (Flux's controllers and Plinth ignore their default limits when present)", on, apf)
	}
	return &fleetEnv{cp: cp, c: c, cs: cs}
}

const (
	binSourceController    = "flux-source-controller"
	binKustomizeController = "flux-kustomize-controller"
	fluxNamespace          = "flux-system"
)

// vetFleetPolicies judges the one pool, protocol and placement as the controller does (the
// schema's vet) and fails tb when they do not pass.
func vetFleetPolicies(tb testing.TB, p *policyv1.StoragePool, proto *policyv1.Protocol, pl *policyv1.Placement) *vet.Policies {
	tb.Helper()
	v, err := vet.NewVetter()
	if err != nil {
		tb.Fatal(err)
	}
	pol, problems := policy.VetObjects(v, []policyv1.StoragePool{*p}, []policyv1.Protocol{*proto}, []policyv1.Placement{*pl})
	if len(problems) > 0 {
		tb.Fatalf("policies do not vet: %v", problems)
	}
	return pol
}

func fleetPolicies() (*policyv1.StoragePool, *policyv1.Protocol, *policyv1.Placement) {
	p := pool("fleet", "fleet", "")
	proto := &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: "fleet-nvme"},
		Spec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "10.20.0.0/16"}}}
	pl := placement("fleet", "fleet", "fleet-nvme", "fleet")
	return p, proto, pl
}

// createFleetNodes creates n Nodes labelled for the fleet pool (standing in for kubelet, which
// registers Nodes); Nodes left by an earlier run are kept.
func createFleetNodes(b *testing.B, c client.Client, n int) {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("fleet-%05d", i), Labels: map[string]string{"plinth.dev/storage": "fleet"}}}
				if err := c.Create(ctx, nd); err != nil && !apierrors.IsAlreadyExists(err) {
					errs <- err
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

// renderFleet renders the policies for the fleet's Nodes exactly as the controller does (vetted
// with the embedded schema, defaults filled in) and returns the YAML stream `plinth render`
// prints.
func renderFleet(b *testing.B, c client.Client, p *policyv1.StoragePool, proto *policyv1.Protocol, pl *policyv1.Placement) []byte {
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes, client.MatchingLabels{"plinth.dev/storage": "fleet"}); err != nil {
		b.Fatal(err)
	}
	pol := vetFleetPolicies(b, p, proto, pl)
	out, err := render.Render(render.Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements, Nodes: nodes.Items})
	if err != nil {
		b.Fatal(err)
	}
	y, err := out.YAML()
	if err != nil {
		b.Fatal(err)
	}
	return y
}

// apiCounts are the API server's requests for the applied kinds (fleetKinds): reads, dry-runs
// and writes of the objects themselves, and writes of their status subresource (counted apart,
// not in total).
type apiCounts struct{ reads, dryRuns, writes, statusWrites float64 }

func (a apiCounts) sub(o apiCounts) apiCounts {
	return apiCounts{a.reads - o.reads, a.dryRuns - o.dryRuns, a.writes - o.writes, a.statusWrites - o.statusWrites}
}
func (a apiCounts) total() float64 { return a.reads + a.dryRuns + a.writes }

var (
	metricLine = regexp.MustCompile(`^(\w+)\{(.*)\} (\S+)$`)
	labelPair  = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// promSamples returns name's samples in a Prometheus text exposition as (labels, value).
func promSamples(text []byte, name string) []struct {
	labels map[string]string
	value  float64
} {
	var out []struct {
		labels map[string]string
		value  float64
	}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		m := metricLine.FindStringSubmatch(sc.Text())
		if m == nil || m[1] != name {
			continue
		}
		l := map[string]string{}
		for _, kv := range labelPair.FindAllStringSubmatch(m[2], -1) {
			l[kv[1]] = kv[2]
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		out = append(out, struct {
			labels map[string]string
			value  float64
		}{l, v})
	}
	return out
}

// apiServerCounts reads apiserver_request_total from the API server's /metrics.
func apiServerCounts(b *testing.B, cs kubernetes.Interface) apiCounts {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("API server /metrics: %v", err)
	}
	var a apiCounts
	for _, s := range promSamples(raw, "apiserver_request_total") {
		if !fleetKinds[s.labels["resource"]] {
			continue
		}
		read := s.labels["verb"] == "GET" || s.labels["verb"] == "LIST" || s.labels["verb"] == "WATCH"
		switch {
		case s.labels["subresource"] == "status" && !read && s.labels["dry_run"] == "":
			a.statusWrites += s.value
		case s.labels["subresource"] != "":
		case read:
			a.reads += s.value
		case s.labels["dry_run"] != "":
			a.dryRuns += s.value
		default:
			a.writes += s.value
		}
	}
	return a
}

// reconcileSeconds is the sum and count of controller_runtime_reconcile_time_seconds of
// controller name, read from a controller's metrics endpoint.
func reconcileSeconds(b *testing.B, url, name string) (sum, count float64) {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatalf("metrics %s: %v", url, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		b.Fatal(err)
	}
	for _, s := range promSamples(buf.Bytes(), "controller_runtime_reconcile_time_seconds_sum") {
		if s.labels["controller"] == name {
			sum = s.value
		}
	}
	for _, s := range promSamples(buf.Bytes(), "controller_runtime_reconcile_time_seconds_count") {
		if s.labels["controller"] == name {
			count = s.value
		}
	}
	return sum, count
}

// procStat is a process's CPU time and peak RSS (VmHWM) in MiB.
func procStat(b *testing.B, pid int) (cpu time.Duration, hwmMiB float64) {
	return controlplane.ProcCPU(b, pid), controlplane.ProcStatusMiB(b, pid, "VmHWM")
}

// fleetProfileSeconds is the length of the API server's CPU profile of a first apply
// ($PLINTH_BENCH_OUT/fleet-<controller>-apiserver.pprof): shorter than Plinth's first apply at
// 1,000 nodes, so that its profile samples applies only.
const fleetProfileSeconds = 4

func apiServerPID(b *testing.B, cp *controlplane.ControlPlane) int {
	for _, p := range cp.Processes() {
		if p.Name == controlplane.BinKubeAPIServer {
			return p.PID()
		}
	}
	b.Fatal("no kube-apiserver process")
	return 0
}

// poll calls f every 20 ms until it returns nil, failing b after timeout.
func poll(b *testing.B, timeout time.Duration, what string, f func() error) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fleetObjects counts the Stores, Agents and StorageClasses named "fleet" on the benchmark's
// API server (it holds nothing else of those kinds).
func fleetObjects(c client.Client) (stores, agents, classes int, err error) {
	var sl storev1.StoreList
	if err := c.List(ctx, &sl); err != nil {
		return 0, 0, 0, err
	}
	var al storev1.AgentList
	if err := c.List(ctx, &al); err != nil {
		return 0, 0, 0, err
	}
	var sc storagev1.StorageClass
	switch err := c.Get(ctx, types.NamespacedName{Name: "fleet"}, &sc); {
	case err == nil:
		classes = 1
	case !apierrors.IsNotFound(err):
		return 0, 0, 0, err
	}
	return len(sl.Items), len(al.Items), classes, nil
}

// fleetApplied fails b unless the n Stores, n Agents and the StorageClass exist.
func fleetApplied(b *testing.B, c client.Client, n int) {
	s, a, sc, err := fleetObjects(c)
	if err != nil {
		b.Fatal(err)
	}
	if s != n || a != n || sc != 1 {
		b.Fatalf("after the first apply: %d Stores, %d Agents, %d StorageClasses; want %d, %d, 1", s, a, sc, n, n)
	}
}

// fleetGone waits until no Store, Agent or StorageClass of the fleet is left.
func fleetGone(b *testing.B, c client.Client) {
	poll(b, 15*time.Minute, "fleet objects pruned", func() error {
		s, a, sc, err := fleetObjects(c)
		if err != nil {
			return err
		}
		if s+a+sc > 0 {
			return fmt.Errorf("%d Stores, %d Agents, %d StorageClasses left", s, a, sc)
		}
		return nil
	})
}

// fleetRun is what one controller's run measured.
type fleetRun struct {
	first, noopWall, noopReconcile time.Duration
	firstReq, noopReq              apiCounts
	apiCPU, cpu                    time.Duration
	rssMiB                         float64
}

func (r fleetRun) report(b *testing.B, n int) {
	b.ReportMetric(r.first.Seconds(), "first-apply-s")
	b.ReportMetric(r.noopReconcile.Seconds(), "noop-s")
	b.ReportMetric(r.noopWall.Seconds(), "noop-wall-s")
	b.ReportMetric(r.noopReq.writes, "noop-writes")
	b.ReportMetric(r.noopReq.total(), "noop-requests")
	b.ReportMetric(r.firstReq.total(), "first-requests")
	b.ReportMetric(r.firstReq.dryRuns, "first-dryruns")
	b.ReportMetric(r.firstReq.writes, "first-writes")
	b.ReportMetric(r.firstReq.statusWrites, "first-status-writes")
	b.ReportMetric(r.firstReq.reads, "first-reads")
	b.ReportMetric(r.apiCPU.Seconds(), "apiserver-cpu-s")
	b.ReportMetric(r.cpu.Seconds(), "cpu-s")
	b.ReportMetric(r.rssMiB, "rss-mb")
	b.Logf("%d objects: first apply %s (requests for the applied kinds: %.0f reads, %.0f dry-runs, %.0f writes, %.0f status writes; API server CPU %s); "+
		"no-op reconcile %s (wall %s; %.0f reads, %.0f dry-runs, %.0f writes); controller CPU %s, peak RSS %.0f MiB; load average %s",
		2*n+1, r.first.Round(time.Millisecond), r.firstReq.reads, r.firstReq.dryRuns, r.firstReq.writes, r.firstReq.statusWrites, r.apiCPU.Round(time.Millisecond),
		r.noopReconcile.Round(time.Millisecond), r.noopWall.Round(time.Millisecond), r.noopReq.reads, r.noopReq.dryRuns, r.noopReq.writes,
		r.cpu.Round(time.Millisecond), r.rssMiB, controlplane.LoadAverage())
}

func freePorts(b *testing.B, n int) []int {
	out := make([]int, n)
	for i := range out {
		p, err := controlplane.FreePort()
		if err != nil {
			b.Fatal(err)
		}
		out[i] = p
	}
	return out
}

// runFluxFleet: source-controller and kustomize-controller started for this run, the rendered
// objects in Git, a Kustomization created (first apply), a reconcile requested with nothing
// changed (no-op), then the Kustomization deleted and its objects pruned.
func runFluxFleet(b *testing.B, fe *fleetEnv, objects []byte, limits []string, n int) {
	controlplane.RequireBinaries(b, binSourceController, binKustomizeController)
	c, cs := fe.c, fe.cs
	bin, err := controlplane.TestBinDir()
	if err != nil {
		b.Fatal(err)
	}
	crds, err := filepath.Glob(filepath.Join(bin, "crds", "flux", "*.yaml"))
	if err != nil || len(crds) == 0 {
		b.Fatalf("no Flux CRDs under %s/crds/flux (make testbin): %v", bin, err)
	}
	if _, err := envtest.InstallCRDs(fe.cp.Admin.Config, envtest.CRDInstallOptions{Paths: crds, ErrorIfPathMissing: true}); err != nil {
		b.Fatalf("install Flux CRDs: %v", err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fluxNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	gitURL, stopGit, err := devenv.ServeGit(b.TempDir(), map[string][]byte{"fleet/objects.yaml": objects})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stopGit)

	ports := freePorts(b, 5)
	storage := fmt.Sprintf("127.0.0.1:%d", ports[0])
	kubeconfig := []string{"KUBECONFIG=" + fe.cp.Admin.Kubeconfig} // Flux's controllers take no --kubeconfig flag
	sc, err := fe.cp.StartProcess(ctx, controlplane.ProcessSpec{Name: "fleet-" + binSourceController, Binary: binSourceController,
		Args: append([]string{fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[1]), fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[2]),
			"--storage-path=" + b.TempDir(), "--storage-addr=" + storage, "--storage-adv-addr=" + storage,
			"--enable-leader-election=false", "--log-level=info"}, limits...),
		Env: kubeconfig, Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[2]), nil)})
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Stop() //nolint:errcheck
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[3])
	kc, err := fe.cp.StartProcess(ctx, controlplane.ProcessSpec{Name: "fleet-" + binKustomizeController, Binary: binKustomizeController,
		Args: append([]string{fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[3]), fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[4]),
			"--enable-leader-election=false", "--log-level=info"}, limits...),
		Env: kubeconfig, Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[4]), nil)})
	if err != nil {
		b.Fatal(err)
	}
	defer kc.Stop() //nolint:errcheck

	repo := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
		"metadata": map[string]any{"name": "fleet", "namespace": fluxNamespace},
		"spec":     map[string]any{"interval": "1h", "url": gitURL, "ref": map[string]any{"branch": "main"}},
	}}
	if err := c.Create(ctx, repo); err != nil {
		b.Fatal(err)
	}
	defer c.Delete(ctx, repo) //nolint:errcheck
	poll(b, 5*time.Minute, "GitRepository fleet Ready", func() error { return fluxReady(c, repo, "artifact") })

	ks := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
		"metadata": map[string]any{"name": "fleet", "namespace": fluxNamespace},
		"spec": map[string]any{"interval": "1h", "path": "./fleet", "prune": true, "timeout": "20m",
			"sourceRef": map[string]any{"kind": "GitRepository", "name": "fleet"}},
	}}
	api := apiServerPID(b, fe.cp)
	var r fleetRun
	cpu0, _ := procStat(b, kc.PID())
	api0, _ := procStat(b, api)
	req0 := apiServerCounts(b, cs)
	b.ResetTimer()
	start := time.Now()
	if err := c.Create(ctx, ks); err != nil {
		b.Fatal(err)
	}
	profiled := controlplane.ProfileAPIServer(b, cs, "fleet-kustomize-controller", fleetProfileSeconds)
	poll(b, 30*time.Minute, "Kustomization fleet applied", func() error { return fluxReady(c, ks, "lastAppliedRevision") })
	r.first = time.Since(start)
	b.StopTimer()
	profiled()
	api1, _ := procStat(b, api)
	r.apiCPU = api1 - api0
	r.firstReq = apiServerCounts(b, cs).sub(req0)
	fleetApplied(b, c, n)
	if entries, _, _ := unstructured.NestedSlice(ks.Object, "status", "inventory", "entries"); len(entries) != 2*n+1 {
		b.Fatalf("Kustomization fleet's inventory holds %d objects; want %d", len(entries), 2*n+1)
	}

	sum0, count0 := reconcileSeconds(b, metricsURL, "kustomization")
	req0 = apiServerCounts(b, cs)
	token := strconv.FormatInt(time.Now().UnixNano(), 10)
	start = time.Now()
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"reconcile.fluxcd.io/requestedAt":%q}}}`, token)
	if err := c.Patch(ctx, ks, client.RawPatch(types.MergePatchType, patch)); err != nil {
		b.Fatal(err)
	}
	poll(b, 30*time.Minute, "Kustomization fleet re-applied", func() error {
		if err := fluxReady(c, ks, "lastAppliedRevision"); err != nil {
			return err
		}
		if h, _, _ := unstructured.NestedString(ks.Object, "status", "lastHandledReconcileAt"); h != token {
			return fmt.Errorf("lastHandledReconcileAt %q", h)
		}
		return nil
	})
	r.noopWall = time.Since(start)
	r.noopReq = apiServerCounts(b, cs).sub(req0)
	poll(b, time.Minute, "reconcile time recorded", func() error {
		sum, count := reconcileSeconds(b, metricsURL, "kustomization")
		if count == count0 {
			return fmt.Errorf("no reconcile finished")
		}
		r.noopReconcile = time.Duration((sum - sum0) / (count - count0) * float64(time.Second))
		return nil
	})
	cpu1, hwm := procStat(b, kc.PID())
	r.cpu, r.rssMiB = cpu1-cpu0, hwm
	r.report(b, n)

	if err := c.Delete(ctx, ks); err != nil {
		b.Fatal(err)
	}
	fleetGone(b, c)
}

// fluxReady returns nil when u (re-read) is Ready=True for its generation and has status.field.
func fluxReady(c client.Client, u *unstructured.Unstructured, field string) error {
	if err := c.Get(ctx, client.ObjectKeyFromObject(u), u); err != nil {
		return err
	}
	if _, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "status", field); !ok {
		return fmt.Errorf("no status.%s", field)
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, cd := range conds {
		m, _ := cd.(map[string]any)
		if m["type"] == "Ready" {
			og, _ := m["observedGeneration"].(int64)
			if m["status"] == "True" && og == u.GetGeneration() {
				return nil
			}
			return fmt.Errorf("Ready=%v %v: %v", m["status"], m["reason"], m["message"])
		}
	}
	return fmt.Errorf("no Ready condition")
}

// runPlinthFleet: `plinth controller` started for this run, the policy objects created (first
// apply), a reconcile with nothing changed (an annotation on the StoragePool: the controller
// reconciles on annotation changes; nothing it renders changes), then the policies deleted
// and the objects pruned.
func runPlinthFleet(b *testing.B, fe *fleetEnv, p *policyv1.StoragePool, proto *policyv1.Protocol, pl *policyv1.Placement, limits []string, n int, plinth string) {
	c, cs := fe.c, fe.cs
	ports := freePorts(b, 2)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0])
	pc, err := fe.cp.StartProcess(ctx, controlplane.ProcessSpec{Name: "fleet-plinth-controller", Binary: plinth,
		Args: append([]string{"controller", "--kubeconfig=" + fe.cp.Admin.Kubeconfig, "--namespace=" + namespace,
			fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[0]), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[1]),
			"--resync-interval=0", "--log-format=console"}, limits...),
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), nil)})
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Stop() //nolint:errcheck

	api := apiServerPID(b, fe.cp)
	var r fleetRun
	cpu0, _ := procStat(b, pc.PID())
	api0, _ := procStat(b, api)
	req0 := apiServerCounts(b, cs)
	p, proto, pl = p.DeepCopy(), proto.DeepCopy(), pl.DeepCopy()
	b.ResetTimer()
	start := time.Now()
	profiled := controlplane.ProfileAPIServer(b, cs, "fleet-"+path.Base(b.Name()), fleetProfileSeconds) // fleet-plinth, fleet-plinth-ab<i>
	createPoliciesReady(b, c, p, proto, pl)
	r.first = time.Since(start)
	b.StopTimer()
	profiled()
	api1, _ := procStat(b, api)
	r.apiCPU = api1 - api0
	r.firstReq = apiServerCounts(b, cs).sub(req0)
	fleetApplied(b, c, n)

	// Let the reconciles the controller's own status writes cause pass first.
	var sum0, count0 float64
	poll(b, 5*time.Minute, "controller quiet", func() error {
		s, cnt := reconcileSeconds(b, metricsURL, "policy")
		if cnt != count0 {
			sum0, count0 = s, cnt
			time.Sleep(time.Second)
			return fmt.Errorf("still reconciling")
		}
		return nil
	})
	req0 = apiServerCounts(b, cs)
	start = time.Now()
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"bench.plinth.dev/noop":%q}}}`, strconv.FormatInt(time.Now().UnixNano(), 10))
	if err := c.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch)); err != nil {
		b.Fatal(err)
	}
	poll(b, 30*time.Minute, "no-op reconcile", func() error {
		sum, count := reconcileSeconds(b, metricsURL, "policy")
		if count == count0 {
			return fmt.Errorf("no reconcile finished")
		}
		r.noopWall = time.Since(start)
		r.noopReconcile = time.Duration((sum - sum0) / (count - count0) * float64(time.Second))
		return nil
	})
	r.noopReq = apiServerCounts(b, cs).sub(req0)
	cpu1, hwm := procStat(b, pc.PID())
	r.cpu, r.rssMiB = cpu1-cpu0, hwm
	r.report(b, n)

	for _, o := range []client.Object{pl, p, proto} {
		if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			b.Fatal(err)
		}
	}
	fleetGone(b, c)
}

// policyReady returns nil when o (re-read) is Ready=True for its generation.
func policyReady(c client.Client, o client.Object) error {
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
		return err
	}
	var conds []metav1.Condition
	switch v := o.(type) {
	case *policyv1.StoragePool:
		conds = v.Status.Conditions
	case *policyv1.Placement:
		conds = v.Status.Conditions
	}
	for _, cd := range conds {
		if cd.Type == "Ready" {
			if cd.Status == metav1.ConditionTrue && cd.ObservedGeneration == o.GetGeneration() {
				return nil
			}
			return fmt.Errorf("%s Ready=%s %s: %s", o.GetName(), cd.Status, cd.Reason, cd.Message)
		}
	}
	return fmt.Errorf("%s: no Ready condition", o.GetName())
}

var builtPlinth struct {
	once sync.Once
	path string
	err  error
}

// buildPlinth returns $PLINTH_BINARY, or builds ./cmd/plinth of this tree once.
func buildPlinth(b *testing.B) string {
	if p := os.Getenv("PLINTH_BINARY"); p != "" {
		return p
	}
	builtPlinth.once.Do(func() {
		root, err := controlplane.ModuleRoot()
		if err != nil {
			builtPlinth.err = err
			return
		}
		dir, err := os.MkdirTemp("", "plinth-bin-")
		if err != nil {
			builtPlinth.err = err
			return
		}
		builtPlinth.path = filepath.Join(dir, "plinth")
		cmd := exec.Command("go", "build", "-o", builtPlinth.path, "./cmd/plinth")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			builtPlinth.err = fmt.Errorf("go build ./cmd/plinth: %v\n%s", err, out)
		}
	})
	if builtPlinth.err != nil {
		b.Fatal(builtPlinth.err)
	}
	return builtPlinth.path
}

// createPoliciesReady creates the fleet's three policy objects and waits until the pool and
// the placement are Ready (applied) for their generation.
func createPoliciesReady(b *testing.B, c client.Client, p *policyv1.StoragePool, proto *policyv1.Protocol, pl *policyv1.Placement) {
	for _, o := range []client.Object{p, proto, pl} {
		if err := c.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	poll(b, 30*time.Minute, "policies applied", func() error {
		for _, o := range []client.Object{p, pl} {
			if err := policyReady(c, o); err != nil {
				return err
			}
		}
		return nil
	})
}
