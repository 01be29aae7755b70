package guestnode

import (
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// The spread pool: a thin pool on every node's /dev/vdb (the storage guest's second disk, the
// worker's), exported with the NVMe-oF Protocol of the first commit, and its class spread
// across the zone label.
const (
	spreadPool  = "zthin"
	spreadVG    = "plinth-z"
	spreadClass = spreadPool + "-nvme"
	spreadSet   = "spread"
	zoneKey     = corev1.LabelTopologyZone
)

// testSpread: Expected: the two guests in two zones (topology.kubernetes.io/zone zone-a and
// zone-b on their Nodes) each carry a Store of a second pool (a thin pool on /dev/vdb of every
// node with a zone label), committed to Git and applied by Flux with a Placement of an Immediate NVMe-oF class
// that sets spreadAcross on the zone label. A StatefulSet of three (parallel pod management)
// with a claim template of that class gets its three volumes from CreateVolume spread 2+1: two
// in one zone, one in the other (at most one apart), each volume's VolumeState on a Store of
// the pool on a node of its zone; its three pods run.
func testSpread(t *testing.T, s *scene) {
	zones := map[string]string{}
	for i, n := range s.nodes {
		zone := fmt.Sprintf("zone-%c", 'a'+i)
		zones[n.name] = zone
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, zoneKey, zone)
		if _, err := s.cs.CoreV1().Nodes().Patch(t.Context(), n.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	objs := []client.Object{
		&policyv1.StoragePool{TypeMeta: metav1.TypeMeta{Kind: "StoragePool"}, ObjectMeta: metav1.ObjectMeta{Name: spreadPool}, Spec: policyv1.StoragePoolSpec{
			// every node placed in a zone (both guests, labelled above): an empty selector
			// selects no node
			NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: zoneKey, Operator: metav1.LabelSelectorOpExists}}},
			Backend: policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: spreadVG, Devices: []string{"/dev/vdb"},
				ThinPool: &policyv1.ThinPool{Name: "pool", SizePercent: 80}}},
			Reserve: "5%", OvercommitPercent: ptr.To[int32](400)}},
		&policyv1.Placement{TypeMeta: metav1.TypeMeta{Kind: "Placement"}, ObjectMeta: metav1.ObjectMeta{Name: spreadClass}, Spec: policyv1.PlacementSpec{
			PoolRef: policyv1.LocalObjectReference{Name: spreadPool}, ProtocolRef: policyv1.LocalObjectReference{Name: volumeClass},
			StorageClass: policyv1.StorageClassTemplate{Name: spreadClass, VolumeBindingMode: "Immediate"},
			Filesystem:   policyv1.Filesystem{FSType: "ext4"}, SpreadAcross: zoneKey}},
	}
	t0 := time.Now()
	if err := devenv.CommitServed(s.policyRepo, s.policyURL, "a pool on every node, a class spread across zones", policyFiles(t, objs, "spread.yaml")); err != nil {
		t.Fatal(err)
	}
	poll(t, 8*time.Minute, 2*time.Second, "Flux applied the spread pool and both Stores Ready", func() error {
		for _, o := range objs {
			got := o.DeepCopyObject().(client.Object)
			if err := s.c.Get(t.Context(), client.ObjectKeyFromObject(o), got); err != nil {
				return err
			}
			if got.GetLabels()["kustomize.toolkit.fluxcd.io/name"] != fluxPolicyName {
				return fmt.Errorf("%s labels %v: not applied by Flux", o.GetName(), got.GetLabels())
			}
		}
		if _, err := s.cs.StorageV1().StorageClasses().Get(t.Context(), spreadClass, metav1.GetOptions{}); err != nil {
			return err
		}
		for _, n := range s.nodes {
			var st storev1.Store
			if err := s.c.Get(t.Context(), client.ObjectKey{Name: storev1.StoreName(spreadPool, n.name)}, &st); err != nil {
				return err
			}
			if !apimeta.IsStatusConditionTrue(st.Status.Conditions, "Ready") || st.Status.Capacity == nil {
				return fmt.Errorf("store %s not ready: %+v", st.Name, st.Status.Conditions)
			}
		}
		return nil
	})
	t.Logf("TIMING spread policy committed → both Stores Ready %s", time.Since(t0).Round(time.Millisecond))

	labels := map[string]string{"app": spreadSet}
	class := spreadClass
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: spreadSet, Namespace: volumeNS},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3), ServiceName: spreadSet, PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
					Command:      []string{"sh", "-c", "grep ' /data ' /proc/mounts; echo done; exec sleep 3600"},
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
					TerminationGracePeriodSeconds: ptr.To[int64](1)}},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &class,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}}}}}
	t1 := time.Now()
	if _, err := s.cs.AppsV1().StatefulSets(volumeNS).Create(t.Context(), sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	perZone := map[string]int{}
	poll(t, 8*time.Minute, 2*time.Second, "the three claims Bound", func() error {
		clear(perZone)
		for i := range 3 {
			name := fmt.Sprintf("data-%s-%d", spreadSet, i)
			pvc, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if pvc.Status.Phase != corev1.ClaimBound {
				return fmt.Errorf("%s %s", name, pvc.Status.Phase)
			}
			pv, err := s.cs.CoreV1().PersistentVolumes().Get(t.Context(), pvc.Spec.VolumeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			var vs storev1.VolumeState
			if err := s.c.Get(t.Context(), client.ObjectKey{Name: pv.Spec.CSI.VolumeHandle}, &vs); err != nil {
				return err
			}
			found := false
			for _, n := range s.nodes {
				if vs.Spec.StoreName == storev1.StoreName(spreadPool, n.name) {
					perZone[zones[n.name]]++
					found = true
				}
			}
			if !found {
				return fmt.Errorf("volume of %s on store %s, not of pool %s", name, vs.Spec.StoreName, spreadPool)
			}
		}
		return nil
	})
	t.Logf("TIMING StatefulSet of three created → claims Bound %s: volumes per zone %v", time.Since(t1).Round(time.Millisecond), perZone)
	counts := []int{perZone["zone-a"], perZone["zone-b"]}
	slices.Sort(counts)
	if !slices.Equal(counts, []int{1, 2}) {
		t.Errorf("volumes of the StatefulSet per zone: %v, want 2+1", perZone)
	}
	for i := range 3 {
		waitRunning(t, s.cs, fmt.Sprintf("%s-%d", spreadSet, i))
	}
	t.Logf("TIMING StatefulSet of three created → pods Running %s", time.Since(t1).Round(time.Millisecond))
}
