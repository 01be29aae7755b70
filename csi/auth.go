package csi

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/nvme"
	"github.com/plinth-storage/plinth/internal/nvmeauth"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// DefaultAuthNamespace is the namespace of the DH-HMAC-CHAP host Secrets in the shipped
// manifests (the controller's).
const DefaultAuthNamespace = "plinth-system"

// The node plugin reads its own node's host Secret (nvme-auth-<node>) by name, uncached.
//
// +kubebuilder:rbac:groups="",namespace=plinth-system,resources=secrets,verbs=get

// hostSecrets puts this node's DH-HMAC-CHAP secrets into t for a volume whose protocol asks
// for mode (only DHHMACCHAP is known). Errors are gRPC statuses that name the Secret, never
// its data: FAILED_PRECONDITION when this kernel cannot authenticate or the Secret is missing,
// for another host NQN or malformed (the CO retries; the controller makes the Secret once the
// node's host NQN is known).
func (d *Driver) hostSecrets(ctx context.Context, t *nvme.Target, mode string, bidirectional bool) error {
	if mode != string(policyv1.AuthDHHMACCHAP) {
		return status.Errorf(codes.InvalidArgument, "publish context asks for authentication %q: only %s is known", mode, policyv1.AuthDHHMACCHAP)
	}
	if !d.initiator.AuthUsable() {
		return status.Errorf(codes.FailedPrecondition, "node %s: the volume needs DH-HMAC-CHAP but this kernel has no NVMe host authentication (CONFIG_NVME_HOST_AUTH, Linux 6.0 or newer built with it)", d.opts.NodeName)
	}
	if d.live == nil {
		return status.Error(codes.FailedPrecondition, "the volume needs DH-HMAC-CHAP: no API server to read the host Secret from")
	}
	ns := d.opts.AuthNamespace
	if ns == "" {
		ns = DefaultAuthNamespace
	}
	name := nvmeauth.SecretName(d.opts.NodeName)
	var sec corev1.Secret
	if err := d.live.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sec); apierrors.IsNotFound(err) {
		return status.Errorf(codes.FailedPrecondition, "host Secret %s/%s not found (the controller makes it once this node's host NQN is known)", ns, name)
	} else if err != nil {
		return status.Errorf(codes.Unavailable, "read host Secret %s/%s: %v", ns, name, err)
	}
	if got := sec.Annotations[nvmeauth.AnnotationHostNQN]; got != d.hostNQN {
		return status.Errorf(codes.FailedPrecondition, "host Secret %s/%s is for host NQN %q, this node is %q", ns, name, got, d.hostNQN)
	}
	key, ctrlKey := string(sec.Data[nvmeauth.KeyHostSecret]), string(sec.Data[nvmeauth.KeyCtrlSecret])
	if _, _, err := nvmeauth.Decode(key); err != nil {
		return status.Errorf(codes.FailedPrecondition, "host Secret %s/%s, key %s: %v", ns, name, nvmeauth.KeyHostSecret, err)
	}
	t.DHCHAPSecret = key
	if bidirectional {
		if _, _, err := nvmeauth.Decode(ctrlKey); err != nil {
			return status.Errorf(codes.FailedPrecondition, "host Secret %s/%s, key %s: %v", ns, name, nvmeauth.KeyCtrlSecret, err)
		}
		t.DHCHAPCtrlSecret = ctrlKey
	}
	return nil
}

// optionalHostSecret puts this node's host secret into t when the node has a usable one and the
// kernel can authenticate, for volumes that do not ask for authentication: nvmet keeps one key
// per host entry, shared by every subsystem that allows the host, so once a volume with
// DH-HMAC-CHAP allows this node, the target asks for the key on its other subsystems too. The
// kernel authenticates only when the target asks (the connect response's AUTHREQ), so a key
// given to a target that does not ask costs nothing. Without a Secret nothing is added.
func (d *Driver) optionalHostSecret(ctx context.Context, t *nvme.Target) {
	if d.live == nil || !d.initiator.AuthUsable() {
		return
	}
	u := *t
	if err := d.hostSecrets(ctx, &u, string(policyv1.AuthDHHMACCHAP), false); err == nil {
		t.DHCHAPSecret = u.DHCHAPSecret
	}
}
