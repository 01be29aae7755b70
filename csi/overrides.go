package csi

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/overrides"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// The CreateVolume parameters csi-provisioner adds with --extra-create-metadata: the PVC the
// volume is provisioned for.
const (
	ParamPVCName      = "csi.storage.k8s.io/pvc/name"
	ParamPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
)

// pvcOverrides reads the override annotations of the PVC named by params (nothing when the
// provisioner does not pass --extra-create-metadata, as csi-sanity does not) and judges them
// against pl: an annotation for a parameter pl does not allow, or a value its schema refuses,
// is INVALID_ARGUMENT naming the PVC and the annotation.
func pvcOverrides(ctx context.Context, r client.Reader, params map[string]string, pl *policyv1.Placement) (*overrides.Set, error) {
	name, ns := params[ParamPVCName], params[ParamPVCNamespace]
	if name == "" || ns == "" {
		return nil, nil
	}
	var pvc corev1.PersistentVolumeClaim
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pvc); err != nil {
		if apierrors.IsNotFound(err) { // deleted while provisioning: the sidecar gives up too
			return nil, status.Errorf(codes.InvalidArgument, "PVC %s/%s named by the request does not exist", ns, name)
		}
		return nil, status.Errorf(codes.Unavailable, "read PVC %s/%s: %v", ns, name, err)
	}
	o, err := overrides.Parse(pvc.Annotations, pl)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "PVC %s/%s: %v", ns, name, err)
	}
	return o, nil
}
