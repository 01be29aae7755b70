package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/internal/overrides"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// The CreateVolume parameters csi-provisioner adds with --extra-create-metadata: the PVC the
// volume is provisioned for.
const (
	ParamPVCName      = "csi.storage.k8s.io/pvc/name"
	ParamPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
)

// ReasonOverrideRefused is the reason of the Warning event on a PVC whose override
// annotations its Placement or the schema refuses (CreateVolume answers INVALID_ARGUMENT).
const ReasonOverrideRefused = "OverrideRefused"

// claimMeta reads the metadata of the PVC named by params, or nil when the provisioner does
// not pass --extra-create-metadata (as csi-sanity does not). Only metadata counts (the
// override annotations, the owner and labels that name its workload): it is read from the
// API server's watch cache (resourceVersion "0": no etcd round trip, the cheapest read of
// the API server). The provisioner found the PVC in that cache, so it holds it; when it does
// not (an API server behind the one the provisioner watches), the read goes to etcd before
// NotFound counts. Errors: ErrInvalid for a PVC that does not exist, ErrUnavailable.
func (s *Service) claimMeta(ctx context.Context, params map[string]string) (*metav1.PartialObjectMetadata, error) {
	name, ns := params[ParamPVCName], params[ParamPVCNamespace]
	if name == "" || ns == "" {
		return nil, nil
	}
	key := client.ObjectKey{Namespace: ns, Name: name}
	pvc := &metav1.PartialObjectMetadata{}
	pvc.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"))
	err := s.live.Get(ctx, key, pvc, &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: "0"}})
	if apierrors.IsNotFound(err) {
		err = s.live.Get(ctx, key, pvc)
	}
	if err != nil {
		if apierrors.IsNotFound(err) { // deleted while provisioning: the sidecar gives up too
			return nil, volume.Errorf(volume.ErrInvalid, "PVC %s/%s named by the request does not exist", ns, name)
		}
		return nil, volume.Errorf(volume.ErrUnavailable, "read PVC %s/%s: %v", ns, name, err)
	}
	return pvc, nil
}

// pvcOverrides judges the override annotations of pvc (nil: none) against pl for a volume of
// filesystem fsType: an annotation for a parameter pl does not allow, a value too long or one
// its schema refuses is INVALID_ARGUMENT naming the PVC, the annotation and the rule, also
// reported as a Warning event on the PVC.
func (s *Service) pvcOverrides(pvc *metav1.PartialObjectMetadata, pl *policyv1.Placement, fsType string) (*overrides.Set, error) {
	if pvc == nil {
		return nil, nil
	}
	o, err := overrides.Parse(pvc.Annotations, pl, fsType)
	if err != nil {
		msg := fmt.Sprintf("PVC %s/%s: %v", pvc.Namespace, pvc.Name, err)
		s.warn(pvc, ReasonOverrideRefused, "CreateVolume", msg)
		return nil, volume.Errorf(volume.ErrInvalid, "%s", msg)
	}
	return o, nil
}
