package devenv

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The snapshot case: a VolumeSnapshot of a StatefulSet volume holding data, restored into a
// larger PVC on the same node, then both deleted.
const (
	// XFSSnapshotClass is the VolumeSnapshotClass that XFSPlacement renders (spec.snapshotClass).
	XFSSnapshotClass = "plinth-xfs"
	// SnapshotName is the VolumeSnapshot the case takes of the first replica's volume.
	SnapshotName = "web-0-snap"
	// RestoredName is the PVC restored from SnapshotName, and its pod.
	RestoredName = "web-0-restored"

	// snapshotsDir is the file backend's snapshot folder in a Store's directory (agents/file).
	snapshotsDir = "snapshots"
)

var (
	volumeSnapshotGVK        = schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshot"}
	volumeSnapshotContentGVK = schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshotContentList"}
	volumeSnapshotClassGVK   = schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshotClass"}
)

// snapshotFiles lists the snapshot files of the file backend on every node.
func (e *Walk) snapshotFiles() []string {
	var out []string
	for _, n := range e.Nodes.Nodes {
		m, _ := filepath.Glob(filepath.Join(e.VolumeDir(n.Name), snapshotsDir, "*"))
		out = append(out, m...)
	}
	return out
}

// restoredPod runs on node and checks, at every start, the data the StatefulSet's first
// replica wrote (its checksum file came along in the snapshot).
func restoredPod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: RestoredName, Namespace: QuickstartNamespace},
		Spec: corev1.PodSpec{
			SchedulerName: SchedulerProfile,
			// A local volume restores on the node that holds the snapshot: the pod goes there.
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{Name: "app", Image: BusyboxImage, Command: []string{"sh", "-c", "cd /data && sha256sum -c data.sha256 && exec sleep 86400"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: RestoredName}}}},
		},
	}
}

// sha256Of is the checksum of /data/data.bin in pod name.
func (e *Walk) sha256Of(ctx context.Context, name string) (string, error) {
	out, err := e.KubectlRun(ctx, "exec", "-n", QuickstartNamespace, name, "--", "sha256sum", "/data/data.bin")
	if err != nil {
		return "", err
	}
	f := strings.Fields(out)
	if len(f) == 0 || len(f[0]) != 64 {
		return "", fmt.Errorf("sha256sum in %s: %q", name, out)
	}
	return f[0], nil
}

