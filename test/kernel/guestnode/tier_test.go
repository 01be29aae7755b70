package guestnode

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// The NVMe-oF class's tiers (guestPolicy): VolumeAttributesClasses rendered from its Placement,
// each a write limit in bytes per second.
const (
	tierA     = volumeClass + "-2m"
	tierB     = volumeClass + "-4m"
	tierRateA = 2 << 20
	tierRateB = 4 << 20
)

// guestTiers are the NVMe-oF Placement's attributes classes: the two tiers of testTierLimits.
func guestTiers() []policyv1.AttributesClassTemplate {
	return []policyv1.AttributesClassTemplate{
		{Name: tierA, Limits: policyv1.IOLimits{WriteBytesPerSecond: ptr.To[int64](tierRateA)}},
		{Name: tierB, Limits: policyv1.IOLimits{WriteBytesPerSecond: ptr.To[int64](tierRateB)}},
	}
}

// testTierLimits: Expected: on the worker guest, whose kubelet runs pods in cgroup v2 (the
// unified hierarchy: io.max, not v1's blkio files), a claim of the NVMe-oF class created in
// tier A (a VolumeAttributesClass the chart's controller rendered from the Placement Flux
// applied) is consumed by a pod there, and the chart's node plugin writes A's write limit into
// io.max of the pod's cgroup, for the NVMe namespace's device and nothing else on it. The claim
// moved to tier B live (csi-resizer → ControllerModifyVolume, which answers once the node
// plugin reported the new generation applied) has B's limit in io.max the moment the claim's
// status names B, with the pod neither restarted nor replaced. Deleted, the claim leaves no
// PersistentVolume behind.
func testTierLimits(t *testing.T, s *scene) {
	w := s.worker()
	const claim, podName = "tier-data", "tier-user"
	poll(t, 3*time.Minute, time.Second, "VolumeAttributesClasses "+tierA+" and "+tierB, func() error {
		for _, name := range []string{tierA, tierB} {
			if _, err := s.cs.StorageV1().VolumeAttributesClasses().Get(t.Context(), name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	class, tier := volumeClass, tierA
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: volumeNS},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class, VolumeAttributesClassName: &tier,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}}
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Create(t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: volumeNS},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{corev1.LabelHostname: w.name},
			Containers: []corev1.Container{{Name: "c", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", "echo done; exec sleep 3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
			TerminationGracePeriodSeconds: ptr.To[int64](1)}}
	defer s.deleteClaim(t, podName, claim)
	t0 := time.Now()
	if _, err := s.cs.CoreV1().Pods(volumeNS).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, s.cs, podName)
	t.Logf("TIMING tier %s claim and pod created → pod Running on %s %s", tierA, w.name, time.Since(t0).Round(time.Millisecond))
	p, err := s.cs.CoreV1().Pods(volumeNS).Get(t.Context(), podName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// busybox's stat names no cgroup2 magic: the mount table says which hierarchy it is
	if out := w.sh(t, time.Minute, "awk '$2 == \"/sys/fs/cgroup\" {print $3}' /proc/mounts"); strings.TrimSpace(out) != "cgroup2" {
		t.Fatalf("%s's /sys/fs/cgroup is %q, want the unified hierarchy (cgroup2)", w.name, strings.TrimSpace(out))
	}
	// The device under the pod's volume (the kubelet's publish mount), and every io.max line
	// of the pod's cgroup (kubelet's cgroupfs driver names it pod<uid>, the systemd driver
	// ...pod<uid with _>.slice).
	ioMax := func() (dev string, lines []string, err error) {
		out := w.sh(t, time.Minute, fmt.Sprintf(`src=$(awk '$2 ~ "/pods/%[1]s/volumes/kubernetes.io~csi/" {print $1}' /proc/mounts | head -1)
[ -n "$src" ] || { echo "no mount of pod %[1]s"; exit 0; }
echo "dev $(cat /sys/class/block/$(basename $src)/dev) $src"
u=%[1]s; d=$(find /sys/fs/cgroup -maxdepth 4 -type d \( -name "*pod$u" -o -name "*pod$(echo $u | tr - _).slice" \) | head -1)
[ -n "$d" ] || { echo "no cgroup of pod %[1]s"; exit 0; }
echo "cgroup $d"; sed 's/^/io.max /' $d/io.max`, p.UID))
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) >= 2 && f[0] == "dev":
				dev = f[1]
			case len(f) >= 2 && f[0] == "io.max":
				lines = append(lines, strings.Join(f[1:], " "))
			}
		}
		if dev == "" {
			return "", nil, fmt.Errorf("%s: %s", w.name, strings.TrimSpace(out))
		}
		return dev, lines, nil
	}
	want := func(rate int) func(string) string {
		return func(dev string) string { return fmt.Sprintf("%s rbps=max wbps=%d riops=max wiops=max", dev, rate) }
	}
	inForce := func(line func(string) string) error {
		dev, lines, err := ioMax()
		if err != nil {
			return err
		}
		if len(lines) != 1 || lines[0] != line(dev) {
			return fmt.Errorf("io.max of pod %s: %q, want exactly %q", p.UID, lines, line(dev))
		}
		return nil
	}
	// Written at publish, before the container started (v2 limits the pod's cgroup, which
	// every container of it is below): the first read after Running holds it, but the claim's
	// status may still be on its way, so both are awaited together.
	poll(t, 2*time.Minute, 2*time.Second, "tier "+tierA+" in force", func() error {
		if err := s.currentTier(t, claim, tierA); err != nil {
			return err
		}
		return inForce(want(tierRateA))
	})
	t1 := time.Now()
	patch := fmt.Sprintf(`{"spec":{"volumeAttributesClassName":%q}}`, tierB)
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Patch(t.Context(), claim, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 3*time.Minute, time.Second, "claim "+claim+" in tier "+tierB, func() error { return s.currentTier(t, claim, tierB) })
	t.Logf("TIMING claim moved to tier %s live %s", tierB, time.Since(t1).Round(time.Millisecond))
	if err := inForce(want(tierRateB)); err != nil {
		t.Errorf("the claim's status names tier %s: %v", tierB, err)
	}
	p2, err := s.cs.CoreV1().Pods(volumeNS).Get(t.Context(), podName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p2.UID != p.UID || len(p2.Status.ContainerStatuses) != 1 || p2.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("pod %s was replaced or restarted by the tier change: UID %s → %s, %+v", podName, p.UID, p2.UID, p2.Status.ContainerStatuses)
	}
}

