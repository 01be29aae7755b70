package devenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/monitoring"
)

// Names of what the observability steps make by hand.
const (
	// FillPVC is the Block PVC that fills the quickstart pod's Store.
	FillPVC = "fill"
	// TooBigPVC is a PVC that does not fit (CreateVolume RESOURCE_EXHAUSTED).
	TooBigPVC = "too-big"
	// FailedVolumeName is the CSI name of a VolumeState bigger than its Store (phase Failed).
	FailedVolumeName = "observability-failed"
	// OrphanVolumeName is the CSI name of a volume file put in the pool by hand (kernel drift).
	OrphanVolumeName = "made-by-hand"
)

// AlertsFiring are the alerts the observability step makes true by hand and reads firing from
// Prometheus: the pool filled, a volume failed, drift in the kernel, a fencing refusal.
var AlertsFiring = []string{"PlinthPoolNearlyFull", "PlinthVolumesFailed", "PlinthDriftPersisting", "PlinthFencingRejections"}

// AlertsResolved are the alerts the scenario's faults fire (AlertsFiring, and
// PlinthPolicyNotReady while the invalid commit stands): each must be resolved before dev up
// hands over (--keep) or stops.
var AlertsResolved = append(append([]string(nil), AlertsFiring...), "PlinthPolicyNotReady")

// ResolvedAlerts ends the scenario: it waits until none of AlertsResolved fires in Prometheus
// (the faults were undone; range windows end AlertWindow after), so a user who keeps the
// environment up starts from a quiet Prometheus. Other Plinth alerts still firing are named,
// not waited for.
func (e *Walk) ResolvedAlerts(ctx context.Context, _ *Summary) error {
	return e.step("alerts of the injected faults resolved in Prometheus: "+strings.Join(AlertsResolved, ", "), nil, func() (string, error) {
		began := time.Now()
		var firing map[string]int
		err := poll(ctx, AlertWindow+2*time.Minute, func() error {
			var err error
			if firing, err = monitoring.Firing(ctx, e.Prom.API); err != nil {
				return err
			}
			var still []string
			for _, name := range AlertsResolved {
				if n := firing[name]; n > 0 {
					still = append(still, fmt.Sprintf("%s ×%d", name, n))
				}
			}
			if len(still) > 0 {
				return fmt.Errorf("still firing: %s", strings.Join(still, ", "))
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("Prometheus %s /api/v1/alerts: %w", e.Prom.URL, err)
		}
		detail := fmt.Sprintf("none firing (waited %.1fs)", time.Since(began).Seconds())
		var others []string
		for name, n := range firing {
			if strings.HasPrefix(name, "Plinth") {
				others = append(others, fmt.Sprintf("%s ×%d", name, n))
			}
		}
		sort.Strings(others)
		if len(others) > 0 {
			detail += "; other Plinth alerts firing: " + strings.Join(others, ", ")
		}
		return detail, nil
	})
}

// volumeID is the CSI volume id of a CSI name (docs/design.md, "Names and keys").
func volumeID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "vol-" + hex.EncodeToString(sum[:])[:40]
}

// alertsFiring polls Prometheus until every alert of names fires and returns a line with the
// number of firing alerts of each.
func (e *Walk) alertsFiring(ctx context.Context, timeout time.Duration, names ...string) (string, error) {
	var n map[string]int
	err := poll(ctx, timeout, func() error {
		var err error
		n, err = monitoring.Firing(ctx, e.Prom.API, names...)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("Prometheus %s /api/v1/alerts: %w", e.Prom.URL, err)
	}
	var parts []string
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s ×%d", name, n[name]))
	}
	return "firing (Prometheus /api/v1/alerts): " + strings.Join(parts, ", "), nil
}

// DriftAlert follows HandDrift: the StorageClass edited by hand (driftPolicy Report) makes
// PlinthDriftPersisting fire on the shipped rule.
func (e *Walk) DriftAlert(ctx context.Context, _ *Summary) error {
	return e.step("the hand edit → PlinthDriftPersisting firing in Prometheus", []string{"plinth-controller"}, func() (string, error) {
		if err := poll(ctx, time.Minute, func() error {
			return monitoring.NonEmpty(ctx, e.Prom.API, `plinth_drift_objects{source="api", cluster="`+ClusterLabel+`"} > 0`)
		}); err != nil {
			return "", err
		}
		return e.alertsFiring(ctx, time.Minute, "PlinthDriftPersisting")
	})
}

// pvcOn creates a PVC of class on node as the scheduler would have chosen it (the
// selected-node annotation; no pod) with size bytes and mode.
func (e *Walk) pvcOn(ctx context.Context, name, class, node string, size int64, mode corev1.PersistentVolumeMode) error {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: QuickstartNamespace, Name: name,
			Annotations: map[string]string{"volume.kubernetes.io/selected-node": node}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeMode: &mode,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}}},
	}
	return e.Client.Create(ctx, pvc)
}

