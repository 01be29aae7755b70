package csi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/plinth-storage/plinth/agents/agent"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// The PVC burst harness: N PVCs created at once against one CSI driver served on a unix
// socket, with the real csi-provisioner in front of it (identical flags for every driver) on
// the real API server and kube-controller-manager of the shared control plane. Between the
// provisioner and the driver sits a transparent gRPC relay that times every call: CreateVolume
// "as the sidecar sees it" is that relay's sample. The drivers measured in one run:
//   - plinth: `plinth csi --mode controller` with the real agent and the file backend on this
//     host's loop devices (fileBackendNode);
//   - floor: noopController, a CSI controller that does no storage work at all (answers
//     CreateVolume and DeleteVolume at once) — the floor of what the sidecars, the API server
//     and kube-controller-manager cost;
//   - any other driver named by PLINTH_BENCH_CSI_CMD (a command line; "{socket}" is replaced by
//     the socket path), PLINTH_BENCH_CSI_DRIVER (its driver name) and PLINTH_BENCH_CSI_PARAMS
//     (StorageClass parameters, k=v,k=v).

// burstDriver is one CSI driver under test.
type burstDriver struct {
	row string // name in the results
	// tag ("" in the first round, "-r<k>" after) makes the round's names its own: namespace,
	// StorageClass, provisioner process, raw-sample and profile files.
	tag    string
	driver string // CSI driver name (the provisioner's)
	params map[string]string
	// idle names the control-plane process whose CPU is measured while it holds the burst's
	// volumes (the agent); empty: none.
	idle string
	// start serves the driver and returns its socket.
	start func(b *testing.B) string
	// pid is the driver's process once started, for its peak RSS; nil: the driver runs in
	// the benchmark's own process (the floor), whose memory says nothing of a driver.
	pid func(b *testing.B) int
	// pprof names the driver's processes serving Go's /debug/pprof (component → host:port),
	// whose heap profiles are kept while they hold the burst's volumes.
	pprof map[string]string
}

// BenchmarkPVCBurst: PLINTH_BENCH_PVCS (default 300) PVCs created at once per driver.
// Reports per driver: CreateVolume p50/p99 as the provisioner sees it (createvolume-*),
// PVC → Bound p50/p99 (bound-*), bound-vol/s (N over first create → last Bound), DeleteVolume
// p50/p99 and delete-vol/s (N over first PVC delete → last PV gone), and the API server's CPU
// per volume (apiserver-cpu-ms/vol, /proc of its process, create and delete together), the
// peak RSS of the driver's CSI controller process through the whole burst, create and delete
// (csi-rss-mib: VmHWM once the last PV is gone; Plinth and a peer, not the in-process floor),
// and for Plinth the peak RSS of the agent holding the N volumes (agent-rss-mb). Raw
// samples go to $PLINTH_BENCH_OUT/burst-<driver>[-r<k>]-<metric>.txt when set. One run per
// driver and round (PLINTH_BENCH_BURST_ROUNDS, default 1; b.N is ignored: run it with
// -benchtime 1x).
func BenchmarkPVCBurst(b *testing.B) {
	n := 300
	if v := os.Getenv("PLINTH_BENCH_PVCS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("PLINTH_BENCH_PVCS=%q: want a positive integer", v)
		}
	}
	// The API server's CPU per volume moves by ±10 % from one run of the same driver to the
	// next on a 2-core machine: PLINTH_BENCH_BURST_ROUNDS runs every driver that many times,
	// in ABBA order (the second round in reverse, and so on), each round under a name of its
	// own (go test names the repeats "floor#01", …); hack/benchtable reports the medians.
	rounds := controlplane.BenchKnob(b, "PLINTH_BENCH_BURST_ROUNDS", 1, 1)
	controlplane.RequireBinaries(b, controlplane.BinCSIProvisioner)
	cp := sharedControlPlane(b)
	for r := range rounds {
		drivers := burstDrivers(cp, r)
		order := make([]int, len(drivers)) // the drivers stay where they are: start fills in their params by index
		for i := range order {
			order[i] = i
		}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			d := &drivers[i]
			b.Run(d.row, func(b *testing.B) {
				b.ReportAllocs()
				runBurst(b, cp, d, n)
			})
		}
	}
}

