package controlplane_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// stubDriver is a CSI Identity and Controller service that "creates" volumes
// by remembering them: enough for csi-provisioner to make PVs. Replace it by
// Plinth's CSI controller when that lands.
type stubDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer

	mu      sync.Mutex
	volumes map[string]int64 // CSI name → bytes
}

const stubDriverName = "stub.csi.plinth.dev"

func (s *stubDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: stubDriverName, VendorVersion: "0.0.0-test"}, nil
}

func (s *stubDriver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (s *stubDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (s *stubDriver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}},
	}}}, nil
}

func (s *stubDriver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	size := req.GetCapacityRange().GetRequiredBytes()
	s.mu.Lock()
	s.volumes[req.GetName()] = size
	s.mu.Unlock()
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "stub-" + req.GetName(), CapacityBytes: size}}, nil
}

func (s *stubDriver) DeleteVolume(context.Context, *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	return &csi.DeleteVolumeResponse{}, nil
}

// TestCSIProvisionerCreatesPV proves the sidecar wiring: csi-provisioner, run
// outside a pod against the control plane and a CSI driver on a unix socket,
// creates a PV for a PVC, and the PV controller binds them.
func TestCSIProvisionerCreatesPV(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinCSIProvisioner)
	cp := sharedControlPlane(t)
	ctx := t.Context()

	// Short path: unix socket paths are limited to 108 bytes.
	sockDir, err := os.MkdirTemp("", "csi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	driver := &stubDriver{volumes: map[string]int64{}}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, driver)
	csi.RegisterControllerServer(srv, driver)
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)

	// Outside a pod: no owner for CSIStorageCapacity objects, a kubeconfig, no leader election.
	creds, err := cp.AddUser(controlplane.User{Name: "csi-provisioner", Groups: []string{"system:masters"}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := cp.StartProcess(ctx, controlplane.ProcessSpec{
		Name:   "csi-provisioner",
		Binary: controlplane.BinCSIProvisioner,
		Args: []string{
			"--csi-address=" + sock,
			"--kubeconfig=" + creds.Kubeconfig,
			"--leader-election=false",
			"--capacity-ownerref-level=-1",
			"--timeout=30s",
			"--v=4",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- csi-provisioner log, last lines:\n%s", p.Tail(60))
		}
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
	})

	cs, _ := clients(t, cp.Admin)
	const ns = "provision"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, namespace(ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "stub"}, Provisioner: stubDriverName}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := "stub"
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pvName string
	eventually(t, 90*time.Second, "PVC bound to a provisioned PV", func() error {
		if p.Exited() {
			t.Fatalf("csi-provisioner exited:\n%s", p.Tail(40))
		}
		got, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("PVC phase %s", got.Status.Phase)
		}
		pvName = got.Spec.VolumeName
		return nil
	})
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != stubDriverName || pv.Spec.CSI.VolumeHandle != "stub-"+pvName {
		t.Errorf("PV source %+v, want driver %s handle stub-%s", pv.Spec.CSI, stubDriverName, pvName)
	}
	driver.mu.Lock()
	size, ok := driver.volumes[pvName]
	driver.mu.Unlock()
	if !ok || size != 1<<30 {
		t.Errorf("stub saw CreateVolume(%s) ok=%v size=%d, want 1Gi", pvName, ok, size)
	}
}
