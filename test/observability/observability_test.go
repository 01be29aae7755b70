package observability

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/monitoring"
	"github.com/plinth-storage/plinth/test/framework/monitoring/panelplot"
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

// firingAlerts must fire once the scenario made them true by hand.
var firingAlerts = []string{"PlinthPoolNearlyFull", "PlinthDriftPersisting", "PlinthVolumesFailed", "PlinthFencingRejections", "PlinthPolicyNotReady",
	"PlinthReconcileErrors", "PlinthVolumeInaccessible"}

func TestDashboardsAndAlertsOnRealData(t *testing.T) {
	prereq.Env(t, prereq.EnvIntegration, "make test-integration sets it: this test runs a control plane, Plinth and Prometheus")
	prereq.LoopControl(t)
	prereq.Commands(t, "losetup", "mkfs.ext4", "findmnt")
	if _, err := os.Stat(monitoring.PrometheusBinary); err != nil {
		prereq.Missing(t, "%s (apt-get install prometheus): %v", monitoring.PrometheusBinary, err)
	}
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubeControllerManager, controlplane.BinCSIProvisioner)
	ctx, cancel := context.WithTimeout(t.Context(), 16*time.Minute)
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
	cfg, err := monitoring.ScrapeConfig(serviceMonitor, p.Targets, scrapeEvery, map[string]string{"cluster": Cluster}, rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	prom, err := monitoring.StartPrometheus(ctx, p.CP.StartProcess, monitoring.PrometheusBinary, promDir, cfg)
	if err != nil {
		t.Fatalf("start Prometheus: %v", err)
	}
	start := time.Now()
	t.Logf("Prometheus %s scrapes %d targets every %s", prom.URL, len(p.Targets), scrapeEvery)
	step(t, ctx, "every target up", func() error {
		return monitoring.TargetsUp(ctx, prom.API, map[string]int{monitoring.JobPlinth: len(p.Targets)})
	})

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
	staging := stage(t, ctx, p, fs)

	// The pool filled: 64 + 64 + 96 of 240 Mi provisioned leaves 16 Mi, under 10 %.
	pvc(t, ctx, p, "fill", 96*mi, corev1.PersistentVolumeFilesystem)
	// A PVC that does not fit: CreateVolume answers RESOURCE_EXHAUSTED (the errors panel).
	createPVC(t, ctx, p, "too-big", 128*mi, corev1.PersistentVolumeFilesystem)
	step(t, ctx, "CreateVolume RESOURCE_EXHAUSTED scraped", func() error {
		return monitoring.NonEmpty(ctx, prom.API, `plinth_csi_operation_duration_seconds_count{method="CreateVolume", code="ResourceExhausted"}`)
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
		return monitoring.NonEmpty(ctx, prom.API, `plinth_drift_objects{source="kernel"} > 0`)
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
		return monitoring.NonEmpty(ctx, prom.API, `plinth_agent_fencing_rejections_total > 0`)
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
		return monitoring.NonEmpty(ctx, prom.API, `plinth_policy_condition{kind="Placement", name="broken", type="Ready", status!="True"} == 1`)
	})

	// A staged volume's disk vanishes, as a pulled disk's node leaves /dev: the node plugin's
	// health check reports it (DeviceGone) on its next round. The node is made again before
	// clean-up, which detaches the loop device through it.
	removeDeviceNode(t, staging)
	step(t, ctx, "staged volume inaccessible (DeviceGone) scraped", func() error {
		return monitoring.NonEmpty(ctx, prom.API, `plinth_csi_node_volumes_inaccessible{reason="DeviceGone"} == 1`)
	})

	// "Abnormal volumes", as Grafana runs it, counts both: the Failed VolumeState and the staged
	// volume whose device is gone.
	step(t, ctx, `"Abnormal volumes" shows the failed and the inaccessible volume`, func() error {
		v, err := monitoring.PanelValue(ctx, prom.API, dashboardsDir, "capacity.json", "Abnormal volumes", start)
		if err == nil && v != 2 {
			err = fmt.Errorf("Abnormal volumes: %g, want 2", v)
		}
		return err
	})

	// The alerts the scenario made true, firing on the shipped rules.
	step(t, ctx, "alerts "+strings.Join(firingAlerts, ", ")+" firing", func() error {
		n, err := monitoring.Firing(ctx, prom.API, firingAlerts...)
		if err != nil {
			return err
		}
		t.Logf("firing: %v", n)
		return nil
	})

	// Every dashboard panel's queries, as Grafana runs them, once Prometheus scraped every
	// target three more times after the scenario's last step (rate() needs two samples).
	last := time.Now()
	step(t, ctx, "three more scrapes of every target", func() error {
		return monitoring.NonEmpty(ctx, prom.API, fmt.Sprintf(`count(timestamp(up) > %d) == %d and count(count_over_time(up[1h]) >= 3)`, last.Add(3*scrapeEvery).Unix(), len(p.Targets)))
	})
	end := time.Now()
	// The agent stops: its heartbeat ages past the shipped rule's threshold and
	// PlinthAgentHeartbeatMissing fires for its node. The panels, queried at end, run meanwhile.
	heartbeatLapse(t, ctx, p, prom.API, func() { checkPanels(t, ctx, prom.API, start, end) })
}