// burstDrivers returns the drivers of round r (0 first). Each round has its own namespace,
// StorageClass, provisioner and, for Plinth, its own node, pool and agent: a round leaves
// nothing the next one reuses.
func burstDrivers(cp *controlplane.ControlPlane, r int) []burstDriver {
	tag := ""
	if r > 0 {
		tag = fmt.Sprintf("-r%d", r)
	}
	drivers := []burstDriver{
		{row: "floor", tag: tag, driver: "floor.noop.csi.plinth.dev", start: startNoopController},
		{row: "plinth", tag: tag, driver: policyv1.DriverName, idle: "plinth-agent-burst" + tag,
			pid: func(b *testing.B) int { return processPID(b, cp, "plinth-csi-controller") }},
	}
	// start fills in the driver's params and pprof addresses, by index: drivers may move below
	drivers[1].start = plinthStart(cp, func() *burstDriver { return &drivers[1] }, "", "burst"+tag)
	// another plinth binary beside this tree's, in the same run and rounds: an A/B of a change
	if base := os.Getenv("PLINTH_BENCH_BURST_BASE"); base != "" {
		d := burstDriver{row: "plinth-base", tag: tag, driver: policyv1.DriverName, idle: "plinth-agent-burstbase" + tag}
		d.pid = func(b *testing.B) int { return processPID(b, cp, "plinth-csi-controller") }
		i := len(drivers)
		d.start = plinthStart(cp, func() *burstDriver { return &drivers[i] }, base, "burstbase"+tag)
		drivers = append(drivers, d)
	}
	if cmd := os.Getenv("PLINTH_BENCH_CSI_CMD"); cmd != "" {
		d := burstDriver{row: "peer", tag: tag, driver: os.Getenv("PLINTH_BENCH_CSI_DRIVER"), params: map[string]string{}}
		for _, kv := range strings.Split(os.Getenv("PLINTH_BENCH_CSI_PARAMS"), ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				d.params[k] = v
			}
		}
		var pid int
		d.start = func(b *testing.B) string {
			sock, p := startDriverCommand(b, cmd)
			pid = p
			// a driver with topology (csi-driver-host-path: topology.hostpath.csi/node) gets a
			// node the provisioner can offer, named as its --nodeid
			if key := os.Getenv("PLINTH_BENCH_CSI_TOPOLOGY_KEY"); key != "" {
				nodeTopology(b, cp, os.Getenv("PLINTH_BENCH_CSI_NODE"), d.driver, key)
			}
			return sock
		}
		d.pid = func(*testing.B) int { return pid }
		drivers = append(drivers, d)
	}
	return drivers
}

// plinthStart returns the start of Plinth's driver (driver() when it starts): the agent of node <name>-node (at the
// default refresh interval) and `plinth csi --mode controller`, both serving /debug/pprof, from
// the binary plinth ("": this tree's).
func plinthStart(cp *controlplane.ControlPlane, driver func() *burstDriver, plinth, name string) func(b *testing.B) string {
	return func(b *testing.B) string {
		d := driver()
		bin := plinth
		if bin == "" {
			bin = buildPlinth(b, "")
		}
		d.pprof = map[string]string{"agent": freeAddr(b), "csi": freeAddr(b)}
		// the agent as a cluster runs it: its heartbeats and Store refreshes at the default
		// interval count in the API server's CPU per volume, as they would in production
		d.params = fileBackendNodeRefresh(b, cp, bin, name, agent.DefaultRefreshInterval, "--pprof-bind-address", d.pprof["agent"])
		burstNodeTopology(b, cp, name+"-node")
		return startCSIProcess(b, cp, bin, "controller", "", "--pprof-address", d.pprof["csi"])
	}
}

