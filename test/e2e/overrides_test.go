package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/devenv"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// The claim-overrides case: a Placement that lets claims override mkfsOptions and
// mountOptions (applied by hand next to the quickstart's Git-delivered policy, on the same
// pool and protocol), one claim whose allowed overrides must arrive on the device and in the
// container's mount, one whose override the schema refuses whatever the Placement allows.
const (
	overridesPlacement = "claim-options"
	overridesClass     = "plinth-claim-options"
	overridesAllowed   = "opts-allowed"
	overridesRefused   = "opts-refused"
	// overridesMkfs is the allowed mkfs override: 1% reserved blocks, a label, 512-byte inodes
	// (mke2fs's defaults are 5%, none and 256).
	overridesMkfs = "-m 1 -L claimdata -I 512"
	// overridesMount is the allowed mount override, added after the Placement's noatime.
	overridesMount = "nosuid,nodev,noexec,commit=30"
	// overridesRefusedMount is refused by #MountOptions whatever a Placement allows.
	overridesRefusedMount = "suid"
)

// overridesMountOpts are the per-mount options the container's mountinfo must show for the
// volume, exactly: the Placement's noatime and the claim's switches, read-write. commit=30 is
// a filesystem option (mountinfo's super options).
var overridesMountOpts = []string{"rw", "noatime", "nosuid", "nodev", "noexec"}

