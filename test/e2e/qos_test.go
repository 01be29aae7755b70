package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// The QoS case (docs/design.md, QoS): a Placement with two tiers (applied by hand next to the
// quickstart's Git-delivered policy, on the same pool and protocol), a claim on tier A whose
// pod writes with O_DIRECT at A's rate, the claim moved to tier B live, and a claim of the
// quickstart class naming a tier its Placement does not declare.
const (
	qosPlacement = "qos-tiers"
	qosClass     = "plinth-qos"
	qosTierA     = "qos-a"
	qosTierB     = "qos-b"
	qosClaim     = "qos-claim"
	qosRefused   = "qos-refused"
	// The tiers' write limits: low enough that the loop device under the file backend is never
	// the bottleneck, so the measured rate is the throttle's.
	qosRateA = 2 << 20
	qosRateB = 4 << 20
	// qosWriteSeconds is how long each measurement writes at the tier's rate: the kernel's
	// throttle lets a first slice (tens of milliseconds) through unthrottled, which over this
	// many seconds is below 1 %.
	qosWriteSeconds = 8
	// qosTolerance is how far above its limit a measured rate may be (the first unthrottled
	// slice, timing). Below the limit a rate measures the host's load as much as the throttle
	// (one starved writer reads half its limit at load 50), so how close to the limit a
	// writer gets is a benchmark figure (docs/performance.md), not asserted here.
	qosTolerance = 0.10
)

