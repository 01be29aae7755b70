package csi_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

var (
	volumeSnapshotsGVR        = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	volumeSnapshotContentsGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
	volumeSnapshotClassesGVR  = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}
)

// File backend layout (agents/file): a volume is <directory>/<volume id>.img, a snapshot
// <directory>/snapshots/<snapshot id>@<volume id>.img.
func (s *sidecars) volumeFile(id string) string { return filepath.Join(s.volumes, id+".img") }

func (s *sidecars) snapshotFiles(t testing.TB) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(s.volumes, "snapshots", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sha256File returns the sha256 of the first n bytes of path and its size.
func sha256File(t testing.TB, path string, n int64) (string, int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.CopyN(h, f, n); err != nil {
		t.Fatalf("read %d bytes of %s: %v", n, path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), st.Size()
}

// boundVolume waits until PVC name is Bound and returns its PV name and CSI volume id.
func (s *sidecars) boundVolume(t *testing.T, name string) (pv, id string) {
	t.Helper()
	until(t, 2*time.Minute, "PVC "+name+" Bound", func() error {
		pvc, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("phase %s", pvc.Status.Phase)
		}
		pv = pvc.Spec.VolumeName
		return nil
	})
	p, err := s.cs.CoreV1().PersistentVolumes().Get(t.Context(), pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pv, p.Spec.CSI.VolumeHandle
}

// sidecarSnapshot: the real snapshot-controller and csi-snapshotter take a VolumeSnapshot of
// a PVC holding data (written into the file backend's volume file, standing in for an app),
// it becomes readyToUse with restoreSize; a larger PVC restored from it (dataSource) is Bound
// and holds the same bytes; deleting the snapshot and then the restored PVC (and the source)
// leaves no VolumeSnapshot, VolumeSnapshotContent, VolumeSnapshotState, PV, VolumeState or
// file behind.
func sidecarSnapshot(t *testing.T, s *sidecars) {
	ctx := t.Context()
	c := kubeClient(t, shared.cp.Admin.Config)
	dyn, err := dynamic.NewForConfig(shared.cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	snapClass := s.class + "-snap"
	cls := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
		"metadata": map[string]any{"name": snapClass}, "driver": policyv1.DriverName, "deletionPolicy": "Delete"}}
	if _, err := dyn.Resource(volumeSnapshotClassesGVR).Create(ctx, cls, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	snapsBefore := len(s.snapshotFiles(t))

	// The source: 64Mi with 8 MiB of random bytes at offset 1 MiB and the rest sparse.
	const srcBytes, dataOff, dataLen = 64 << 20, 1 << 20, 8 << 20
	srcPV, srcID, want := writeSnapshotSource(t, s, srcBytes, dataOff, dataLen)

	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": "snap", "namespace": s.ns},
		"spec":     map[string]any{"volumeSnapshotClassName": snapClass, "source": map[string]any{"persistentVolumeClaimName": "snap-src"}}}}
	if _, err := dyn.Resource(volumeSnapshotsGVR).Namespace(s.ns).Create(ctx, snap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var content string
	until(t, 2*time.Minute, "VolumeSnapshot readyToUse with restoreSize 64Mi", func() error {
		u, err := dyn.Resource(volumeSnapshotsGVR).Namespace(s.ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse"); !ready {
			msg, _, _ := unstructured.NestedString(u.Object, "status", "error", "message")
			return fmt.Errorf("not readyToUse (error %q)", msg)
		}
		rs, _, _ := unstructured.NestedString(u.Object, "status", "restoreSize")
		if q, err := resource.ParseQuantity(rs); err != nil || q.Value() != srcBytes {
			return fmt.Errorf("restoreSize %q, want %d bytes", rs, srcBytes)
		}
		content, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeSnapshotContentName")
		return nil
	})
	contents, err := dyn.Resource(volumeSnapshotContentsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var handle string
	for _, u := range contents.Items {
		if u.GetName() == content {
			handle, _, _ = unstructured.NestedString(u.Object, "status", "snapshotHandle")
		}
	}
	var states storev1.VolumeSnapshotStateList
	if err := c.List(ctx, &states); err != nil {
		t.Fatal(err)
	}
	var ours []string
	for _, ss := range states.Items {
		if ss.Spec.SourceVolume == srcID {
			ours = append(ours, ss.Name)
		}
	}
	files := s.snapshotFiles(t)
	if len(contents.Items) != 1 || handle == "" || len(ours) != 1 || ours[0] != handle || len(files) != snapsBefore+1 {
		t.Fatalf("after one VolumeSnapshot: %d VolumeSnapshotContents (bound %q, handle %q), VolumeSnapshotStates of the source %v, snapshot files %v (%d before); want 1, the handle, 1 and one more file",
			len(contents.Items), content, handle, ours, files, snapsBefore)
	}
	t.Logf("VolumeSnapshot snap readyToUse: content %s, VolumeSnapshotState %s, file %s", content, handle, filepath.Base(files[len(files)-1]))

	// Restore into a larger PVC: the first 64Mi are the source's bytes, the file is 128Mi.
	restored := s.pvc("snap-restored", "128Mi")
	group := "snapshot.storage.k8s.io"
	restored.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, restored, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	resPV, resID := s.boundVolume(t, "snap-restored")
	vs := &storev1.VolumeState{}
	if err := c.Get(ctx, clientKey(resID), vs); err != nil || vs.Status.Phase != storev1.VolumeReady || vs.Status.ActualBytes != 128<<20 {
		t.Fatalf("restored VolumeState %s: phase %s, %d bytes (%v); want Ready, %d", resID, vs.Status.Phase, vs.Status.ActualBytes, err, 128<<20)
	}
	got, size := sha256File(t, s.volumeFile(resID), srcBytes)
	if got != want || size != 128<<20 {
		t.Fatalf("restored file: sha256 of the first 64Mi %s, size %d; want %s (the source's) and %d", got, size, want, 128<<20)
	}
	t.Logf("PVC snap-restored Bound to %s (%s): first 64Mi sha256 %s… as the source's, file %d bytes", resPV, resID, want[:12], size)

	// Delete the snapshot first (the restore does not depend on it), then the restored PVC,
	// then the source.
	if err := dyn.Resource(volumeSnapshotsGVR).Namespace(s.ns).Delete(ctx, "snap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, 2*time.Minute, "VolumeSnapshot, its content, VolumeSnapshotState and file gone", func() error {
		if _, err := dyn.Resource(volumeSnapshotsGVR).Namespace(s.ns).Get(ctx, "snap", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("VolumeSnapshot still there (%v)", err)
		}
		if l, err := dyn.Resource(volumeSnapshotContentsGVR).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
			return fmt.Errorf("VolumeSnapshotContents left: %v (%v)", names(l), err)
		}
		if err := c.Get(ctx, client.ObjectKey{Name: handle}, &storev1.VolumeSnapshotState{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("VolumeSnapshotState %s still there (%v)", handle, err)
		}
		if n := len(s.snapshotFiles(t)); n != snapsBefore {
			return fmt.Errorf("%d snapshot files, %d before", n, snapsBefore)
		}
		return nil
	})
	if _, err := os.Stat(s.volumeFile(resID)); err != nil {
		t.Fatalf("the restored volume's file went with the snapshot: %v", err)
	}
	deleteSnapshotPVCs(t, s, c, dyn, []restoredPVC{{"snap-restored", resPV, resID}, {"snap-src", srcPV, srcID}})
}

// writeSnapshotSource makes PVC "snap-src" of srcBytes bound and writes dataLen random bytes at
// dataOff into its backing file (the rest stays sparse). It returns the PV, the volume id and
// the sha256 of the file's first srcBytes.
func writeSnapshotSource(t *testing.T, s *sidecars, srcBytes, dataOff, dataLen int64) (pv, id, sum string) {
	t.Helper()
	ctx := t.Context()
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, s.pvc("snap-src", "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv, id = s.boundVolume(t, "snap-src")
	data := make([]byte, dataLen)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(s.volumeFile(id), os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("the source's backing file: %v", err)
	}
	if _, err := f.WriteAt(data, dataOff); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	sum, size := sha256File(t, s.volumeFile(id), srcBytes)
	if size != srcBytes {
		t.Fatalf("source file %d bytes, want %d", size, srcBytes)
	}
	return pv, id, sum
}

// restoredPVC is a PVC of sidecarSnapshot with its PV and volume id.
type restoredPVC struct{ name, pv, id string }

// deleteSnapshotPVCs deletes pvcs one after the other, each until its PVC, PV, VolumeState and
// backing file are gone, then checks that nothing of the snapshot kinds is left: no
// VolumeSnapshotState of these volumes, no VolumeSnapshot, no VolumeSnapshotContent.
func deleteSnapshotPVCs(t *testing.T, s *sidecars, c client.Reader, dyn dynamic.Interface, pvcs []restoredPVC) {
	t.Helper()
	ctx := t.Context()
	for _, pvc := range pvcs {
		if err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, pvc.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		until(t, 2*time.Minute, "PVC "+pvc.name+": PVC, PV, VolumeState and file gone", func() error {
			if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, pvc.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("PVC still there (%v)", err)
			}
			if _, err := s.cs.CoreV1().PersistentVolumes().Get(ctx, pvc.pv, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("PV still there (%v)", err)
			}
			if err := c.Get(ctx, clientKey(pvc.id), &storev1.VolumeState{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("VolumeState still there (%v)", err)
			}
			if _, err := os.Stat(s.volumeFile(pvc.id)); !os.IsNotExist(err) {
				return fmt.Errorf("volume file still there (%v)", err)
			}
			return nil
		})
	}
	// Nothing of the snapshot kinds is left anywhere, finalizers included.
	var states storev1.VolumeSnapshotStateList
	if err := c.List(ctx, &states); err != nil {
		t.Fatal(err)
	}
	for _, ss := range states.Items {
		if slices.ContainsFunc(pvcs, func(p restoredPVC) bool { return ss.Spec.SourceVolume == p.id }) {
			t.Errorf("VolumeSnapshotState %s of a deleted volume left (finalizers %v)", ss.Name, ss.Finalizers)
		}
	}
	for _, gvr := range []schema.GroupVersionResource{volumeSnapshotsGVR, volumeSnapshotContentsGVR} {
		if l, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
			t.Errorf("%s left: %v (%v)", gvr.Resource, names(l), err)
		}
	}
	t.Logf("deleted snapshot, then restored and source PVCs: 0 VolumeSnapshots, 0 VolumeSnapshotContents, 0 VolumeSnapshotStates of these volumes, %d snapshot files (as before), volume files gone", len(s.snapshotFiles(t)))
}

func names(l *unstructured.UnstructuredList) []string {
	if l == nil {
		return nil
	}
	var out []string
	for _, u := range l.Items {
		out = append(out, u.GetNamespace()+"/"+u.GetName()+fmt.Sprintf(" finalizers %v", u.GetFinalizers()))
	}
	return out
}
