package observability

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/controlplane"
	"github.com/plinth-storage/plinth/test/prereq"
)

// Paths relative to this package's folder (go test runs here).
const (
	root           = "../.."
	dashboardsDir  = root + "/kustomize/monitoring/dashboards"
	serviceMonitor = root + "/kustomize/monitoring/servicemonitor.yaml"
	prometheusRule = root + "/kustomize/monitoring/prometheusrule.yaml"
)

// EnvPNGDir, when set, is the folder where the test draws each dashboard's main panels from
// the scenario's data (make dashboards-png writes docs/dashboards/).
const EnvPNGDir = "PLINTH_DASHBOARD_PNG_DIR"

// Cluster is the cluster label the harness puts on every target, as a fleet's Prometheus
// carries it as external label (seen through Thanos or Mimir).
const Cluster = "observability-test"

const (
	mi           = int64(1 << 20)
	poolBytes    = 256 * mi // the tmpfs under the file backend
	reserveBytes = 16 * mi  // allocatable = 240 Mi
	scrapeEvery  = 2 * time.Second
)

// expect says whether a panel has data once the scenario ran, and why not when it has none.
type expect struct {
	data bool
	why  string
}

func has() expect { return expect{data: true} }

func empty(why string) expect { return expect{why: why} }

// Every panel of every dashboard, by file and title: data means every target of the panel
// returns at least one series. The panels that are legitimately empty here say why.
var expectations = map[string]map[string]expect{
	"capacity.json": {
		"Available by pool":                             has(),
		"Provisioned by pool":                           has(),
		"Allocatable by pool":                           has(),
		"Capacity of each Store":                        has(),
		"Provisioned share of the provisionable room":   has(),
		"Thin pool data used":                           empty("LVM thin pools only; this host runs the file backend (the thin series are proven in the kernel guest's agent suite)"),
		"Thin pool metadata used":                       empty("LVM thin pools only, as above"),
		"Days until full, per Store (linear, last 6 h)": has(),
		"Days until full, per pool":                     has(),
		"Days until full, per failure domain":           has(),
		"Available by failure domain":                   has(),
		"Available in 7 days (predict_linear)":          has(),
		"Volumes by phase":                              has(),
		"Abnormal volumes":                              has(),
		"Failed volumes by Store":                       has(),
		"Provisioned to Block and Filesystem volumes":   has(),
		"Thin pool data allocated":                      empty("LVM thin pools only, as above"),
		"PVC used / capacity (kubelet)":                 empty("kubelet_volume_stats_* come from kubelets; no kubelet runs in this harness (add a Target with Job kubelet on a real-node cluster)"),
	},
	"fleet-drift.json": {
		"Fleet overview by cluster":    has(),
		"Drifted objects by kind":      has(),
		"Drifted now (api)":            has(),
		"Drifted now (kernel)":         has(),
		"Policies not Ready":           has(),
		"Stalled policies":             has(),
		"Policy objects not Ready":     has(),
		"Fencing rejections by reason": has(),
		"Reconcile errors by kind":     has(),
		"Reconcile duration p50 / p99": has(),
		"Agent heartbeat age":          has(),
	},
	"provisioning.json": {
		"CreateVolume latency p50 / p90 / p99":              has(),
		"PVC → Bound (CreateVolume, successful), p50 / p99": has(),
		"CSI calls by method and code":                      has(),
		"CSI errors by method and code":                     has(),
		"Publish / stage latency p99":                       has(),
		"Agent operation latency p99":                       has(),
		"Backend commands per second":                       empty("the file backend runs no external commands (loop devices through ioctls); lvm and zfs count theirs in the kernel guest"),
		"NVMe-oF hosts per target":                          empty("NVMe-oF needs nvmet and nvme-tcp, which run in the kernel guest; this host serves local volumes only"),
		"NVMe-oF exported volumes per target":               empty("NVMe-oF only, as above"),
	},
}

// firingAlerts must fire once the scenario made them true by hand.
var firingAlerts = []string{"PlinthPoolNearlyFull", "PlinthDriftPersisting", "PlinthVolumesFailed", "PlinthFencingRejections", "PlinthPolicyNotReady"}

