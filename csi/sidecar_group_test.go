package csi_test

import (
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

var (
	volumeGroupSnapshotsGVR        = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshots"}
	volumeGroupSnapshotContentsGVR = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotcontents"}
	volumeGroupSnapshotClassesGVR  = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotclasses"}
)

// sidecarGroupSnapshot: the real snapshot-controller and csi-snapshotter (group snapshots on)
// take a VolumeGroupSnapshot of two PVCs selected by label through CreateVolumeGroupSnapshot:
// it becomes readyToUse, its content's handle is the group whose two VolumeSnapshotStates hold
// the members; deleting it (deletionPolicy Delete) deletes the group through
// DeleteVolumeGroupSnapshot, leaving no member, VolumeSnapshot or content behind.
func sidecarGroupSnapshot(t *testing.T, s *sidecars) {
	ctx := t.Context()
	c := kubeClient(t, shared.cp.Admin.Config)
	dyn, err := dynamic.NewForConfig(shared.cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	class := s.class + "-group"
	cls := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotClass",
		"metadata": map[string]any{"name": class}, "driver": policyv1.DriverName, "deletionPolicy": "Delete"}}
	if _, err := dyn.Resource(volumeGroupSnapshotClassesGVR).Create(ctx, cls, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var pvcs []restoredPVC
	for _, name := range []string{"grp-data", "grp-wal"} {
		pvc := s.pvc(name, "64Mi")
		pvc.Labels = map[string]string{"app": "grp"}
		if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pv, id := s.boundVolume(t, name)
		pvcs = append(pvcs, restoredPVC{name, pv, id})
	}
	vgs := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
		"metadata": map[string]any{"name": "grp", "namespace": s.ns},
		"spec": map[string]any{"volumeGroupSnapshotClassName": class,
			"source": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "grp"}}}}}}
	if _, err := dyn.Resource(volumeGroupSnapshotsGVR).Namespace(s.ns).Create(ctx, vgs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var content string
	until(t, 2*time.Minute, "VolumeGroupSnapshot readyToUse", func() error {
		u, err := dyn.Resource(volumeGroupSnapshotsGVR).Namespace(s.ns).Get(ctx, "grp", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse"); !ready {
			msg, _, _ := unstructured.NestedString(u.Object, "status", "error", "message")
			return fmt.Errorf("not readyToUse (error %q)", msg)
		}
		content, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeGroupSnapshotContentName")
		return nil
	})
	u, err := dyn.Resource(volumeGroupSnapshotContentsGVR).Get(ctx, content, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	handle, _, _ := unstructured.NestedString(u.Object, "status", "volumeGroupSnapshotHandle")
	var members storev1.VolumeSnapshotStateList
	if err := c.List(ctx, &members, client.MatchingLabels{storev1.LabelGroup: handle}); err != nil {
		t.Fatal(err)
	}
	sources := map[string]bool{}
	for _, m := range members.Items {
		sources[m.Spec.SourceVolume] = m.Status.ReadyToUse
	}
	if handle == "" || len(members.Items) != 2 || !sources[pvcs[0].id] || !sources[pvcs[1].id] {
		t.Fatalf("group %q of content %s: members of volumes %v, want both PVCs' volumes %s and %s, ready", handle, content, sources, pvcs[0].id, pvcs[1].id)
	}
	t.Logf("VolumeGroupSnapshot grp readyToUse: content %s, group %s, members %s, %s", content, handle, members.Items[0].Name, members.Items[1].Name)

	if err := dyn.Resource(volumeGroupSnapshotsGVR).Namespace(s.ns).Delete(ctx, "grp", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, 2*time.Minute, "VolumeGroupSnapshot, its content, member VolumeSnapshots and contents, and VolumeSnapshotStates gone", func() error {
		if _, err := dyn.Resource(volumeGroupSnapshotsGVR).Namespace(s.ns).Get(ctx, "grp", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("VolumeGroupSnapshot still there (%v)", err)
		}
		if l, err := dyn.Resource(volumeGroupSnapshotContentsGVR).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
			return fmt.Errorf("VolumeGroupSnapshotContents left: %v (%v)", names(l), err)
		}
		for _, gvr := range []schema.GroupVersionResource{volumeSnapshotsGVR, volumeSnapshotContentsGVR} {
			if l, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
				return fmt.Errorf("member %s left: %v (%v)", gvr.Resource, names(l), err)
			}
		}
		var left storev1.VolumeSnapshotStateList
		if err := c.List(ctx, &left, client.MatchingLabels{storev1.LabelGroup: handle}); err != nil || len(left.Items) != 0 {
			return fmt.Errorf("%d members left (%v)", len(left.Items), err)
		}
		return nil
	})
	deleteSnapshotPVCs(t, s, c, dyn, pvcs)
}