// ClaimOverrides runs the claim-overrides case on a running Env (after the scenario) and
// returns what it found; every mismatch is an error.
func ClaimOverrides(ctx context.Context, env *devenv.Env) (string, error) {
	mkfsAnn := policyv1.OverrideAnnotations[policyv1.OverrideMkfsOptions]
	mountAnn := policyv1.OverrideAnnotations[policyv1.OverrideMountOptions]
	pl := &policyv1.Placement{
		ObjectMeta: metav1.ObjectMeta{Name: overridesPlacement},
		Spec: policyv1.PlacementSpec{
			PoolRef:      policyv1.LocalObjectReference{Name: devenv.QuickstartPool},
			ProtocolRef:  policyv1.LocalObjectReference{Name: devenv.QuickstartProtocol},
			StorageClass: policyv1.StorageClassTemplate{Name: overridesClass, ReclaimPolicy: "Delete", VolumeBindingMode: "WaitForFirstConsumer"},
			Filesystem:   policyv1.Filesystem{FSType: "ext4", MountOptions: []string{"noatime"}},
			Overrides:    &policyv1.Overrides{Allowed: []policyv1.OverrideParameter{policyv1.OverrideMkfsOptions, policyv1.OverrideMountOptions}},
		},
	}
	if err := env.Client.Create(ctx, pl); err != nil {
		return "", fmt.Errorf("create Placement %s: %w", overridesPlacement, err)
	}
	if err := poll(ctx, 2*time.Minute, func() error {
		return env.Client.Get(ctx, client.ObjectKey{Name: overridesClass}, &storagev1.StorageClass{})
	}); err != nil {
		return "", fmt.Errorf("StorageClass %s rendered: %w", overridesClass, err)
	}
	if err := claimWithPod(ctx, env, overridesAllowed, map[string]string{mkfsAnn: overridesMkfs, mountAnn: overridesMount}); err != nil {
		return "", err
	}
	if err := claimWithPod(ctx, env, overridesRefused, map[string]string{mountAnn: overridesRefusedMount}); err != nil {
		return "", err
	}

	// The allowed claim: Bound, its pod Running on a real kubelet.
	var pvc corev1.PersistentVolumeClaim
	var pod corev1.Pod
	if err := poll(ctx, 3*time.Minute, func() error {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: devenv.QuickstartNamespace, Name: overridesAllowed}, &pvc); err != nil {
			return err
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: devenv.QuickstartNamespace, Name: overridesAllowed}, &pod); err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound || pod.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("PVC %s %s, pod %s on %q", pvc.Name, pvc.Status.Phase, pod.Status.Phase, pod.Spec.NodeName)
		}
		return nil
	}); err != nil {
		return "", err
	}
	var pv corev1.PersistentVolume
	if err := env.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		return "", err
	}
	if pv.Spec.CSI == nil {
		return "", fmt.Errorf("PV %s is not a CSI volume", pv.Name)
	}
	var vs storev1.VolumeState
	if err := env.Client.Get(ctx, client.ObjectKey{Name: pv.Spec.CSI.VolumeHandle}, &vs); err != nil {
		return "", err
	}
	if vs.Status.DevicePath == "" {
		return "", fmt.Errorf("VolumeState %s has no device path", vs.Name)
	}
	fsInfo, err := checkTune2fs(ctx, vs.Status.DevicePath)
	if err != nil {
		return "", err
	}
	mountinfo, err := env.KubectlRun(ctx, "exec", "-n", devenv.QuickstartNamespace, overridesAllowed, "--", "cat", "/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	mnt, err := checkContainerMount(mountinfo, "/data")
	if err != nil {
		return "", fmt.Errorf("pod %s on %s: %w", overridesAllowed, pod.Spec.NodeName, err)
	}

	// The refused claim: the controller's OverrideRefused event naming the annotation and the
	// rule, csi-provisioner's ProvisioningFailed with the same (InvalidArgument is final for
	// csi-provisioner: it delays its retries), and still Pending with no volume after it.
	var refused, failed string
	if err := poll(ctx, 2*time.Minute, func() error {
		var evs corev1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(devenv.QuickstartNamespace)); err != nil {
			return err
		}
		refused, failed = "", ""
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind != "PersistentVolumeClaim" || ev.InvolvedObject.Name != overridesRefused || ev.Type != corev1.EventTypeWarning {
				continue
			}
			switch ev.Reason {
			case csi.ReasonOverrideRefused:
				refused = ev.Message
			case "ProvisioningFailed":
				failed = ev.Message
			}
		}
		if refused == "" || failed == "" {
			return fmt.Errorf("PVC %s: OverrideRefused %q, ProvisioningFailed %q", overridesRefused, refused, failed)
		}
		return nil
	}); err != nil {
		return "", err
	}
	for what, msg := range map[string]string{"OverrideRefused": refused, "ProvisioningFailed": failed} {
		for _, want := range []string{"PVC " + devenv.QuickstartNamespace + "/" + overridesRefused, mountAnn, strconv.Quote(overridesRefusedMount),
			"is refused: setuid files"} {
			if !strings.Contains(msg, want) {
				return "", fmt.Errorf("%s event of PVC %s %q lacks %q", what, overridesRefused, msg, want)
			}
		}
	}
	if !strings.Contains(failed, "InvalidArgument") {
		return "", fmt.Errorf("ProvisioningFailed %q: want the InvalidArgument of CreateVolume", failed)
	}
	var rpvc corev1.PersistentVolumeClaim
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: devenv.QuickstartNamespace, Name: overridesRefused}, &rpvc); err != nil {
		return "", err
	}
	if rpvc.Status.Phase != corev1.ClaimPending || rpvc.Spec.VolumeName != "" {
		return "", fmt.Errorf("PVC %s after refused provisioning: phase %s, volume %q; want Pending with none", overridesRefused, rpvc.Status.Phase, rpvc.Spec.VolumeName)
	}

	if err := cleanupOverrides(ctx, env, vs.Name); err != nil {
		return "", fmt.Errorf("clean up: %w", err)
	}
	return fmt.Sprintf("PVC %s Bound (%s), pod Running on %s\ntune2fs -l %s: %s\ncontainer mountinfo of /data: %s\nPVC %s Pending; OverrideRefused: %s\nProvisioningFailed: %s",
		overridesAllowed, vs.Name, pod.Spec.NodeName, vs.Status.DevicePath, fsInfo, mnt, overridesRefused, refused, failed), nil
}