func TestDashboardsAndAlertsOnRealData(t *testing.T) {
	prereq.Env(t, prereq.EnvIntegration, "make test-integration sets it: this test runs a control plane, Plinth and Prometheus")
	prereq.LoopControl(t)
	prereq.Commands(t, "losetup", "mkfs.ext4")
	if _, err := os.Stat(PrometheusBinary); err != nil {
		prereq.Missing(t, "%s (apt-get install prometheus): %v", PrometheusBinary, err)
	}
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubeControllerManager, controlplane.BinCSIProvisioner)
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()

	plinthBin := buildPlinth(t)
	dir, err := os.MkdirTemp("", "plinth-obs-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(ctx, Options{Dir: dir, Root: root, Plinth: plinthBin, PoolBytes: poolBytes, Log: testLog{t}})
	if err != nil {
		t.Fatalf("start Plinth: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, tail := range p.CP.LogTails(30) {
				t.Logf("--- %s, last lines:\n%s", name, tail)
			}
		}
		if err := p.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("work folder kept: %s", dir)
		}
	})

	// Prometheus with the shipped rules (for: dropped, see liveRules) and the ServiceMonitor's
	// scrape configuration.
	promDir := filepath.Join(dir, "prometheus")
	if err := os.MkdirAll(promDir, 0o755); err != nil {
		t.Fatal(err)
	}
	rulesFile := filepath.Join(promDir, "rules.yaml")
	if err := os.WriteFile(rulesFile, liveRules(t), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := ScrapeConfig(serviceMonitor, p.Targets, scrapeEvery, map[string]string{"cluster": Cluster}, rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	prom, err := StartPrometheus(ctx, p.CP, PrometheusBinary, promDir, cfg)
	if err != nil {
		t.Fatalf("start Prometheus: %v", err)
	}
	start := time.Now()
	t.Logf("Prometheus %s scrapes %d targets every %s", prom.URL, len(p.Targets), scrapeEvery)
	step(t, ctx, "every target up", func() error { return targetsUp(ctx, prom.API, len(p.Targets)) })

	// Policy: a file pool on the storage node, local protocol, a placement.
	applyYAML(t, ctx, p, fmt.Sprintf(`
apiVersion: policy.plinth.dev/v1alpha1
kind: StoragePool
metadata: {name: obs}
spec:
  nodeSelector: {matchLabels: {%q: "true"}}
  backend: {file: {directory: %q}}
  reserve: %q
  driftPolicy: Report
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Protocol
metadata: {name: local}
spec: {local: {}}
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata: {name: obs}
spec:
  poolRef: {name: obs}
  protocolRef: {name: local}
  storageClass: {name: plinth-obs, reclaimPolicy: Delete, volumeBindingMode: WaitForFirstConsumer, allowVolumeExpansion: true}
  filesystem: {fsType: ext4}
  strategy: Binpack
`, StorageLabel, p.PoolDir, fmt.Sprintf("%dMi", reserveBytes/mi)))
	storeName := storev1.StoreName("obs", StorageNode)
	step(t, ctx, "Store "+storeName+" reports capacity", func() error {
		var s storev1.Store
		if err := p.Client.Get(ctx, client.ObjectKey{Name: storeName}, &s); err != nil {
			return err
		}
		if s.Status.Capacity == nil || s.Status.Capacity.Allocatable != poolBytes-reserveBytes {
			return fmt.Errorf("capacity %+v, want allocatable %d", s.Status.Capacity, poolBytes-reserveBytes)
		}
		return nil
	})

	// Volumes: a Filesystem and a Block PVC, the filesystem one staged and published as
	// kubelet would.
	fs := pvc(t, ctx, p, "fs", 64*mi, corev1.PersistentVolumeFilesystem)
	blk := pvc(t, ctx, p, "blk", 64*mi, corev1.PersistentVolumeBlock)
	stage(t, ctx, p, fs)

	// The pool filled: 64 + 64 + 96 of 240 Mi provisioned leaves 16 Mi, under 10 %.
	pvc(t, ctx, p, "fill", 96*mi, corev1.PersistentVolumeFilesystem)
	// A PVC that does not fit: CreateVolume answers RESOURCE_EXHAUSTED (the errors panel).
	createPVC(t, ctx, p, "too-big", 128*mi, corev1.PersistentVolumeFilesystem)
	step(t, ctx, "CreateVolume RESOURCE_EXHAUSTED scraped", func() error {
		return nonEmpty(ctx, prom.API, `plinth_csi_operation_duration_seconds_count{method="CreateVolume", code="ResourceExhausted"}`)
	})

	// A failed volume: a VolumeState (as the CSI controller writes them) bigger than the pool.
	var blkVS storev1.VolumeState
	if err := p.Client.Get(ctx, client.ObjectKey{Name: blk.Spec.CSI.VolumeHandle}, &blkVS); err != nil {
		t.Fatal(err)
	}
	failed := &storev1.VolumeState{
		ObjectMeta: metav1.ObjectMeta{Name: volumeID("observability-failed"), Labels: blkVS.Labels},
		Spec: storev1.VolumeStateSpec{CSIName: "observability-failed", StoreName: storeName, CapacityBytes: 1 << 30,
			VolumeMode: "Block", Policy: blkVS.Spec.Policy},
	}
	if err := p.Client.Create(ctx, failed); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "VolumeState "+failed.Name+" Failed", func() error {
		var vs storev1.VolumeState
		if err := p.Client.Get(ctx, client.ObjectKey{Name: failed.Name}, &vs); err != nil {
			return err
		}
		if vs.Status.Phase != storev1.VolumeFailed {
			return fmt.Errorf("phase %q", vs.Status.Phase)
		}
		return nil
	})

	// Drift by hand: a volume file nobody asked for in the pool's directory (an orphan).
	orphan := filepath.Join(p.PoolDir, volumeID("made-by-hand")+".img")
	if err := os.WriteFile(orphan, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(orphan, 4*mi); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "kernel drift scraped", func() error {
		return nonEmpty(ctx, prom.API, `plinth_drift_objects{source="kernel"} > 0`)
	})

	// Fencing: the Block volume's durable mark corrupted by hand, then a spec change the agent
	// must act on: it refuses (CorruptMark) instead of trusting a mark it cannot read.
	mark := filepath.Join(p.AgentStateDir, "agent", "marks", blkVS.Name+".json")
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("fencing mark of %s: %v", blkVS.Name, err)
	}
	if err := os.WriteFile(mark, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(blkVS.DeepCopy())
	blkVS.Spec.CapacityBytes += mi
	if err := p.Client.Patch(ctx, &blkVS, patch); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "fencing rejection scraped", func() error {
		return nonEmpty(ctx, prom.API, `plinth_agent_fencing_rejections_total > 0`)
	})

	// A policy object that cannot be applied: a Placement of a pool that does not exist.
	applyYAML(t, ctx, p, `
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata: {name: broken}
spec:
  poolRef: {name: missing}
  protocolRef: {name: local}
  storageClass: {name: plinth-broken}
`)
	step(t, ctx, "Placement broken not Ready, scraped", func() error {
		return nonEmpty(ctx, prom.API, `plinth_policy_condition{kind="Placement", name="broken", type="Ready", status!="True"} == 1`)
	})

	// The alerts the scenario made true, firing on the shipped rules.
	step(t, ctx, "alerts "+strings.Join(firingAlerts, ", ")+" firing", func() error {
		res, err := prom.API.Alerts(ctx)
		if err != nil {
			return err
		}
		firing := map[string]bool{}
		for _, a := range res.Alerts {
			if a.State == promv1.AlertStateFiring {
				firing[string(a.Labels["alertname"])] = true
			}
		}
		var missing []string
		for _, a := range firingAlerts {
			if !firing[a] {
				missing = append(missing, a)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("not firing: %v (firing: %v)", missing, keys(firing))
		}
		t.Logf("firing: %v", keys(firing))
		return nil
	})

	// Every dashboard panel's queries, as Grafana runs them, once Prometheus scraped every
	// target three more times after the scenario's last step (rate() needs two samples).
	last := time.Now()
	step(t, ctx, "three more scrapes of every target", func() error {
		return nonEmpty(ctx, prom.API, fmt.Sprintf(`count(timestamp(up) > %d) == %d and count(count_over_time(up[1h]) >= 3)`, last.Add(3*scrapeEvery).Unix(), len(p.Targets)))
	})
	end := time.Now()
	checkPanels(t, ctx, prom.API, start, end)
}