// QoSTiers runs the QoS case on a running Env (after the scenario) and returns what it
// measured; a tier not in force in the pod's cgroups, a rate above its limit by more than
// qosTolerance, a restarted or replaced pod, or a refusal without its event is an error.
func QoSTiers(ctx context.Context, env *devenv.Env) (string, error) {
	rateA, rateB := int64(qosRateA), int64(qosRateB)
	pl := &policyv1.Placement{
		ObjectMeta: metav1.ObjectMeta{Name: qosPlacement},
		Spec: policyv1.PlacementSpec{
			PoolRef:      policyv1.LocalObjectReference{Name: devenv.QuickstartPool},
			ProtocolRef:  policyv1.LocalObjectReference{Name: devenv.QuickstartProtocol},
			StorageClass: policyv1.StorageClassTemplate{Name: qosClass, ReclaimPolicy: "Delete", VolumeBindingMode: "WaitForFirstConsumer"},
			Filesystem:   policyv1.Filesystem{FSType: "ext4"},
			AttributesClasses: []policyv1.AttributesClassTemplate{
				{Name: qosTierA, Limits: policyv1.IOLimits{WriteBytesPerSecond: &rateA}},
				{Name: qosTierB, Limits: policyv1.IOLimits{WriteBytesPerSecond: &rateB}},
			},
		},
	}
	if err := env.Client.Create(ctx, pl); err != nil {
		return "", fmt.Errorf("create Placement %s: %w", qosPlacement, err)
	}
	defer cleanupQoS(context.WithoutCancel(ctx), env) //nolint:errcheck // best effort; the cluster goes down after the suite
	if err := poll(ctx, 2*time.Minute, func() error {
		for _, name := range []string{qosTierA, qosTierB} {
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &storagev1.VolumeAttributesClass{}); err != nil {
				return err
			}
		}
		return env.Client.Get(ctx, client.ObjectKey{Name: qosClass}, &storagev1.StorageClass{})
	}); err != nil {
		return "", fmt.Errorf("VolumeAttributesClasses %s, %s and StorageClass %s rendered: %w", qosTierA, qosTierB, qosClass, err)
	}
	if err := qosClaimWithPod(ctx, env, qosClaim, qosClass, qosTierA); err != nil {
		return "", err
	}
	if err := qosClaimWithPod(ctx, env, qosRefused, devenv.QuickstartClass, qosTierA); err != nil {
		return "", err
	}

	var pod corev1.Pod
	if err := poll(ctx, 3*time.Minute, func() error {
		var pvc corev1.PersistentVolumeClaim
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: devenv.QuickstartNamespace, Name: qosClaim}, &pvc); err != nil {
			return err
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: devenv.QuickstartNamespace, Name: qosClaim}, &pod); err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound || pod.Status.Phase != corev1.PodRunning || current(&pvc) != qosTierA {
			return fmt.Errorf("PVC %s %s (class %q), pod %s on %q", pvc.Name, pvc.Status.Phase, current(&pvc), pod.Status.Phase, pod.Spec.NodeName)
		}
		return nil
	}); err != nil {
		return "", err
	}
	uid, restarts := pod.UID, restartCount(&pod)
	if err := qosApplied(ctx, env, qosClaim, pod.Spec.NodeName); err != nil {
		return "", err
	}
	// On cgroup v1 the limit is written into each cgroup of the pod (v1 throttling is not
	// hierarchical); a container started after the node plugin's last round gets it at the
	// next (--limits-interval): wait until the host's cgroups of the pod hold it.
	if err := poll(ctx, 30*time.Second, func() error { return qosInForce(string(pod.UID), qosRateA) }); err != nil {
		return "", fmt.Errorf("tier %s: %w; %s", qosTierA, err, qosNodeLog(ctx, env, pod.Spec.NodeName))
	}

	gotA, err := qosMeasure(ctx, env, qosRateA)
	if err != nil {
		return "", fmt.Errorf("tier %s: %w", qosTierA, err)
	}
	if err := notAboveLimit(gotA, qosRateA); err != nil {
		return "", fmt.Errorf("tier %s: %w; %s", qosTierA, err, podCgroupLimits(string(pod.UID)))
	}

	// Tier B, live: csi-resizer's ControllerModifyVolume, the node plugin rewrites the cgroup.
	start := time.Now()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: devenv.QuickstartNamespace, Name: qosClaim}}
	if err := env.Client.Patch(ctx, pvc, client.RawPatch(types.MergePatchType,
		[]byte(`{"spec":{"volumeAttributesClassName":"`+qosTierB+`"}}`))); err != nil {
		return "", fmt.Errorf("PVC %s to %s: %w", qosClaim, qosTierB, err)
	}
	if err := poll(ctx, 2*time.Minute, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return err
		}
		if current(pvc) != qosTierB {
			return fmt.Errorf("PVC %s: status.currentVolumeAttributesClassName %q, modify status %+v", qosClaim, current(pvc), pvc.Status.ModifyVolumeStatus)
		}
		return nil
	}); err != nil {
		return "", err
	}
	modified := time.Since(start)
	if err := qosApplied(ctx, env, qosClaim, pod.Spec.NodeName); err != nil {
		return "", err
	}
	// The node plugin reported tier B: every cgroup of the pod holds it now (no wait for a
	// later round).
	if err := qosInForce(string(pod.UID), qosRateB); err != nil {
		return "", fmt.Errorf("tier %s reported applied: %w; %s", qosTierB, err, qosNodeLog(ctx, env, pod.Spec.NodeName))
	}
	gotB, err := qosMeasure(ctx, env, qosRateB)
	if err != nil {
		return "", fmt.Errorf("tier %s: %w", qosTierB, err)
	}
	if err := notAboveLimit(gotB, qosRateB); err != nil {
		return "", fmt.Errorf("tier %s: %w; %s; %s", qosTierB, err, podCgroupLimits(string(pod.UID)), qosNodeLog(ctx, env, pod.Spec.NodeName))
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil {
		return "", err
	}
	if pod.UID != uid || restartCount(&pod) != restarts {
		return "", fmt.Errorf("pod %s: UID %s → %s, restarts %d → %d: the tier change must not restart it", qosClaim, uid, pod.UID, restarts, restartCount(&pod))
	}

	// A class the claim's Placement does not declare: CreateVolume refuses it.
	var failed string
	if err := poll(ctx, 2*time.Minute, func() error {
		var evs corev1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(devenv.QuickstartNamespace)); err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind == "PersistentVolumeClaim" && ev.InvolvedObject.Name == qosRefused &&
				ev.Type == corev1.EventTypeWarning && ev.Reason == "ProvisioningFailed" {
				failed = ev.Message
				return nil
			}
		}
		return fmt.Errorf("PVC %s: no ProvisioningFailed event", qosRefused)
	}); err != nil {
		return "", err
	}
	for _, want := range []string{"InvalidArgument", strconv.Quote(qosTierA), qosPlacement, devenv.QuickstartPlacement} {
		if !strings.Contains(failed, want) {
			return "", fmt.Errorf("ProvisioningFailed event of PVC %s %q lacks %q", qosRefused, failed, want)
		}
	}
	return fmt.Sprintf("tier %s (limit %d B/s): measured %.0f B/s (%.1f %%); tier %s (limit %d B/s) after %s live: %.0f B/s (%.1f %%); pod %s UID and restart count %d unchanged\nPVC %s: ProvisioningFailed: %s",
		qosTierA, qosRateA, gotA, 100*(gotA/qosRateA-1), qosTierB, qosRateB, modified.Round(100*time.Millisecond), gotB, 100*(gotB/qosRateB-1),
		qosClaim, restarts, qosRefused, failed), nil
}

