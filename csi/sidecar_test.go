package csi_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// sidecars is the controller side as deployed: `plinth csi --mode controller`, the real agent
// with the file backend on this host, csi-provisioner, csi-attacher, csi-resizer and
// csi-snapshotter built from their modules, and snapshot-controller with the snapshot CRDs
// `make testbin` copies from the same module, on the control plane with
// kube-controller-manager (PV binder, expander).
type sidecars struct {
	cs    *kubernetes.Clientset
	class string
	node  string
	ns    string
	// volumes is the file backend's directory on this host.
	volumes string
}

func startSidecars(t testing.TB, name string) *sidecars {
	t.Helper()
	controlplane.RequireBinaries(t, controlplane.BinCSIProvisioner, controlplane.BinCSIAttacher, controlplane.BinCSIResizer,
		controlplane.BinCSISnapshotter, controlplane.BinSnapshotController)
	cp := sharedControlPlane(t)
	ctx := t.Context()
	bin, err := controlplane.TestBinDir()
	if err != nil {
		t.Fatal(err)
	}
	snapCRDs, _ := filepath.Glob(filepath.Join(bin, "crds", "snapshot", "*.yaml"))
	if len(snapCRDs) != 6 {
		t.Fatalf("snapshot CRDs in %s: %v, want VolumeSnapshot, VolumeGroupSnapshot and their contents and classes (make testbin)", filepath.Join(bin, "crds", "snapshot"), snapCRDs)
	}
	if err := installCRDFiles(ctx, cp.Admin.Config, snapCRDs); err != nil {
		t.Fatal(err)
	}
	plinth := buildPlinth(t, t.TempDir())
	params := fileBackendNode(t, cp, plinth, name)
	s := &sidecars{class: name + "-local", node: name + "-node", ns: name}
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	s.cs = cs
	st := &storev1.Store{}
	if err := kubeClient(t, cp.Admin.Config).Get(ctx, clientKey(storev1.StoreName(name, s.node)), st); err != nil || st.Spec.Backend.File == nil {
		t.Fatalf("Store of %s: %v", name, err)
	}
	s.volumes = st.Spec.Backend.File.Directory
	// What kubelet would do after NodeGetInfo: the topology label and the CSINode entry.
	n, err := cs.CoreV1().Nodes().Get(ctx, s.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[policyv1.TopologyKeyNode] = s.node
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: s.node},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: policyv1.DriverName, NodeID: s.node, TopologyKeys: []string{policyv1.TopologyKeyNode}}}}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The CSIDriver object the kustomize manifests carry.
	yes, fsGroup := true, storagev1.FileFSGroupPolicy
	if _, err := cs.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: policyv1.DriverName},
		Spec: storagev1.CSIDriverSpec{AttachRequired: &yes, StorageCapacity: &yes, FSGroupPolicy: &fsGroup}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	expand, bind, reclaim := true, storagev1.VolumeBindingImmediate, corev1.PersistentVolumeReclaimDelete
	scParams := map[string]string{policyv1.ParamFSType: "xfs"}
	for k, v := range params {
		scParams[k] = v
	}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: s.class}, Provisioner: policyv1.DriverName,
		Parameters: scParams, AllowVolumeExpansion: &expand, VolumeBindingMode: &bind, ReclaimPolicy: &reclaim}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// csi-provisioner publishes CSIStorageCapacity only for WaitForFirstConsumer classes, so a
	// second class of the same placement carries the capacity check.
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: s.class + "-wffc"}, Provisioner: policyv1.DriverName,
		Parameters: scParams, AllowVolumeExpansion: &expand, VolumeBindingMode: &wffc, ReclaimPolicy: &reclaim}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	sock := startCSIProcess(t, cp, plinth, "controller", "")
	for _, sc := range []struct {
		bin  string
		args []string
		env  []string
	}{
		// Outside a pod: no owner for CSIStorageCapacity objects (docs/design.md, "Real nodes").
		{controlplane.BinCSIProvisioner, []string{"--feature-gates=Topology=true", "--extra-create-metadata", "--enable-capacity",
			"--capacity-ownerref-level=-1", "--capacity-poll-interval=5s"}, []string{"NAMESPACE=" + s.ns}},
		{controlplane.BinCSIAttacher, nil, nil},
		{controlplane.BinCSIResizer, nil, nil},
		// group snapshots on, as kustomize/csi/controller.yaml and kustomize/snapshot-controller
		{controlplane.BinCSISnapshotter, []string{"--extra-create-metadata", "--feature-gates=CSIVolumeGroupSnapshot=true"}, nil},
		// Not a sidecar (no --csi-address): it serves VolumeSnapshots for every driver.
		{controlplane.BinSnapshotController, []string{"--feature-gates=CSIVolumeGroupSnapshot=true"}, nil},
	} {
		// client-go's default of 5 requests/s (burst 10) queues the provisioner's PV create
		// behind its events and PV deletes by 200–400 ms: deployments raise it
		// (kustomize/csi/controller.yaml should carry the same flags).
		args := append([]string{"--kubeconfig=" + cp.Admin.Kubeconfig, "--leader-election=false", "--v=3", "--kube-api-qps=50", "--kube-api-burst=100"}, sc.args...)
		if sc.bin != controlplane.BinSnapshotController {
			args = append(args, "--csi-address="+sock, "--timeout=60s")
		}
		p, err := cp.StartProcess(ctx, controlplane.ProcessSpec{Name: sc.bin + "-" + name, Binary: sc.bin, Args: args, Env: sc.env})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("--- %s log, last lines:\n%s", p.Name, p.Tail(40))
			}
			p.Stop() //nolint:errcheck
		})
	}
	return s
}

