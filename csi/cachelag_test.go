package csi_test

import (
	"context"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/plinth-storage/plinth/csi/controller"
	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// A Placement, its StoragePool and Protocol applied in the same reconciliation as the claims
// that use them can be named by GetCapacity and CreateVolume before the controller's informer
// has delivered them. The policy the API server holds is the one that counts: GetCapacity of
// an encrypted class counts the LUKS2 header and CreateVolume freezes the encryption, instead
// of answering "does not exist" (final for csi-provisioner) or a capacity without the header.
//
// The lag is made certain rather than hoped for: the service's cache reader is the real client
// with its reads of the three policy kinds answered NotFound, as an informer that has not
// received them answers; its live reader is the real client.
func TestPolicyNotYetInTheCache(t *testing.T) {
	cp := sharedControlPlane(t)
	c := kubeClient(t, cp.Admin.Config)
	setup(t, c, "lag", map[string]int64{"lag-node": 100 * gib})
	ctx := t.Context()
	create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: "lag-luks"}, Spec: policyv1.PlacementSpec{
		PoolRef: policyv1.LocalObjectReference{Name: "lag"}, ProtocolRef: policyv1.LocalObjectReference{Name: "lag-nvme"},
		StorageClass: policyv1.StorageClassTemplate{Name: "lag-luks"}, Encryption: &policyv1.Encryption{}}})
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: policyv1.VolumeKeyNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cacheMisses := 0
	lagging := interceptor.NewClient(c, interceptor.Funcs{Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		switch obj.(type) {
		case *policyv1.Placement, *policyv1.StoragePool, *policyv1.Protocol:
			cacheMisses++
			return apierrors.NewNotFound(schema.GroupResource{Group: policyv1.GroupVersion.Group, Resource: "policy"}, key.Name)
		}
		return cl.Get(ctx, key, obj, opts...)
	}})
	locks := &volume.Locks{}
	s := controller.New(controller.Config{Kube: lagging, Live: c, Log: testr.New(t),
		Volumes: &volume.Kind[*storev1.VolumeState]{Name: "VolumeState", New: func() *storev1.VolumeState { return &storev1.VolumeState{} },
			Locks: locks, Hub: volume.NewHub[*storev1.VolumeState](), Cache: lagging, Live: c, Writer: c, Timeout: 2 * time.Second}})
	params := map[string]string{policyv1.ParamPlacement: "lag-luks", policyv1.ParamPool: "lag", policyv1.ParamProtocol: "lag-nvme"}

	// an NVMe-oF class (the Protocol read) that encrypts (the Placement read): every store
	// counts, whatever the consumer's node, less the header
	capResp, err := s.GetCapacity(ctx, &csipb.GetCapacityRequest{Parameters: params,
		AccessibleTopology: &csipb.Topology{Segments: map[string]string{policyv1.TopologyKeyNode: "another-node"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := capResp.GetAvailableCapacity(), 100*gib-16<<20; got != want {
		t.Errorf("GetCapacity of a class the cache has not seen: %d bytes, want %d (the NVMe-oF store less the LUKS2 header)", got, want)
	}

	// CreateVolume freezes the live policy. Its wait for the agent has no informer here (the
	// service's hub is not connected), so the call may end with its wait timed out after the VolumeState
	// is written; what is asserted is the refusal it must not give and the object it wrote.
	_, err = s.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-lag", CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: mountCap(rwo), Parameters: params})
	if volume.KindOf(err) == volume.ErrInvalid { // the driver answers it InvalidArgument
		t.Fatalf("CreateVolume of a class the cache has not seen: %v", err)
	}
	vs := &storev1.VolumeState{}
	if err := c.Get(ctx, client.ObjectKey{Name: storev1.VolumeID("pvc-lag")}, vs); err != nil {
		t.Fatalf("no VolumeState after CreateVolume: %v", err)
	}
	if vs.Spec.Policy.Encryption == nil || vs.Spec.Policy.ProtocolSpec.NVMeoFTCP == nil || vs.Spec.CapacityBytes != gib+16<<20 {
		t.Errorf("frozen policy: encryption %+v, protocol %+v, backend %d bytes; want LUKS2, NVMe-oF/TCP and %d",
			vs.Spec.Policy.Encryption, vs.Spec.Policy.ProtocolSpec, vs.Spec.CapacityBytes, gib+16<<20)
	}
	// 2 reads by GetCapacity, 3 by CreateVolume: each missed the cache and went to the API server
	if cacheMisses != 5 {
		t.Errorf("%d policy reads from the cache, want 5 (a test that no longer exercises the fallback)", cacheMisses)
	}
}
