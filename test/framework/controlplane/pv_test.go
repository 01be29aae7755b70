package controlplane_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPVControllerBindsPrecreatedPV proves kube-controller-manager's PV
// controller runs: a PVC binds to a matching PV created beforehand.
func TestPVControllerBindsPrecreatedPV(t *testing.T) {
	cp := sharedControlPlane(t)
	ctx := t.Context()
	cs, _ := clients(t, cp.Admin)
	const ns, class = "pv-bind", "manual"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, namespace(ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-static"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: "static.csi.plinth.dev", VolumeHandle: "static-1"},
			},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	classPtr := class
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &classPtr,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "PVC bound to pv-static", func() error {
		got, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "claim", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.Phase != corev1.ClaimBound || got.Spec.VolumeName != "pv-static" {
			return fmt.Errorf("phase %s, volumeName %q", got.Status.Phase, got.Spec.VolumeName)
		}
		return nil
	})
	got, err := cs.CoreV1().PersistentVolumes().Get(ctx, "pv-static", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.VolumeBound || got.Spec.ClaimRef == nil || got.Spec.ClaimRef.Name != "claim" {
		t.Errorf("PV phase %s claimRef %+v", got.Status.Phase, got.Spec.ClaimRef)
	}
}