// burstProfileSeconds is the length of the API server's CPU profiles from the first create
// ($PLINTH_BENCH_OUT/burst-<driver>-apiserver.pprof): inside the create burst, which
// kube-controller-manager's binding paces at ~4 volumes/s (75 s for 300); and from the first
// delete (burst-<driver>-delete-apiserver.pprof).
const burstProfileSeconds = 30

func runBurst(b *testing.B, cp *controlplane.ControlPlane, d *burstDriver, n int) {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		b.Fatal(err)
	}
	sock := d.start(b)
	relay := startRelay(b, sock)
	name := d.row + d.tag
	ns, class := "burst-"+name, "burst-"+name
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	bind, reclaim := storagev1.VolumeBindingImmediate, corev1.PersistentVolumeReclaimDelete
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: d.driver,
		Parameters: d.params, VolumeBindingMode: &bind, ReclaimPolicy: &reclaim}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	// the same csi-provisioner flags for every driver (those of startSidecars)
	p, err := cp.StartProcess(ctx, controlplane.ProcessSpec{Name: "csi-provisioner-burst-" + name, Binary: controlplane.BinCSIProvisioner,
		Args: []string{"--csi-address=" + relay.sock, "--kubeconfig=" + cp.Admin.Kubeconfig, "--leader-election=false", "--timeout=60s", "--v=2",
			"--kube-api-qps=50", "--kube-api-burst=100", "--feature-gates=Topology=true", "--extra-create-metadata"},
		Env: []string{"NAMESPACE=" + ns}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Stop() //nolint:errcheck

	w := watchBurst(b, ctx, cs, ns, n)
	defer w.stop()

	api := apiServerPID(b, cp)
	cpu0 := controlplane.ProcCPU(b, api)
	req0 := apiRequests(b, cs)
	// the API server's CPU profile of the first burstProfileSeconds of the create burst
	profiled := controlplane.ProfileAPIServer(b, cs, "burst-"+name, burstProfileSeconds)
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
	size := resource.MustParse("64Mi")
	b.ResetTimer()
	first := time.Now()
	par(func(i int) {
		names[i] = fmt.Sprintf("pvc-%04d", i)
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: names[i], Namespace: ns}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}}}}
		started[i] = time.Now()
		if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			b.Error(err)
		}
	})
	burstWait(b, w.allBound, 30*time.Minute, "all PVCs Bound")
	w.mu.Lock()
	lat := make([]time.Duration, n)
	last := first
	for i, name := range names {
		lat[i] = w.boundAt[name].Sub(started[i])
		if w.boundAt[name].After(last) {
			last = w.boundAt[name]
		}
	}
	w.mu.Unlock()
	b.ReportMetric(float64(n)/last.Sub(first).Seconds(), "bound-vol/s")
	burstReport(b, name, "bound", lat)
	burstReport(b, name, "createvolume", relay.samples("/csi.v1.Controller/CreateVolume"))
	for component, addr := range d.pprof {
		saveHeap(b, name, component, addr)
	}
	if d.idle != "" {
		apiIdle, reqIdle := measureIdle(b, cp, cs, d.idle, api)
		cpu0 += apiIdle
		for k, v := range reqIdle {
			req0[k] += v
		}
	}

	// and of the first burstProfileSeconds of the delete burst (~10 volumes/s: 30 s for 300),
	// once the first has ended (a process runs one CPU profile at a time)
	profiled()
	profiledDelete := controlplane.ProfileAPIServer(b, cs, "burst-"+name+"-delete", burstProfileSeconds)
	defer profiledDelete()
	first = time.Now()
	par(func(i int) {
		if err := cs.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, names[i], metav1.DeleteOptions{}); err != nil {
			b.Error(err)
		}
	})
	burstWait(b, w.allGone, 30*time.Minute, "all PVs deleted")
	w.mu.Lock()
	last = first
	for _, t := range w.pvGone {
		if t.After(last) {
			last = t
		}
	}
	w.mu.Unlock()
	b.StopTimer()
	b.ReportMetric(float64(n)/last.Sub(first).Seconds(), "delete-vol/s")
	burstReport(b, name, "deletevolume", relay.samples("/csi.v1.Controller/DeleteVolume"))
	b.ReportMetric(float64((controlplane.ProcCPU(b, api)-cpu0).Milliseconds())/float64(n), "apiserver-cpu-ms/vol")
	reportRequests(b, name, req0, apiRequests(b, cs), n)
	if d.pid != nil {
		pid := d.pid(b)
		b.ReportMetric(controlplane.ProcStatusMiB(b, pid, "VmHWM"), "csi-rss-mib")
		// RssAnon: what the process holds itself (heap, stacks, runtime), without the pages of
		// its executable, which any other process mapping the same file shares
		b.ReportMetric(controlplane.ProcStatusMiB(b, pid, "RssAnon"), "csi-rss-anon-mib")
		b.ReportMetric(controlplane.ProcStatusMiB(b, pid, "RssFile"), "csi-rss-file-mib")
	}
}