// checkPanels runs every target of every dashboard and compares with expectations.
func checkPanels(t *testing.T, ctx context.Context, api promv1.API, start, end time.Time) {
	ds, err := LoadDashboards(dashboardsDir)
	if err != nil {
		t.Fatal(err)
	}
	var withData, emptyOK, queries int
	for _, d := range ds {
		exp, ok := expectations[d.File]
		if !ok {
			t.Errorf("%s: no expectation table", d.File)
			continue
		}
		for _, title := range d.Panels {
			if _, ok := exp[title]; !ok {
				t.Errorf("%s: panel %q has no expectation", d.File, title)
			}
		}
		for title := range exp {
			if !containsString(d.Panels, title) {
				t.Errorf("%s: expectation for panel %q, which the dashboard does not have", d.File, title)
			}
		}
		vals, err := d.Resolve(ctx, api, start, end)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		t.Logf("%s: variables %v", d.File, vals)
		if out := os.Getenv(EnvPNGDir); out != "" {
			file := filepath.Join(out, strings.TrimSuffix(d.File, ".json")+".png")
			if err := RenderPNG(ctx, api, d, vals, start, end, scrapeEvery, 10*time.Second, file); err != nil {
				t.Errorf("render %s: %v", file, err)
			} else {
				t.Logf("rendered %s", file)
			}
		}
		seen := map[string]bool{}
		for _, q := range d.Queries {
			queries++
			e := exp[q.Panel]
			expr, err := Substitute(q.Expr, vals, time.Minute)
			if err != nil {
				t.Errorf("%s / %s / %s: %v", d.File, q.Panel, q.RefID, err)
				continue
			}
			n, err := Run(ctx, api, q, expr, start, end, 5*time.Second)
			switch {
			case err != nil:
				t.Errorf("%s / %s / %s: query error: %v\n%s", d.File, q.Panel, q.RefID, err, expr)
			case n == 0 && e.data:
				t.Errorf("%s / %s / %s: no data, the scenario guarantees some\n%s", d.File, q.Panel, q.RefID, expr)
			case n > 0 && !e.data:
				t.Errorf("%s / %s / %s: %d series where the table says empty (%s): update the table\n%s", d.File, q.Panel, q.RefID, n, e.why, expr)
			}
			if !seen[q.Panel] {
				seen[q.Panel] = true
				if e.data {
					withData++
				} else {
					emptyOK++
				}
			}
		}
	}
	t.Logf("%d dashboards, %d queries: %d panels with data, %d legitimately empty", len(ds), queries, withData, emptyOK)
}