// heartbeatAlert fires for a node whose agent stopped refreshing its Agent status.
const heartbeatAlert = "PlinthAgentHeartbeatMissing"

// heartbeatLapse stops the storage node's agent, runs during, and waits until heartbeatAlert
// fires for that node. The wait is the shipped rule's own threshold (read from its expression,
// not shortened for the test; its "for" is dropped as for every alert here, see liveRules),
// bounded by that threshold plus 90 s after the agent's last heartbeat. It fails when the
// alert fires while the agent runs, fires sooner than the threshold after the last heartbeat
// (one scrape interval of slack), names another node, or does not fire in time.
func heartbeatLapse(t *testing.T, ctx context.Context, p *Plinth, api promv1.API, during func()) {
	t.Helper()
	threshold, err := alertThreshold(prometheusRule, heartbeatAlert)
	if err != nil {
		t.Fatal(err)
	}
	// The agent runs: its age is scraped and the alert, evaluated on it, is quiet.
	step(t, ctx, "heartbeat age of "+StorageNode+" scraped", func() error {
		return monitoring.NonEmpty(ctx, api, fmt.Sprintf(`plinth_agent_heartbeat_age_seconds{node=%q} < %g`, StorageNode, threshold.Seconds()))
	})
	if n, _ := monitoring.Firing(ctx, api); n[heartbeatAlert] != 0 {
		t.Fatalf("%s firing while the agent of %s runs: %v", heartbeatAlert, StorageNode, n)
	}
	if err := p.Agent.StopWithin(10 * time.Second); err != nil {
		t.Fatalf("stop the agent: %v", err)
	}
	var a storev1.Agent
	if err := p.Client.Get(ctx, client.ObjectKey{Name: StorageNode}, &a); err != nil {
		t.Fatal(err)
	}
	if a.Status.LastHeartbeatTime == nil {
		t.Fatalf("Agent %s has no lastHeartbeatTime", StorageNode)
	}
	last := a.Status.LastHeartbeatTime.Time
	t.Logf("agent of %s stopped %.1fs after its last heartbeat (%s); %s threshold %s",
		StorageNode, time.Since(last).Seconds(), last.Format(time.RFC3339), heartbeatAlert, threshold)
	during()

	var active time.Time
	began := time.Now()
	if err := monitoring.Poll(ctx, time.Until(last.Add(threshold+90*time.Second)), func() error {
		res, err := api.Alerts(ctx)
		if err != nil {
			return err
		}
		for _, al := range res.Alerts {
			if string(al.Labels["alertname"]) != heartbeatAlert || al.State != promv1.AlertStateFiring {
				continue
			}
			if node := string(al.Labels["node"]); node != StorageNode {
				return fmt.Errorf("%s firing for node %q, want %q", heartbeatAlert, node, StorageNode)
			}
			active = al.ActiveAt
			return nil
		}
		return fmt.Errorf("%s not firing %.0fs after the last heartbeat", heartbeatAlert, time.Since(last).Seconds())
	}); err != nil {
		t.Fatal(err)
	}
	after := active.Sub(last)
	if after < threshold-scrapeEvery {
		t.Fatalf("%s active %.1fs after the last heartbeat, sooner than the rule's %s", heartbeatAlert, after.Seconds(), threshold)
	}
	t.Logf("%s firing for %s, active %.1fs after the last heartbeat (threshold %s; waited %.1fs)",
		heartbeatAlert, StorageNode, after.Seconds(), threshold, time.Since(began).Seconds())
}