// workloadSnapshot takes a VolumeSnapshot of data-web-0 (1Gi, 4 MiB of data) through
// snapshot-controller and csi-snapshotter, waits for readyToUse, restores it into a 2Gi PVC on
// web-0's node, checks that the restored pod holds the same data (sha256) and that its
// filesystem has the larger size (NodeStageVolume grew it), then deletes the snapshot and the
// restored PVC and counts what is left: no VolumeSnapshot, VolumeSnapshotContent,
// VolumeSnapshotState, snapshot file, restored volume file or loop device.
func (e *Walk) workloadSnapshot(ctx context.Context, ws *WorkloadSummary) error {
	src := workloadPod(0)
	title := "VolumeSnapshot " + SnapshotName + " of " + workloadPVC(0) + " → readyToUse; PVC " + RestoredName + " (2Gi) restored from it on the same node → same sha256, df shows 2Gi; both deleted → nothing left"
	return e.step(title, []string{"csi-controller", "csi-node", "agent"}, func() (string, error) {
		var pod corev1.Pod
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: src}, &pod); err != nil {
			return "", err
		}
		want, err := e.sha256Of(ctx, src)
		if err != nil {
			return "", err
		}
		if err := poll(ctx, time.Minute, func() error {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(volumeSnapshotClassGVK)
			return e.Client.Get(ctx, client.ObjectKey{Name: XFSSnapshotClass}, u)
		}); err != nil {
			return "", fmt.Errorf("VolumeSnapshotClass %s rendered from placement %s: %w", XFSSnapshotClass, XFSPlacement, err)
		}
		before := len(e.snapshotFiles())
		start := time.Now()
		vs := &unstructured.Unstructured{}
		vs.SetGroupVersionKind(volumeSnapshotGVK)
		vs.SetNamespace(QuickstartNamespace)
		vs.SetName(SnapshotName)
		if err := unstructured.SetNestedField(vs.Object, XFSSnapshotClass, "spec", "volumeSnapshotClassName"); err != nil {
			return "", err
		}
		if err := unstructured.SetNestedField(vs.Object, workloadPVC(0), "spec", "source", "persistentVolumeClaimName"); err != nil {
			return "", err
		}
		if err := e.Client.Create(ctx, vs); err != nil {
			return "", err
		}
		var restoreSize, content string
		if err := poll(ctx, 3*time.Minute, func() error {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(volumeSnapshotGVK)
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: SnapshotName}, u); err != nil {
				return err
			}
			ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
			if !ready {
				msg, _, _ := unstructured.NestedString(u.Object, "status", "error", "message")
				return fmt.Errorf("VolumeSnapshot %s not readyToUse (error: %q)", SnapshotName, msg)
			}
			restoreSize, _, _ = unstructured.NestedString(u.Object, "status", "restoreSize")
			content, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeSnapshotContentName")
			return nil
		}); err != nil {
			return "", err
		}
		ready := time.Since(start)
		var states storev1.VolumeSnapshotStateList
		if err := e.Client.List(ctx, &states); err != nil {
			return "", err
		}
		files := e.snapshotFiles()
		if len(states.Items) != 1 || len(files) != before+1 {
			return "", fmt.Errorf("after one VolumeSnapshot: %d VolumeSnapshotStates, snapshot files %v (%d before); want 1 and one more", len(states.Items), files, before)
		}
		lines := []string{fmt.Sprintf("%s readyToUse %.1fs after it was created: content %s, restoreSize %s, VolumeSnapshotState %s, file %s on %s",
			SnapshotName, ready.Seconds(), content, restoreSize, states.Items[0].Name, filepath.Base(files[len(files)-1]), pod.Spec.NodeName)}

		class := XFSClass
		apiGroup := volumeSnapshotGVK.Group
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: RestoredName, Namespace: QuickstartNamespace},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: &class,
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}},
				DataSource:       &corev1.TypedLocalObjectReference{APIGroup: &apiGroup, Kind: volumeSnapshotGVK.Kind, Name: SnapshotName},
			},
		}
		start = time.Now()
		if err := e.Client.Create(ctx, pvc); err != nil {
			return "", err
		}
		if err := e.Client.Create(ctx, restoredPod(pod.Spec.NodeName)); err != nil {
			return "", err
		}
		restored, err := e.waitPod(ctx, RestoredName, "", 4*time.Minute)
		if err != nil {
			return "", err
		}
		ws.Restored = time.Since(start)
		_, id, err := e.volumeOf(ctx, RestoredName)
		if err != nil {
			return "", err
		}
		got, err := e.sha256Of(ctx, RestoredName)
		if err != nil {
			return "", err
		}
		if got != want {
			return "", fmt.Errorf("data.bin in %s has sha256 %s, %s in %s", RestoredName, got, want, src)
		}
		kib, err := e.dfKiB(ctx, RestoredName)
		if err != nil {
			return "", err
		}
		// 2Gi less xfs's own metadata: well above the source's 1Gi.
		if kib < 3*(1<<20)/2 {
			return "", fmt.Errorf("df /data in %s shows %d KiB: the restored filesystem was not grown to its 2Gi device", RestoredName, kib)
		}
		lines = append(lines, fmt.Sprintf("%s Running on %s %.1fs after the PVC was created (VolumeState %s): data.bin sha256 %s… as in %s; df /data %d KiB",
			RestoredName, restored.Spec.NodeName, ws.Restored.Seconds(), id, want[:12], src, kib))

		// The snapshot first (its restore is independent of it), then the restored PVC.
		if err := e.Client.Delete(ctx, vs); err != nil && !apierrors.IsNotFound(err) {
			return "", err
		}
		if err := poll(ctx, 3*time.Minute, func() error {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(volumeSnapshotGVK)
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: SnapshotName}, u); !apierrors.IsNotFound(err) {
				return fmt.Errorf("VolumeSnapshot %s still there (finalizers %v, %v)", SnapshotName, u.GetFinalizers(), err)
			}
			contents := &unstructured.UnstructuredList{}
			contents.SetGroupVersionKind(volumeSnapshotContentGVK)
			if err := e.Client.List(ctx, contents); err != nil {
				return err
			}
			var states storev1.VolumeSnapshotStateList
			if err := e.Client.List(ctx, &states); err != nil {
				return err
			}
			if n := len(contents.Items); n != 0 {
				return fmt.Errorf("%d VolumeSnapshotContents left (first %s, finalizers %v)", n, contents.Items[0].GetName(), contents.Items[0].GetFinalizers())
			}
			if n := len(states.Items); n != 0 {
				return fmt.Errorf("%d VolumeSnapshotStates left (first %s, finalizers %v)", n, states.Items[0].Name, states.Items[0].Finalizers)
			}
			if f := e.snapshotFiles(); len(f) != before {
				return fmt.Errorf("snapshot files %v, want %d", f, before)
			}
			return nil
		}); err != nil {
			return "", err
		}
		// The restored volume does not depend on the snapshot: its data is still there.
		if got, err := e.sha256Of(ctx, RestoredName); err != nil || got != want {
			return "", fmt.Errorf("restored data after the snapshot was deleted: sha256 %s, %v", got, err)
		}
		if err := e.unclaim(ctx, RestoredName, id); err != nil {
			return "", err
		}
		lines = append(lines, fmt.Sprintf("%s deleted → 0 VolumeSnapshotContents, 0 VolumeSnapshotStates, %d snapshot files; %s deleted → PV, VolumeState, file and loop device gone",
			SnapshotName, before, RestoredName))
		return strings.Join(lines, "\n"), nil
	})
}