func (s *sidecars) pvc(name, size string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &s.class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
}

// until polls f every 20 ms (a test of the whole system observing several controllers; no
// assertion on the time it takes) until it returns nil or timeout.
func until(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	controlplane.Eventually(t, timeout, 20*time.Millisecond, what, f)
}

// TestSidecars: a PVC becomes Bound to a PV of the right size with node affinity; a
// VolumeAttachment (as the attach-detach controller would create it) is attached through
// ControllerPublish; expanding the PVC grows the volume; deleting it removes the PV and the
// volume; GetCapacity feeds CSIStorageCapacity; PVC annotations override what the Placement
// allows (sidecarOverrides).
func TestSidecars(t *testing.T) {
	if testingShort() {
		t.Skip("SKIP: -short")
	}
	s := startSidecars(t, "side")
	ctx := t.Context()
	cs := s.cs
	if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, s.pvc("data", "1Gi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pv *corev1.PersistentVolume
	until(t, 2*time.Minute, "PVC Bound", func() error {
		pvc, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("phase %s", pvc.Status.Phase)
		}
		pv, err = cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		return err
	})
	if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Value() != 1<<30 {
		t.Errorf("PV capacity %s, want 1Gi", got.String())
	}
	id := pv.Spec.CSI.VolumeHandle
	if id != storev1.VolumeID(pv.Name) || pv.Spec.CSI.FSType != "xfs" {
		t.Errorf("PV handle %s fsType %s, want %s and xfs", id, pv.Spec.CSI.FSType, storev1.VolumeID(pv.Name))
	}
	if na := pv.Spec.NodeAffinity; na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 ||
		na.Required.NodeSelectorTerms[0].MatchExpressions[0].Key != policyv1.TopologyKeyNode || na.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != s.node {
		t.Errorf("PV node affinity %+v, want %s=%s", pv.Spec.NodeAffinity, policyv1.TopologyKeyNode, s.node)
	}
	c := kubeClient(t, shared.cp.Admin.Config)
	vs := &storev1.VolumeState{}
	if err := c.Get(ctx, clientKey(id), vs); err != nil || vs.Status.Phase != storev1.VolumeReady || vs.Status.ActualBytes != 1<<30 {
		t.Fatalf("VolumeState %s: phase %s actual %d (%v)", id, vs.Status.Phase, vs.Status.ActualBytes, err)
	}

	// Publish through a VolumeAttachment, standing in for the attach-detach controller.
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va-" + pv.Name}, Spec: storagev1.VolumeAttachmentSpec{
		Attacher: policyv1.DriverName, NodeName: s.node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}}}
	if _, err := cs.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, time.Minute, "VolumeAttachment attached", func() error {
		got, err := cs.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !got.Status.Attached {
			return fmt.Errorf("not attached: %+v", got.Status.AttachError)
		}
		if got.Status.AttachmentMetadata["devicePath"] != vs.Status.DevicePath {
			return fmt.Errorf("attachment metadata %v, want devicePath %s", got.Status.AttachmentMetadata, vs.Status.DevicePath)
		}
		return nil
	})

	sidecarExpand(t, s, c, pv.Name, id)

	// Capacity tracking: the provisioner publishes GetCapacity as CSIStorageCapacity.
	until(t, time.Minute, "CSIStorageCapacity for the class", func() error {
		list, err := cs.StorageV1().CSIStorageCapacities(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, c := range list.Items {
			if c.StorageClassName == s.class+"-wffc" && c.Capacity != nil && c.Capacity.Value() > 0 {
				return nil
			}
		}
		return fmt.Errorf("%d objects, none with capacity for %s-wffc", len(list.Items), s.class)
	})

	sidecarDetachDelete(t, s, c, va.Name, pv.Name, id)

	t.Run("overrides", func(t *testing.T) { sidecarOverrides(t, s, "side-local") })
	t.Run("snapshot and restore", func(t *testing.T) { sidecarSnapshot(t, s) })
	t.Run("group snapshot", func(t *testing.T) { sidecarGroupSnapshot(t, s) })
}