// freeAddr is a loopback address with a free port, for a process to listen on.
func freeAddr(b *testing.B) string {
	port, err := controlplane.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// saveHeap keeps the heap profile of the process serving /debug/pprof at addr (after a
// garbage collection) as $PLINTH_BENCH_OUT/burst-<row>-<component>-heap.pprof; without
// PLINTH_BENCH_OUT it keeps nothing. Read it with `go tool pprof -sample_index=inuse_space`.
func saveHeap(b *testing.B, row, component, addr string) {
	out := os.Getenv("PLINTH_BENCH_OUT")
	if out == "" {
		return
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Get("http://" + addr + "/debug/pprof/heap?gc=1")
	if err != nil {
		b.Errorf("heap profile of %s: %v", component, err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Errorf("heap profile of %s: %s %v", component, resp.Status, err)
		return
	}
	if err := os.WriteFile(filepath.Join(out, "burst-"+row+"-"+component+"-heap.pprof"), data, 0o644); err != nil {
		b.Error(err)
	}
}

// burstWatch follows a burst: when each PVC of its namespace got Bound and when its PV was
// deleted, through watches that resume where they were when the API server ends them (a
// loaded server does). allBound and allGone close once all n have.
type burstWatch struct {
	mu                sync.Mutex
	boundAt, pvGone   map[string]time.Time // PVC name → time
	pvOf              map[string]string    // PV name → PVC name
	allBound, allGone chan struct{}
	stop              func()
}

// watchBurst starts the burstWatch of the n PVCs of namespace ns; stop ends it.
func watchBurst(b *testing.B, ctx context.Context, cs kubernetes.Interface, ns string, n int) *burstWatch {
	pvcList, err := cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	pvcW, err := watchtools.NewRetryWatcherWithContext(ctx, pvcList.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, o)
		}})
	if err != nil {
		b.Fatal(err)
	}
	pvList, err := cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		pvcW.Stop()
		b.Fatal(err)
	}
	pvW, err := watchtools.NewRetryWatcherWithContext(ctx, pvList.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().PersistentVolumes().Watch(ctx, o)
		}})
	if err != nil {
		pvcW.Stop()
		b.Fatal(err)
	}
	w := &burstWatch{boundAt: map[string]time.Time{}, pvGone: map[string]time.Time{}, pvOf: map[string]string{},
		allBound: make(chan struct{}), allGone: make(chan struct{}), stop: func() { pvcW.Stop(); pvW.Stop() }}
	go func() {
		for ev := range pvcW.ResultChan() {
			pvc, ok := ev.Object.(*corev1.PersistentVolumeClaim)
			if !ok || pvc.Status.Phase != corev1.ClaimBound {
				continue
			}
			w.mu.Lock()
			if _, seen := w.boundAt[pvc.Name]; !seen {
				w.boundAt[pvc.Name] = time.Now()
				w.pvOf[pvc.Spec.VolumeName] = pvc.Name
				if len(w.boundAt) == n {
					close(w.allBound)
				}
			}
			w.mu.Unlock()
		}
	}()
	go func() {
		for ev := range pvW.ResultChan() {
			pv, ok := ev.Object.(*corev1.PersistentVolume)
			if !ok || ev.Type != watch.Deleted {
				continue
			}
			w.mu.Lock()
			if claim, ours := w.pvOf[pv.Name]; ours {
				if _, seen := w.pvGone[claim]; !seen {
					w.pvGone[claim] = time.Now()
					if len(w.pvGone) == n {
						close(w.allGone)
					}
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// measureIdle measures the agent process holding the burst's volumes, nothing changing, over
// two of its refreshes (PLINTH_BENCH_IDLE_SECONDS overrides the window): its CPU
// (agent-idle-cpu-%) and peak RSS (agent-rss-mb). The window is the agent's measurement, not
// the burst's: it returns the API server's CPU and requests within it, which the per-volume
// figures leave out.
func measureIdle(b *testing.B, cp *controlplane.ControlPlane, cs kubernetes.Interface, process string, api int) (apiCPU time.Duration, reqs map[string]float64) {
	// the driver's node side holding n volumes, nothing changing
	window := 2*agent.DefaultRefreshInterval + 5*time.Second // two refreshes
	if v, err := strconv.Atoi(os.Getenv("PLINTH_BENCH_IDLE_SECONDS")); err == nil && v > 0 {
		window = time.Duration(v) * time.Second
	}
	pid := processPID(b, cp, process)
	c0, t0 := controlplane.ProcCPU(b, pid), time.Now()
	// the window is the agent's measurement, not the burst's: the API server's CPU and
	// requests within it are left out of runBurst's per-volume figures
	apiIdle0, reqIdle0 := controlplane.ProcCPU(b, api), apiRequests(b, cs)
	idle := time.NewTimer(window)
	<-idle.C
	b.ReportMetric(100*(controlplane.ProcCPU(b, pid)-c0).Seconds()/time.Since(t0).Seconds(), "agent-idle-cpu-%")
	apiCPU = controlplane.ProcCPU(b, api) - apiIdle0
	reqs = map[string]float64{}
	for k, v := range apiRequests(b, cs) {
		reqs[k] = v - reqIdle0[k]
	}
	// memory at scale: the agent holding the n volumes
	b.ReportMetric(controlplane.ProcStatusMiB(b, pid, "VmHWM"), "agent-rss-mb")
	b.ReportMetric(controlplane.ProcStatusMiB(b, pid, "RssAnon"), "agent-rss-anon-mib")
	b.ReportMetric(controlplane.ProcStatusMiB(b, pid, "RssFile"), "agent-rss-file-mib")
	return apiCPU, reqs
}

func burstWait(b *testing.B, ch <-chan struct{}, timeout time.Duration, what string) {
	b.Helper()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
		b.Fatalf("%s: not within %s", what, timeout)
	}
}

// burstReport reports p50 and p99 of ds and keeps the raw samples.
func burstReport(b *testing.B, row, name string, ds []time.Duration) {
	if len(ds) == 0 {
		b.Errorf("%s: no samples", name)
		return
	}
	reportQuantiles(b, name, ds)
	if out := os.Getenv("PLINTH_BENCH_OUT"); out != "" {
		var sb strings.Builder
		for _, d := range ds {
			fmt.Fprintf(&sb, "%.6f\n", d.Seconds())
		}
		if err := os.WriteFile(filepath.Join(out, "burst-"+row+"-"+name+".txt"), []byte(sb.String()), 0o644); err != nil {
			b.Error(err)
		}
	}
}

// burstNodeTopology labels the node with Plinth's topology key and registers the CSINode, as
// kubelet would after NodeGetInfo (see startSidecars).
func burstNodeTopology(b *testing.B, cp *controlplane.ControlPlane, node string) {
	nodeTopology(b, cp, node, policyv1.DriverName, policyv1.TopologyKeyNode)
}

// nodeTopology labels node (made when missing) with the topology key of driver and registers
// the CSINode naming the driver with that key, as kubelet would after NodeGetInfo; the CSINode
// goes at the end of b.
func nodeTopology(b *testing.B, cp *controlplane.ControlPlane, node, driver, key string) {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[key] = node
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := cs.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: driver, NodeID: node, TopologyKeys: []string{key}}}}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	// The provisioner offers the topology of every node whose CSINode names the driver: a
	// later round's volumes must not be offered this node, whose agent is gone with its round.
	b.Cleanup(func() {
		if err := cs.StorageV1().CSINodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			b.Errorf("delete CSINode %s: %v", node, err)
		}
	})
}