// Observe runs after the scenario made volumes, drift and capacity changes, with the
// quickstart pod still writing to its PVC: it fills the pod's Store with a Block PVC, adds a
// VolumeState bigger than the Store (Failed), a PVC that does not fit (RESOURCE_EXHAUSTED),
// a volume file nobody asked for (kernel drift) and a corrupted fencing mark under a spec
// change (a refusal); reads the capacity, failed-volume, drift and fencing alerts firing; then
// evaluates every dashboard panel against the expectation table (monitoring.Expectations,
// column RealNodes); and undoes it all.
func (e *Walk) Observe(ctx context.Context, sum *Summary) error {
	node := e.node
	store := storev1.StoreName(QuickstartPool, node)
	var fillID, markFile string
	var mark []byte
	var lastChange time.Time
	made := func() (string, error) {
		var st storev1.Store
		if err := e.Client.Get(ctx, client.ObjectKey{Name: store}, &st); err != nil {
			return "", err
		}
		c := st.Status.Capacity
		if c == nil {
			return "", fmt.Errorf("store %s reports no capacity", store)
		}
		// available ÷ (available + provisioned) below 10 % once the fill is provisioned
		// (PlinthPoolNearlyFull): leave 5 % of the provisionable room, in whole GiB.
		size := (c.Available - (c.Available+c.Provisioned)/20) / (1 << 30) * (1 << 30)
		if size <= 0 {
			return "", fmt.Errorf("store %s: available %d, provisioned %d: nothing to fill", store, c.Available, c.Provisioned)
		}
		if err := e.pvcOn(ctx, FillPVC, QuickstartClass, node, size, corev1.PersistentVolumeBlock); err != nil {
			return "", err
		}
		var pvc corev1.PersistentVolumeClaim
		if err := poll(ctx, 2*time.Minute, func() error {
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: FillPVC}, &pvc); err != nil {
				return err
			}
			if pvc.Status.Phase != corev1.ClaimBound {
				return fmt.Errorf("PVC %s %s", FillPVC, pvc.Status.Phase)
			}
			return nil
		}); err != nil {
			return "", err
		}
		var pv corev1.PersistentVolume
		if err := e.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
			return "", err
		}
		fillID = pv.Spec.CSI.VolumeHandle
		vs, err := e.waitVolumeReady(ctx, fillID)
		if err != nil {
			return "", err
		}
		// Too big: CreateVolume answers RESOURCE_EXHAUSTED (the CSI errors panel).
		if err := e.pvcOn(ctx, TooBigPVC, QuickstartClass, node, 2*size, corev1.PersistentVolumeFilesystem); err != nil {
			return "", err
		}
		// Failed: a VolumeState (as the CSI controller writes them) bigger than the Store.
		failed := &storev1.VolumeState{
			ObjectMeta: metav1.ObjectMeta{Name: volumeID(FailedVolumeName), Labels: vs.Labels},
			Spec: storev1.VolumeStateSpec{CSIName: FailedVolumeName, StoreName: store, CapacityBytes: 4 * size,
				VolumeMode: "Block", Policy: vs.Spec.Policy},
		}
		if err := e.Client.Create(ctx, failed); err != nil {
			return "", err
		}
		// Kernel drift: a volume file nobody asked for in the pool's directory.
		orphan := filepath.Join(e.VolumeDir(node), volumeID(OrphanVolumeName)+".img")
		if err := os.WriteFile(orphan, nil, 0o600); err != nil {
			return "", err
		}
		if err := os.Truncate(orphan, 4<<20); err != nil {
			return "", err
		}
		// Fencing: the fill volume's durable mark corrupted by hand, then a spec change the
		// agent must act on: it refuses (CorruptMark) rather than trust a mark it cannot read.
		markFile = filepath.Join(e.Nodes.Node(node).Dir, "plinth", "agent", "marks", fillID+".json")
		if mark, err = os.ReadFile(markFile); err != nil {
			return "", fmt.Errorf("fencing mark of %s: %w", fillID, err)
		}
		if err := os.WriteFile(markFile, []byte("{not json"), 0o600); err != nil {
			return "", err
		}
		patch := client.MergeFrom(vs.DeepCopy())
		vs.Spec.CapacityBytes += 1 << 20
		if err := e.Client.Patch(ctx, vs, patch); err != nil {
			return "", err
		}
		lastChange = time.Now()
		return fmt.Sprintf("on %s: Block PVC %s of %s Bound (%s); PVC %s of %s; VolumeState %s of %s; file %s; mark %s corrupted, %s grown by 1Mi",
			node, FillPVC, bytesStr(size), fillID, TooBigPVC, bytesStr(2*size), failed.Name, bytesStr(4*size), orphan, markFile, fillID), nil
	}
	if err := e.step("fill Store "+store+", a failed volume, a volume too big, an orphan file, a corrupted fencing mark", agentAndCSI, made); err != nil {
		return err
	}
	if err := e.step("alerts "+strings.Join(AlertsFiring, ", ")+" firing in Prometheus", agentAndCSI, func() (string, error) {
		return e.alertsFiring(ctx, 2*time.Minute, AlertsFiring...)
	}); err != nil {
		return err
	}
	if err := e.step("every dashboard panel's PromQL against Prometheus (expectation table, real nodes)", nil, func() (string, error) {
		// kubelet gathers volume stats once a minute (volumeStatsAggPeriod): the quickstart
		// PVC's appear up to a minute after its pod started.
		began := time.Now()
		if err := poll(ctx, 3*time.Minute, func() error {
			return monitoring.NonEmpty(ctx, e.Prom.API, fmt.Sprintf(`kubelet_volume_stats_used_bytes{namespace=%q, persistentvolumeclaim=%q, cluster=%q}`,
				QuickstartNamespace, QuickstartPVC, ClusterLabel))
		}); err != nil {
			return "", fmt.Errorf("kubelet's stats of PVC %s/%s (kubelet gathers them once a minute): %w", QuickstartNamespace, QuickstartPVC, err)
		}
		statsWait := time.Since(began)
		// Three more scrapes of every target after the last change (rate() needs two samples);
		// the alerts' wait has usually seen them already.
		if err := poll(ctx, time.Minute, func() error {
			return monitoring.NonEmpty(ctx, e.Prom.API, fmt.Sprintf(`count(timestamp(up) > %d) == count(up) and count(count_over_time(up[1h]) >= 3)`,
				lastChange.Add(3*ScrapeInterval).Unix()))
		}); err != nil {
			return "", err
		}
		sum.ObserveEnd = time.Now()
		rep, _, err := monitoring.CheckPanels(ctx, e.Prom.API, filepath.Join(e.Root, DashboardsDir), monitoring.RealNodes,
			sum.ObserveStart, sum.ObserveEnd, time.Minute, 5*time.Second)
		if err != nil {
			return "", err
		}
		sum.Panels = rep
		var files []string
		for f := range rep.Variables {
			files = append(files, fmt.Sprintf("%s %v", f, rep.Variables[f]))
		}
		sort.Strings(files)
		return fmt.Sprintf("kubelet_volume_stats_* of PVC %s/%s in Prometheus after %.1fs more\n%s\nvariables: %s",
			QuickstartNamespace, QuickstartPVC, statsWait.Seconds(), rep, strings.Join(files, "; ")), nil
	}); err != nil {
		return err
	}
	return e.step("undo: mark restored, fill and too-big PVCs, failed VolumeState and orphan file removed", agentAndCSI, func() (string, error) {
		if err := os.WriteFile(markFile, mark, 0o600); err != nil {
			return "", err
		}
		if err := os.Remove(filepath.Join(e.VolumeDir(node), volumeID(OrphanVolumeName)+".img")); err != nil {
			return "", err
		}
		for _, name := range []string{TooBigPVC, FillPVC} {
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: QuickstartNamespace, Name: name}}
			if err := e.Client.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
				return "", err
			}
		}
		failed := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: volumeID(FailedVolumeName)}}
		if err := e.Client.Delete(ctx, failed); err != nil && !apierrors.IsNotFound(err) {
			return "", err
		}
		err := poll(ctx, 3*time.Minute, func() error {
			for _, id := range []string{fillID, failed.Name} {
				if err := e.Client.Get(ctx, client.ObjectKey{Name: id}, &storev1.VolumeState{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("VolumeState %s still there (%v)", id, err)
				}
			}
			if m := e.volumeFiles(fillID); len(m) > 0 {
				return fmt.Errorf("files %v still there", m)
			}
			return monitoring.NonEmpty(ctx, e.Prom.API, `sum(plinth_drift_objects{source="kernel"}) == 0`)
		})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("VolumeStates %s and %s, file of %s gone; no kernel drift", fillID, failed.Name, fillID), nil
	})
}
