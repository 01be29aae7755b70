package csi_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// The tier-change harness (issue "QoS and live tuning"): N bound claims of one class on tier
// A, then every claim's spec.volumeAttributesClassName set to tier B at once — what Flux's
// kustomize-controller applies for one commit that changes the tier of N claims, stood in
// for by N merge patches from 16 workers — and the time until every claim's
// status.currentVolumeAttributesClassName is B. The real csi-provisioner and csi-resizer
// (identical flags for both drivers, those of kustomize/csi/controller.yaml) on the real API
// server and kube-controller-manager of the shared control plane. The drivers:
//   - plinth: `plinth csi --mode controller` with the real agent and the file backend, the
//     tiers declared on the Placement (ControllerModifyVolume checks each against it and
//     records it in the VolumeState; no node stages the volumes, so no node is waited for);
//   - floor: noopModifier, a CSI controller that answers ControllerModifyVolume at once —
//     the floor of what csi-resizer and the API server cost.

// tierWorkers is how many claims are patched at once (kustomize-controller applies a
// commit's objects with a bounded concurrency too).
const tierWorkers = 16

// BenchmarkTierChange: PLINTH_BENCH_TIER_PVCS (default 300) claims move from tier A to tier B.
// Reports per driver: tier-s (first patch → last claim with status.currentVolumeAttributesClassName
// B; the target is ≤ 60 s for 300) and tier-claims/s. b.N is ignored: run it with
// -benchtime 1x.
func BenchmarkTierChange(b *testing.B) {
	n := controlplane.BenchKnob(b, "PLINTH_BENCH_TIER_PVCS", 300, 1)
	controlplane.RequireBinaries(b, controlplane.BinCSIProvisioner, controlplane.BinCSIResizer)
	cp := sharedControlPlane(b)
	for _, d := range []struct {
		row   string
		setup func(b *testing.B) (sock, driver string, params map[string]string, tierA, tierB map[string]string)
	}{
		{"floor", func(b *testing.B) (string, string, map[string]string, map[string]string, map[string]string) {
			return startNoopModifier(b), noopModifierName, nil, map[string]string{"tier": "a"}, map[string]string{"tier": "b"}
		}},
		{"plinth", func(b *testing.B) (string, string, map[string]string, map[string]string, map[string]string) {
			plinth := buildPlinth(b, "")
			params := fileBackendNodeRefresh(b, cp, plinth, "tier", 10*time.Second)
			burstNodeTopology(b, cp, "tier-node")
			a, bb := tierTemplate("tier-a", 64<<20), tierTemplate("tier-b", 16<<20)
			placement := params[policyv1.ParamPlacement]
			c := kubeClient(b, cp.Admin.Config)
			var pl policyv1.Placement
			if err := c.Get(b.Context(), client.ObjectKey{Name: placement}, &pl); err != nil {
				b.Fatal(err)
			}
			pl.Spec.AttributesClasses = []policyv1.AttributesClassTemplate{a, bb}
			if err := c.Update(b.Context(), &pl); err != nil {
				b.Fatal(err)
			}
			return startCSIProcess(b, cp, plinth, "controller", ""), policyv1.DriverName, params,
				policyv1.AttributesClassParameters(placement, &a), policyv1.AttributesClassParameters(placement, &bb)
		}},
	} {
		b.Run(d.row, func(b *testing.B) {
			sock, driver, params, pa, pb := d.setup(b)
			runTierChange(b, cp, "tier-"+d.row, sock, driver, params, pa, pb, n)
		})
	}
}

func tierTemplate(name string, writeBPS int64) policyv1.AttributesClassTemplate {
	return policyv1.AttributesClassTemplate{Name: name, Limits: policyv1.IOLimits{WriteBytesPerSecond: &writeBPS}}
}