// sidecarExpand grows PVC "data" of s to 2Gi: the resizer calls ControllerExpandVolume and the
// agent grows volume id, until PV pvName and the volume have 2Gi.
func sidecarExpand(t *testing.T, s *sidecars, c client.Reader, pvName, id string) {
	t.Helper()
	ctx, cs := t.Context(), s.cs
	pvc, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
	if _, err := cs.CoreV1().PersistentVolumeClaims(s.ns).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, 2*time.Minute, "PV and volume grown to 2Gi", func() error {
		got, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if q := got.Spec.Capacity[corev1.ResourceStorage]; q.Value() < 2<<30 {
			return fmt.Errorf("PV capacity %s", q.String())
		}
		vs := &storev1.VolumeState{}
		if err := c.Get(ctx, clientKey(id), vs); err != nil {
			return err
		}
		if vs.Status.ActualBytes < 2<<30 {
			return fmt.Errorf("volume %d bytes", vs.Status.ActualBytes)
		}
		return nil
	})
}

// sidecarDetachDelete deletes VolumeAttachment vaName (the attacher unpublishes), then PVC
// "data" of s: PV pvName and the VolumeState of volume id go.
func sidecarDetachDelete(t *testing.T, s *sidecars, c client.Reader, vaName, pvName, id string) {
	t.Helper()
	ctx, cs := t.Context(), s.cs
	if err := cs.StorageV1().VolumeAttachments().Delete(ctx, vaName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, time.Minute, "VolumeAttachment gone", func() error {
		if _, err := cs.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	if err := cs.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, 2*time.Minute, "PV and VolumeState deleted", func() error {
		if _, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("PV still there (%v)", err)
		}
		if err := c.Get(ctx, clientKey(id), &storev1.VolumeState{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("VolumeState still there (%v)", err)
		}
		return nil
	})
}

// BenchmarkPVCBound measures PVC creation → Bound with the real sidecars, the controller, the
// real agent and the file backend (Immediate binding), one PVC at a time (each deleted, and its
// volume gone, before the next); reports p50 and p99 in ms, and the p50 of
// when each step was seen, from the PVC's creation, by watches started before it:
// annotated (kube-controller-manager's PV binder hands the claim to the provisioner),
// vs-created (csi-provisioner → CreateVolume → VolumeState), vs-ready (the agent's work done),
// pv-created (CreateVolume answered → csi-provisioner's PV), bound (the binder's writes).
func BenchmarkPVCBound(b *testing.B) {
	s := startSidecars(b, "bench-pvc")
	ctx := context.Background()
	c := kubeClient(b, shared.cp.Admin.Config)
	pvcW, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer pvcW.Stop()
	pvW, err := s.cs.CoreV1().PersistentVolumes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer pvW.Stop()
	vsW, err := c.Watch(ctx, &storev1.VolumeStateList{})
	if err != nil {
		b.Fatal(err)
	}
	defer vsW.Stop()
	steps := []string{"annotated", "vs-created", "vs-ready", "pv-created", "bound"}
	lat := map[string][]time.Duration{}
	run := time.Now().Unix()
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("p-%d-%d", run, i)
		i++
		start := time.Now()
		created, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, s.pvc(name, "64Mi"), metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		pvName := "pvc-" + string(created.UID) // csi-provisioner's default PV name
		seen := map[string]time.Duration{}
		mark := func(step string) {
			if _, ok := seen[step]; !ok {
				seen[step] = time.Since(start)
			}
		}
		timeout := time.After(2 * time.Minute)
		for seen["bound"] == 0 {
			select {
			case <-timeout:
				b.Fatalf("PVC %s not Bound after 2 minutes; seen %v", name, seen)
			case ev := <-pvcW.ResultChan():
				if pvc, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && pvc.Name == name {
					if pvc.Annotations["volume.kubernetes.io/storage-provisioner"] != "" {
						mark("annotated")
					}
					if pvc.Status.Phase == corev1.ClaimBound {
						mark("bound")
					}
				}
			case ev := <-pvW.ResultChan():
				if pv, ok := ev.Object.(*corev1.PersistentVolume); ok && pv.Name == pvName {
					mark("pv-created")
				}
			case ev := <-vsW.ResultChan():
				if vs, ok := ev.Object.(*storev1.VolumeState); ok && vs.Spec.CSIName == pvName {
					mark("vs-created")
					if vs.Status.Phase == storev1.VolumeReady {
						mark("vs-ready")
					}
				}
			}
		}
		for _, st := range steps {
			lat[st] = append(lat[st], seen[st])
		}
		// one volume at a time: delete it and wait until the agent released it (loop device
		// detached, file removed) before the next, so volumes do not pile up on this host
		if err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		for gone := false; !gone; {
			select {
			case <-timeout:
				b.Fatalf("volume of PVC %s not deleted after 2 minutes", name)
			case <-pvcW.ResultChan():
			case <-pvW.ResultChan():
			case ev := <-vsW.ResultChan():
				vs, ok := ev.Object.(*storev1.VolumeState)
				gone = ok && vs.Spec.CSIName == pvName && ev.Type == watch.Deleted
			}
		}
	}
	reportQuantiles(b, "bound", lat["bound"])
	for _, st := range steps[:len(steps)-1] {
		ds := lat[st]
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, st+"-p50-ms")
	}
}