// qosApplied waits until the node plugin of node reports the claim's tier in force
// (VolumeState status.appliedAttributes at spec.attributes.generation); a report with a message
// is an error carrying it.
func qosApplied(ctx context.Context, env *devenv.Env, claim, node string) error {
	var msg string
	err := poll(ctx, time.Minute, func() error {
		var pvc corev1.PersistentVolumeClaim
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: devenv.QuickstartNamespace, Name: claim}, &pvc); err != nil {
			return err
		}
		var pv corev1.PersistentVolume
		if err := env.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
			return err
		}
		if pv.Spec.CSI == nil {
			return fmt.Errorf("PV %s is not a CSI volume", pv.Name)
		}
		var vs storev1.VolumeState
		if err := env.Client.Get(ctx, client.ObjectKey{Name: pv.Spec.CSI.VolumeHandle}, &vs); err != nil {
			return err
		}
		if vs.Spec.Attributes == nil {
			return fmt.Errorf("VolumeState %s has no spec.attributes", vs.Name)
		}
		for _, a := range vs.Status.AppliedAttributes {
			if a.NodeName == node && a.Generation == vs.Spec.Attributes.Generation {
				msg = a.Message
				return nil
			}
		}
		return fmt.Errorf("VolumeState %s: spec.attributes %+v, status.appliedAttributes %+v: node %s has not reported", vs.Name, *vs.Spec.Attributes, vs.Status.AppliedAttributes, node)
	})
	if err != nil {
		return err
	}
	if msg != "" {
		return fmt.Errorf("node %s cannot apply the limits of claim %s: %s", node, claim, msg)
	}
	return nil
}

// qosMeasure writes qosWriteSeconds' worth of limit with O_DIRECT (1 MiB blocks) in the
// claim's pod and returns the rate in bytes per second, timed in the container by
// /proc/uptime (10 ms). Two writers (dd, half the bytes each, files of their own) keep a
// write queued in the throttle at all times: with one synchronous writer every write's
// device time on a loaded host is time the throttle's budget goes unused (a run at load 50
// measured 15 % below the limit while every cgroup of the pod held it), with two the rate is
// the throttle's.
func qosMeasure(ctx context.Context, env *devenv.Env, limit int64) (float64, error) {
	half := qosWriteSeconds * limit >> 21
	n := 2 * half
	out, err := env.KubectlRun(ctx, "exec", "-n", devenv.QuickstartNamespace, qosClaim, "--", "sh", "-c",
		fmt.Sprintf("a=$(cut -d' ' -f1 /proc/uptime); dd if=/dev/zero of=/data/qos1 bs=1048576 count=%[1]d oflag=direct 2>/dev/null & p=$!; "+
			"dd if=/dev/zero of=/data/qos2 bs=1048576 count=%[1]d oflag=direct 2>/dev/null || exit 1; wait $p || exit 1; "+
			"b=$(cut -d' ' -f1 /proc/uptime); rm -f /data/qos1 /data/qos2; echo $a $b", half))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return 0, fmt.Errorf("dd in pod %s: %q", qosClaim, out)
	}
	a, errA := strconv.ParseFloat(f[0], 64)
	b, errB := strconv.ParseFloat(f[1], 64)
	if errA != nil || errB != nil || b <= a {
		return 0, fmt.Errorf("dd in pod %s: times %q", qosClaim, out)
	}
	return float64(n<<20) / (b - a), nil
}

// qosInForce says whether the host's cgroups of pod uid hold the write limit rate for some
// device: on v2 the pod's io.max, on v1 blkio.throttle.write_bps_device of the pod's cgroup
// and of every cgroup below it (at least one container's).
func qosInForce(uid string, rate int64) error {
	var dirs, limited int
	under := strings.ReplaceAll(uid, "-", "_")
	want := " " + strconv.FormatInt(rate, 10)
	_ = filepath.WalkDir("/sys/fs/cgroup", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || !strings.Contains(path, uid) && !strings.Contains(path, under) {
			return nil
		}
		if b, err := os.ReadFile(filepath.Join(path, "io.max")); err == nil {
			dirs++
			if strings.Contains(string(b), "wbps="+strconv.FormatInt(rate, 10)) {
				limited++
			}
			return filepath.SkipDir // v2: hierarchical, the pod's cgroup is enough
		}
		if b, err := os.ReadFile(filepath.Join(path, "blkio.throttle.write_bps_device")); err == nil {
			dirs++
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasSuffix(l, want) {
					limited++
					break
				}
			}
		}
		return nil
	})
	if dirs == 0 || limited != dirs || dirs == 1 && !strings.Contains(podCgroupLimits(uid), "io.max") {
		return fmt.Errorf("write limit %d B/s in %d of %d cgroups of pod %s: %s", rate, limited, dirs, uid, podCgroupLimits(uid))
	}
	return nil
}