func apiServerPID(b *testing.B, cp *controlplane.ControlPlane) int {
	return processPID(b, cp, "apiserver")
}

// processPID is the pid of the control plane's running process whose name contains name,
// the last started when there are several (a process of an earlier round has exited).
func processPID(b *testing.B, cp *controlplane.ControlPlane, name string) int {
	ps := cp.Processes()
	for i := len(ps) - 1; i >= 0; i-- {
		if p := ps[i]; strings.Contains(p.Name, name) && !p.Exited() {
			return p.PID()
		}
	}
	b.Fatalf("no process %q in the control plane", name)
	return 0
}

// startDriverCommand runs the peer driver's command line with its socket; it returns the
// socket and the process id.
func startDriverCommand(b *testing.B, cmdline string) (string, int) {
	dir, err := os.MkdirTemp("", "burst-peer-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "csi.sock")
	args := strings.Fields(strings.ReplaceAll(cmdline, "{socket}", sock))
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", args[0], err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck
	deadline := time.Now().Add(time.Minute)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock, cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: no socket %s after a minute", args[0], sock)
		}
		time.Sleep(100 * time.Millisecond) // waiting on another process's socket: no event to watch
	}
}

// noopController is the floor: a CSI controller (identity + controller services) that does no
// storage work at all. It is a stand-in by design, named as such, never a driver.
type noopController struct {
	csispec.UnimplementedIdentityServer
	csispec.UnimplementedControllerServer
}