// thresholdExpr matches an alert expression "<query> > <seconds>".
var thresholdExpr = regexp.MustCompile(`>\s*([0-9]+(?:\.[0-9]+)?)\s*$`)

// alertThreshold returns the number an alert's expression compares with ("... > 180" is
// 180 s), read from the PrometheusRule in file. Errors: the file cannot be read, has no such
// alert, or its expression does not end in "> <number>".
func alertThreshold(file, alert string) (time.Duration, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	var pr struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert, Expr string
				}
			}
		}
	}
	if err := yaml.Unmarshal(raw, &pr); err != nil {
		return 0, fmt.Errorf("%s: %w", file, err)
	}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != alert {
				continue
			}
			m := thresholdExpr.FindStringSubmatch(strings.TrimSpace(r.Expr))
			if m == nil {
				return 0, fmt.Errorf("%s: alert %s: expression %q does not end in \"> <seconds>\"", file, alert, r.Expr)
			}
			sec, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				return 0, fmt.Errorf("%s: alert %s: %w", file, alert, err)
			}
			return time.Duration(sec * float64(time.Second)), nil
		}
	}
	return 0, fmt.Errorf("%s: no alert %s", file, alert)
}

// checkPanels runs every target of every dashboard and compares with the expectation table
// (monitoring.Expectations, column Host); with EnvPNGDir set it draws each dashboard's main panels.
func checkPanels(t *testing.T, ctx context.Context, api promv1.API, start, end time.Time) {
	rep, ds, err := monitoring.CheckPanels(ctx, api, dashboardsDir, monitoring.Host, start, end, time.Minute, 5*time.Second)
	if err != nil {
		t.Error(err)
	}
	for f, v := range rep.Variables {
		t.Logf("%s: variables %v", f, v)
	}
	if out := os.Getenv(EnvPNGDir); out != "" {
		for _, d := range ds {
			file := filepath.Join(out, strings.TrimSuffix(d.File, ".json")+".png")
			if err := panelplot.RenderPNG(ctx, api, d, rep.Variables[d.File], start, end, scrapeEvery, 10*time.Second, file); err != nil {
				t.Errorf("render %s: %v", file, err)
			} else {
				t.Logf("rendered %s", file)
			}
		}
	}
	t.Log(rep)
}

// liveRules is the shipped PrometheusRule's spec with every "for" removed (monitoring.LiveRules).
func liveRules(t *testing.T) []byte {
	out, err := monitoring.LiveRules(prometheusRule)
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
	if err := monitoring.Poll(ctx, 3*time.Minute, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Logf("%s (%.1fs)", what, time.Since(began).Seconds())
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

// removeDeviceNode deletes the /dev node of the block device mounted at mountPoint, and makes it
// again (same major:minor) when the test ends, before the clean-up that needs it.
func removeDeviceNode(t *testing.T, mountPoint string) {
	t.Helper()
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", "--mountpoint", mountPoint).Output()
	if err != nil {
		t.Fatalf("findmnt %s: %v", mountPoint, err)
	}
	dev := strings.TrimSpace(string(out))
	var st syscall.Stat_t
	if err := syscall.Stat(dev, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFBLK {
		t.Fatalf("the device of %s, %q, is not a block device: %v", mountPoint, dev, err)
	}
	if err := os.Remove(dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Mknod(dev, syscall.S_IFBLK|0o660, int(st.Rdev)); err != nil && !os.IsExist(err) {
			t.Errorf("make %s again: %v", dev, err)
		}
	})
	t.Logf("%s (mounted at %s) removed from /dev", dev, mountPoint)
}

// stage publishes, stages and publishes pv on the storage node through the CSI sockets, as
// csi-attacher and kubelet would, and writes a file through the mount; it returns the staging
// path.
func stage(t *testing.T, ctx context.Context, p *Plinth, pv *corev1.PersistentVolume) string {
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
	return staging
}

// volumeID is the CSI volume id of a CSI name (docs/design.md, "Names and keys").
func volumeID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "vol-" + hex.EncodeToString(sum[:])[:40]
}

type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