// claimWithPod creates PVC name (1Gi of overridesClass, annotated) and a busybox pod using it
// (a WaitForFirstConsumer class provisions only for a scheduled pod).
func claimWithPod(ctx context.Context, env *devenv.Env, name string, annotations map[string]string) error {
	class := overridesClass
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: devenv.QuickstartNamespace, Annotations: annotations},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := env.Client.Create(ctx, pvc); err != nil {
		return err
	}
	grace := int64(1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: devenv.QuickstartNamespace},
		Spec: corev1.PodSpec{
			SchedulerName:                 devenv.SchedulerProfile,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "app", Image: devenv.BusyboxImage, Command: []string{"sleep", "86400"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
		},
	}
	return env.Client.Create(ctx, pod)
}

// checkTune2fs reads the superblock of dev (the staged ext4 volume) with tune2fs -l and checks
// the effect of every flag of overridesMkfs: the label, the inode size, 1% of the blocks
// reserved.
func checkTune2fs(ctx context.Context, dev string) (string, error) {
	out, err := exec.CommandContext(ctx, "tune2fs", "-l", dev).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("tune2fs -l %s: %w: %s", dev, err, out)
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	blocks, _ := strconv.ParseInt(fields["Block count"], 10, 64)
	reserved, _ := strconv.ParseInt(fields["Reserved block count"], 10, 64)
	var errs []error
	if got := fields["Filesystem volume name"]; got != "claimdata" {
		errs = append(errs, fmt.Errorf("volume name %q, want claimdata (-L)", got))
	}
	if got := fields["Inode size"]; got != "512" {
		errs = append(errs, fmt.Errorf("inode size %q, want 512 (-I)", got))
	}
	if blocks == 0 || reserved != blocks/100 {
		errs = append(errs, fmt.Errorf("%d of %d blocks reserved, want %d (-m 1)", reserved, blocks, blocks/100))
	}
	if err := errors.Join(errs...); err != nil {
		return "", fmt.Errorf("tune2fs -l %s: %w", dev, err)
	}
	return fmt.Sprintf("volume name %s, inode size %s, %d of %d blocks reserved", fields["Filesystem volume name"], fields["Inode size"], reserved, blocks), nil
}

// checkContainerMount finds the mount at target in mountinfo (a container's
// /proc/self/mountinfo) and checks that its per-mount options are exactly overridesMountOpts
// and its filesystem options hold commit=30.
func checkContainerMount(mountinfo, target string) (string, error) {
	var found []string
	for _, l := range strings.Split(mountinfo, "\n") {
		// proc(5): id parent major:minor root mount-point mount-options [optional...] - type source super-options
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 3 || f[4] != target {
			continue
		}
		found = append(found, l)
		opts := slices.Sorted(slices.Values(strings.Split(f[5], ",")))
		if want := slices.Sorted(slices.Values(overridesMountOpts)); !slices.Equal(opts, want) {
			return "", fmt.Errorf("mount options of %s: %v, want exactly %v (%s)", target, opts, want, l)
		}
		if g[0] != "ext4" || !slices.Contains(strings.Split(g[2], ","), "commit=30") {
			return "", fmt.Errorf("filesystem of %s: %s %s, want ext4 with commit=30", target, g[0], g[2])
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("%d mounts at %s, want 1: %q", len(found), target, found)
	}
	return found[0], nil
}

// cleanupOverrides deletes the case's pods, PVCs and Placement and waits until the volume id
// and the StorageClass are gone.
func cleanupOverrides(ctx context.Context, env *devenv.Env, id string) error {
	zero := int64(0)
	for _, name := range []string{overridesAllowed, overridesRefused} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: devenv.QuickstartNamespace, Name: name}}
		if err := env.Client.Delete(ctx, pod, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: devenv.QuickstartNamespace, Name: name}}
		if err := env.Client.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if err := env.Client.Delete(ctx, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: overridesPlacement}}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return poll(ctx, 3*time.Minute, func() error {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: id}, &storev1.VolumeState{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("VolumeState %s still there (%v)", id, err)
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: overridesClass}, &storagev1.StorageClass{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("StorageClass %s still there (%v)", overridesClass, err)
		}
		return nil
	})
}

// poll is wait.Poll every 100 ms.
func poll(ctx context.Context, timeout time.Duration, f func() error) error {
	return wait.Poll(ctx, timeout, 100*time.Millisecond, f)
}