func (noopController) GetPluginInfo(context.Context, *csispec.GetPluginInfoRequest) (*csispec.GetPluginInfoResponse, error) {
	return &csispec.GetPluginInfoResponse{Name: "floor.noop.csi.plinth.dev", VendorVersion: "0"}, nil
}

func (noopController) GetPluginCapabilities(context.Context, *csispec.GetPluginCapabilitiesRequest) (*csispec.GetPluginCapabilitiesResponse, error) {
	return &csispec.GetPluginCapabilitiesResponse{Capabilities: []*csispec.PluginCapability{{Type: &csispec.PluginCapability_Service_{
		Service: &csispec.PluginCapability_Service{Type: csispec.PluginCapability_Service_CONTROLLER_SERVICE}}}}}, nil
}

func (noopController) Probe(context.Context, *csispec.ProbeRequest) (*csispec.ProbeResponse, error) {
	return &csispec.ProbeResponse{}, nil
}

func (noopController) ControllerGetCapabilities(context.Context, *csispec.ControllerGetCapabilitiesRequest) (*csispec.ControllerGetCapabilitiesResponse, error) {
	return &csispec.ControllerGetCapabilitiesResponse{Capabilities: []*csispec.ControllerServiceCapability{{Type: &csispec.ControllerServiceCapability_Rpc{
		Rpc: &csispec.ControllerServiceCapability_RPC{Type: csispec.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}}}}}, nil
}

func (noopController) CreateVolume(_ context.Context, req *csispec.CreateVolumeRequest) (*csispec.CreateVolumeResponse, error) {
	return &csispec.CreateVolumeResponse{Volume: &csispec.Volume{VolumeId: req.GetName(), CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}}, nil
}

func (noopController) DeleteVolume(context.Context, *csispec.DeleteVolumeRequest) (*csispec.DeleteVolumeResponse, error) {
	return &csispec.DeleteVolumeResponse{}, nil
}

func startNoopController(b *testing.B) string {
	return serveCSI(b, "burst-floor-", noopController{}, noopController{}, nil)
}