func runTierChange(b *testing.B, cp *controlplane.ControlPlane, name, sock, driver string, params, tierA, tierB map[string]string, n int) {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		b.Fatal(err)
	}
	ns, class, vacA, vacB := name, name, name+"-a", name+"-b"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	bind, reclaim := storagev1.VolumeBindingImmediate, corev1.PersistentVolumeReclaimDelete
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: driver,
		Parameters: params, VolumeBindingMode: &bind, ReclaimPolicy: &reclaim}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	for vac, p := range map[string]map[string]string{vacA: tierA, vacB: tierB} {
		if _, err := cs.StorageV1().VolumeAttributesClasses().Create(ctx, &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: vac},
			DriverName: driver, Parameters: p}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	// kustomize/csi/controller.yaml's flags (leader election aside)
	var sidecars []*controlplane.Process
	common := []string{"--csi-address=" + sock, "--kubeconfig=" + cp.Admin.Kubeconfig, "--leader-election=false", "--kube-api-qps=50", "--kube-api-burst=100", "--v=2"}
	for _, sc := range []struct {
		bin  string
		args []string
	}{
		{controlplane.BinCSIProvisioner, []string{"--feature-gates=Topology=true", "--extra-create-metadata", "--timeout=60s"}},
		{controlplane.BinCSIResizer, []string{"--timeout=120s"}},
	} {
		p, err := cp.StartProcess(ctx, controlplane.ProcessSpec{Name: sc.bin + "-" + name, Binary: sc.bin, Args: append(append([]string(nil), common...), sc.args...),
			Env: []string{"NAMESPACE=" + ns}})
		if err != nil {
			b.Fatal(err)
		}
		sidecars = append(sidecars, p)
		b.Cleanup(func() {
			if b.Failed() {
				b.Logf("--- %s log, last lines:\n%s", sc.bin, p.Tail(30))
			}
			p.Stop() //nolint:errcheck
		})
	}

	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("claim-%03d", i)
	}
	parallel(b, names, func(claim string) error {
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeAttributesClassName: &vacA,
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("4Mi")}}}},
			metav1.CreateOptions{})
		return err
	})
	b.Cleanup(func() { deleteTierClaims(b, cs, ns, n) })
	onTier := func(vac string) func() error {
		return func() error {
			for _, p := range sidecars {
				if p.Exited() {
					b.Fatalf("a sidecar exited:\n%s", p.Tail(20))
				}
			}
			list, err := cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			done := 0
			for _, pvc := range list.Items {
				if pvc.Status.Phase == corev1.ClaimBound && pvc.Status.CurrentVolumeAttributesClassName != nil && *pvc.Status.CurrentVolumeAttributesClassName == vac {
					done++
				}
			}
			if done != n {
				return fmt.Errorf("%d of %d claims Bound on %s", done, n, vac)
			}
			return nil
		}
	}
	if err := wait.Poll(ctx, 15*time.Minute, time.Second, onTier(vacA)); err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	start := time.Now()
	patch := []byte(`{"spec":{"volumeAttributesClassName":"` + vacB + `"}}`)
	parallel(b, names, func(claim string) error {
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claim, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err := wait.Poll(ctx, 10*time.Minute, 250*time.Millisecond, onTier(vacB)); err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	b.StopTimer()
	b.ReportMetric(took.Seconds(), "tier-s")
	b.ReportMetric(float64(n)/took.Seconds(), "tier-claims/s")
	b.ReportMetric(0, "ns/op")
	b.Logf("%s: %d claims from %s to %s in %s (%.1f claims/s)", name, n, vacA, vacB, took.Round(100*time.Millisecond), float64(n)/took.Seconds())
}

// parallel runs f for every name, tierWorkers at a time; any error fails b.
func parallel(b *testing.B, names []string, f func(string) error) {
	work := make(chan string)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []string
	)
	for range tierWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				if err := f(name); err != nil {
					mu.Lock()
					errs = append(errs, name+": "+err.Error())
					mu.Unlock()
				}
			}
		}()
	}
	for _, name := range names {
		work <- name
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		sort.Strings(errs)
		b.Fatalf("%d failed, first: %s", len(errs), errs[0])
	}
}

// deleteTierClaims deletes the claims of ns and waits until their PVs are gone (reclaim
// Delete: DeleteVolume through the provisioner), so that the next driver's run starts clean.
func deleteTierClaims(b *testing.B, cs kubernetes.Interface, ns string, n int) {
	ctx := context.Background()
	if err := cs.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Errorf("delete the claims of %s: %v", ns, err)
		return
	}
	if err := wait.Poll(ctx, 10*time.Minute, time.Second, func() error {
		pvs, err := cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		left := 0
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
				left++
			}
		}
		if left > 0 {
			return fmt.Errorf("%d PVs of the %d claims of %s left", left, n, ns)
		}
		return nil
	}); err != nil {
		b.Error(err)
	}
}

// noopModifierName is the floor driver's name.
const noopModifierName = "floor-tier.noop.csi.plinth.dev"

// noopModifier is noopController that also answers ControllerModifyVolume and
// ControllerExpandVolume at once, with a Node service that has no capabilities: csi-resizer
// refuses to start for a driver that can neither expand nor answer NodeGetCapabilities.
type noopModifier struct {
	noopController
	csispec.UnimplementedNodeServer
}

func (noopModifier) NodeGetCapabilities(context.Context, *csispec.NodeGetCapabilitiesRequest) (*csispec.NodeGetCapabilitiesResponse, error) {
	return &csispec.NodeGetCapabilitiesResponse{}, nil
}

func (noopModifier) ControllerExpandVolume(_ context.Context, req *csispec.ControllerExpandVolumeRequest) (*csispec.ControllerExpandVolumeResponse, error) {
	return &csispec.ControllerExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}, nil
}

func (noopModifier) GetPluginInfo(context.Context, *csispec.GetPluginInfoRequest) (*csispec.GetPluginInfoResponse, error) {
	return &csispec.GetPluginInfoResponse{Name: noopModifierName, VendorVersion: "0"}, nil
}

func (noopModifier) ControllerGetCapabilities(context.Context, *csispec.ControllerGetCapabilitiesRequest) (*csispec.ControllerGetCapabilitiesResponse, error) {
	var caps []*csispec.ControllerServiceCapability
	for _, c := range []csispec.ControllerServiceCapability_RPC_Type{csispec.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, csispec.ControllerServiceCapability_RPC_MODIFY_VOLUME,
		csispec.ControllerServiceCapability_RPC_EXPAND_VOLUME} {
		caps = append(caps, &csispec.ControllerServiceCapability{Type: &csispec.ControllerServiceCapability_Rpc{Rpc: &csispec.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csispec.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (noopModifier) ControllerModifyVolume(context.Context, *csispec.ControllerModifyVolumeRequest) (*csispec.ControllerModifyVolumeResponse, error) {
	return &csispec.ControllerModifyVolumeResponse{}, nil
}

func startNoopModifier(b *testing.B) string {
	return serveCSI(b, "tier-floor-", noopModifier{}, noopModifier{}, noopModifier{})
}