// podCgroupLimits says what the host's cgroups of the pod with uid hold (io.max on v2,
// blkio.throttle.write_bps_device on v1), for the message of a rate off its limit.
func podCgroupLimits(uid string) string {
	var found []string
	under := strings.ReplaceAll(uid, "-", "_")
	_ = filepath.WalkDir("/sys/fs/cgroup", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if !strings.Contains(path, uid) && !strings.Contains(path, under) {
			return nil
		}
		for _, f := range []string{"io.max", "blkio.throttle.write_bps_device"} {
			if b, err := os.ReadFile(filepath.Join(path, f)); err == nil {
				found = append(found, fmt.Sprintf("%s/%s: %q", path, f, strings.TrimSpace(string(b))))
			}
		}
		return nil
	})
	if len(found) == 0 {
		return "no cgroup of pod " + uid + " under /sys/fs/cgroup"
	}
	return strings.Join(found, "; ")
}

// notAboveLimit fails a measured rate more than qosTolerance above limit: the throttle let
// more through than the tier allows.
func notAboveLimit(got float64, limit int64) error {
	if got/float64(limit)-1 > qosTolerance {
		return fmt.Errorf("measured %.0f B/s, limit %d B/s: %.1f %% above it, more than %.0f %%", got, limit, 100*(got/float64(limit)-1), 100*qosTolerance)
	}
	return nil
}

func current(pvc *corev1.PersistentVolumeClaim) string {
	if pvc.Status.CurrentVolumeAttributesClassName == nil {
		return ""
	}
	return *pvc.Status.CurrentVolumeAttributesClassName
}

func restartCount(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// qosClaimWithPod creates a 1 GiB claim of class sc asking for tier and a pod of the same
// name that mounts it at /data (the claim's first consumer: the classes wait for one).
func qosClaimWithPod(ctx context.Context, env *devenv.Env, name, sc, tier string) error {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: devenv.QuickstartNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName:          &sc,
			VolumeAttributesClassName: &tier,
			AccessModes:               []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:                 corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := env.Client.Create(ctx, pvc); err != nil {
		return err
	}
	grace := int64(1)
	return env.Client.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: devenv.QuickstartNamespace},
		Spec: corev1.PodSpec{
			SchedulerName:                 devenv.SchedulerProfile,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "app", Image: devenv.BusyboxImage, Command: []string{"sleep", "86400"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
		},
	})
}

// cleanupQoS deletes the case's pods, claims and Placement (its classes go with it).
func cleanupQoS(ctx context.Context, env *devenv.Env) error {
	zero := int64(0)
	for _, name := range []string{qosClaim, qosRefused} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: devenv.QuickstartNamespace, Name: name}}
		if err := env.Client.Delete(ctx, pod, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: devenv.QuickstartNamespace, Name: name}}
		if err := env.Client.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return env.Client.Delete(ctx, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: qosPlacement}})
}

// qosNodeLog is what the node plugin of node logged about the limits (its "I/O limits" lines),
// for the message of a limit not in force.
func qosNodeLog(ctx context.Context, env *devenv.Env, node string) string {
	out, err := env.KubectlRun(ctx, "get", "pods", "-n", "plinth-system", "-l", "app.kubernetes.io/component=csi-node",
		"--field-selector", "spec.nodeName="+node, "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil || strings.TrimSpace(out) == "" {
		return fmt.Sprintf("no node plugin pod on %s: %v", node, err)
	}
	name := strings.Fields(out)[0]
	logs, err := env.KubectlRun(ctx, "logs", "-n", "plinth-system", name, "-c", "plinth-csi")
	if err != nil {
		return fmt.Sprintf("logs of %s: %v", name, err)
	}
	var lines []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "limits") {
			lines = append(lines, l)
		}
	}
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return fmt.Sprintf("node plugin %s logged about limits:\n%s", name, strings.Join(lines, "\n"))
}