// liveRules is the shipped PrometheusRule's spec with every "for" removed: the scenario runs
// minutes, not the 15 to 30 minutes the rules wait; the expressions are the shipped ones, and
// the "for" durations are covered by test/manifests' promtool unit tests.
func liveRules(t *testing.T) []byte {
	raw, err := os.ReadFile(prometheusRule)
	if err != nil {
		t.Fatal(err)
	}
	var pr unstructured.Unstructured
	if err := yaml.Unmarshal(raw, &pr.Object); err != nil {
		t.Fatal(err)
	}
	groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rules {
			delete(r.(map[string]any), "for")
		}
	}
	out, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func buildPlinth(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "plinth")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/plinth")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/plinth: %v\n%s", err, b)
	}
	return out
}

func step(t *testing.T, ctx context.Context, what string, f func() error) {
	t.Helper()
	began := time.Now()
	if err := Poll(ctx, 3*time.Minute, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Logf("%s (%.1fs)", what, time.Since(began).Seconds())
}

func targetsUp(ctx context.Context, api promv1.API, want int) error {
	res, err := api.Targets(ctx)
	if err != nil {
		return err
	}
	up := 0
	var down []string
	for _, tg := range res.Active {
		if tg.Health == promv1.HealthGood {
			up++
		} else {
			down = append(down, fmt.Sprintf("%s %s: %s", tg.ScrapeURL, tg.Health, tg.LastError))
		}
	}
	if up != want {
		return fmt.Errorf("%d of %d targets up; %v", up, want, down)
	}
	return nil
}

func nonEmpty(ctx context.Context, api promv1.API, expr string) error {
	v, _, _, err := api.Query(ctx, expr, time.Now())
	if err != nil {
		return err
	}
	if vec, ok := v.(model.Vector); !ok || len(vec) == 0 {
		return fmt.Errorf("%s: no result yet", expr)
	}
	return nil
}

func applyYAML(t *testing.T, ctx context.Context, p *Plinth, docs string) {
	t.Helper()
	for _, doc := range strings.Split(docs, "\n---\n") {
		var o unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &o.Object); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if err := p.Apply(ctx, &o); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

func createPVC(t *testing.T, ctx context.Context, p *Plinth, name string, size int64, mode corev1.PersistentVolumeMode) {
	t.Helper()
	sc := "plinth-obs"
	c := &corev1.PersistentVolumeClaim{
		// The node the scheduler picked for the PVC's pod (WaitForFirstConsumer: local volumes
		// live where the pod runs); set here as the scheduler would, no pod runs.
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: map[string]string{"volume.kubernetes.io/selected-node": StorageNode}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &mode,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}}},
	}
	if err := p.Client.Create(ctx, c); err != nil {
		t.Fatalf("PVC %s: %v", name, err)
	}
}