// serveCSI serves ids and ctrl (and node, when not nil) on a unix socket in a new temp folder
// whose name starts with prefix, until b ends; it returns the socket's path.
func serveCSI(b *testing.B, prefix string, ids csispec.IdentityServer, ctrl csispec.ControllerServer, node csispec.NodeServer) string {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		b.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	csispec.RegisterIdentityServer(srv, ids)
	csispec.RegisterControllerServer(srv, ctrl)
	if node != nil {
		csispec.RegisterNodeServer(srv, node)
	}
	go srv.Serve(l) //nolint:errcheck
	b.Cleanup(func() { srv.Stop(); os.RemoveAll(dir) })
	return sock
}

// rawCodec passes gRPC messages through as bytes (the relay never decodes them).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// relay is a transparent gRPC relay in front of a driver's socket that times each call.
type relay struct {
	sock string
	mu   sync.Mutex
	took map[string][]time.Duration
}

func (r *relay) samples(method string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.took[method]...)
}

func startRelay(b *testing.B, target string) *relay {
	conn, err := grpc.NewClient("unix://"+target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "burst-relay-")
	if err != nil {
		b.Fatal(err)
	}
	r := &relay{sock: filepath.Join(dir, "csi.sock"), took: map[string][]time.Duration{}}
	l, err := net.Listen("unix", r.sock)
	if err != nil {
		b.Fatal(err)
	}
	//nolint:staticcheck // the byte-passing codec is the point of a relay
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		var in, out []byte
		if err := stream.RecvMsg(&in); err != nil {
			return err
		}
		start := time.Now()
		err := conn.Invoke(stream.Context(), method, &in, &out, grpc.ForceCodec(rawCodec{})) //nolint:staticcheck
		took := time.Since(start)
		if err == nil {
			r.mu.Lock()
			r.took[method] = append(r.took[method], took)
			r.mu.Unlock()
			return stream.SendMsg(&out)
		}
		return err
	}))
	go srv.Serve(l) //nolint:errcheck
	b.Cleanup(func() { srv.Stop(); conn.Close(); os.RemoveAll(dir) })
	return r
}

// apiRequests reads the API server's apiserver_request_total from /metrics, summed by
// "verb resource[/subresource]" (all groups and scopes together), with the HTTP code appended
// when it is not 2xx ("PATCH volumestates/status 409").
func apiRequests(b *testing.B, cs kubernetes.Interface) map[string]float64 {
	b.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("API server /metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		b.Fatalf("parse API server /metrics: %v", err)
	}
	out := map[string]float64{}
	for _, m := range fams["apiserver_request_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		if c := l["code"]; c != "" && !strings.HasPrefix(c, "2") { // conflicts, not found, … apart
			key += " " + c
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out
}

// reportRequests reports the API requests per volume between two apiRequests readings: all of
// them (apiserver-req/vol) and the writes (apiserver-writes/vol: create, update, patch, delete),
// and logs each verb and resource's count per volume, most first.
func reportRequests(b *testing.B, driver string, before, after map[string]float64, n int) {
	b.Helper()
	type row struct {
		key string
		v   float64
	}
	var rows []row
	var all, writes float64
	for k, v := range after {
		d := v - before[k]
		if d <= 0 {
			continue
		}
		rows = append(rows, row{k, d})
		all += d
		switch verb, _, _ := strings.Cut(k, " "); verb {
		case "POST", "PUT", "PATCH", "DELETE", "CREATE", "UPDATE", "APPLY":
			writes += d
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		return rows[i].v > rows[j].v || rows[i].v == rows[j].v && rows[i].key < rows[j].key
	})
	var sb strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&sb, "\n  %-50s %7.0f  %6.2f/vol", r.key, r.v, r.v/float64(n))
	}
	b.Logf("API requests over create and delete of %d volumes:%s", n, sb.String())
	if out := os.Getenv("PLINTH_BENCH_OUT"); out != "" { // the benchmark log is cut at a few lines
		if err := os.WriteFile(filepath.Join(out, "burst-"+driver+"-requests.txt"), []byte(strings.TrimPrefix(sb.String(), "\n")+"\n"), 0o644); err != nil {
			b.Error(err)
		}
	}
	b.ReportMetric(all/float64(n), "apiserver-req/vol")
	b.ReportMetric(writes/float64(n), "apiserver-writes/vol")
}