// currentTier is nil once claim's status.currentVolumeAttributesClassName is tier.
func (s *scene) currentTier(t *testing.T, claim, tier string) error {
	c, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(t.Context(), claim, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if cur := c.Status.CurrentVolumeAttributesClassName; cur == nil || *cur != tier {
		return fmt.Errorf("claim %s: status.currentVolumeAttributesClassName %v, modify status %+v", claim, ptr.Deref(cur, "<none>"), c.Status.ModifyVolumeStatus)
	}
	return nil
}

// deleteClaim deletes pod podName and claim (in volumeNS) and waits until the claim's
// PersistentVolume is gone (the class's reclaim policy is Delete); what fails is an error of t.
// It is deferred by the step, so it reports with Errorf rather than ending t.
func (s *scene) deleteClaim(t *testing.T, podName, claim string) {
	ctx := t.Context()
	c, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(ctx, claim, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("claim %s: %v", claim, err)
		return
	}
	if err := s.cs.CoreV1().Pods(volumeNS).Delete(ctx, podName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete pod %s: %v", podName, err)
	}
	if err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Delete(ctx, claim, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete claim %s: %v", claim, err)
	}
	pv := c.Spec.VolumeName
	if pv == "" {
		return
	}
	if err := wait.Poll(ctx, 5*time.Minute, 2*time.Second, func() error {
		_, err := s.cs.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	}); err != nil {
		t.Errorf("PersistentVolume %s of claim %s deleted: %v", pv, claim, err)
	}
}