// pvc creates a PVC and returns its PV once Bound.
func pvc(t *testing.T, ctx context.Context, p *Plinth, name string, size int64, mode corev1.PersistentVolumeMode) *corev1.PersistentVolume {
	t.Helper()
	createPVC(t, ctx, p, name, size, mode)
	var pv corev1.PersistentVolume
	step(t, ctx, fmt.Sprintf("PVC %s (%s, %d Mi) Bound", name, mode, size/mi), func() error {
		var c corev1.PersistentVolumeClaim
		if err := p.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &c); err != nil {
			return err
		}
		if c.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("phase %s", c.Status.Phase)
		}
		return p.Client.Get(ctx, client.ObjectKey{Name: c.Spec.VolumeName}, &pv)
	})
	return &pv
}

// stage publishes, stages and publishes pv on the storage node through the CSI sockets, as
// csi-attacher and kubelet would, and writes a file through the mount.
func stage(t *testing.T, ctx context.Context, p *Plinth, pv *corev1.PersistentVolume) {
	t.Helper()
	dial := func(sock string) *grpc.ClientConn {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	capability := &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	id := pv.Spec.CSI.VolumeHandle
	pub, err := csipb.NewControllerClient(dial(p.ControllerSocket)).ControllerPublishVolume(cctx, &csipb.ControllerPublishVolumeRequest{
		VolumeId: id, NodeId: StorageNode, VolumeCapability: capability, VolumeContext: pv.Spec.CSI.VolumeAttributes})
	if err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	base := filepath.Join(p.Dir, "kubelet")
	staging := filepath.Join(base, "plugins", pv.Name, "globalmount")
	target := filepath.Join(base, "pods", "app", pv.Name, "mount")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	node := csipb.NewNodeClient(dial(p.NodeSocket))
	if _, err := node.NodeStageVolume(cctx, &csipb.NodeStageVolumeRequest{VolumeId: id, PublishContext: pub.PublishContext,
		StagingTargetPath: staging, VolumeCapability: capability, VolumeContext: pv.Spec.CSI.VolumeAttributes}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := node.NodePublishVolume(cctx, &csipb.NodePublishVolumeRequest{VolumeId: id, PublishContext: pub.PublishContext,
		StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability, VolumeContext: pv.Spec.CSI.VolumeAttributes}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), make([]byte, 4*mi), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s published, staged at %s, published at %s, 4 Mi written", id, staging, target)
}

// volumeID is the CSI volume id of a CSI name (DESIGN.md "Names and keys").
func volumeID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "vol-" + hex.EncodeToString(sum[:])[:40]
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func containsString(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
