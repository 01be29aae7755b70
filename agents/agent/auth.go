package agent

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/nvmeauth"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// errAuthSecret marks a host Secret that is missing, for another host or malformed: the
// VolumeState reports ReasonAuthSecretMissing and the host stays out of the ACL.
var errAuthSecret = errors.New("host secret not usable")

// hostAuth returns the DH-HMAC-CHAP setting of every host the volume allows, from the hosts'
// Secrets (nvmeauth.SecretName(node) in Options.AuthNamespace), or nil when the volume's
// frozen protocol does not ask for authentication. A host whose Secret is missing, for another
// host NQN or malformed is left out of the map and named in the returned error (wrapping
// errAuthSecret; the other hosts are still served); any other error (reading the API) is
// returned alone. Errors name the Secret, never its data.
func (n *node) hostAuth(ctx context.Context, vs *storev1.VolumeState) (map[string]nvmet.HostAuth, error) {
	p := vs.Spec.Policy.ProtocolSpec.NVMeoFTCP
	if p == nil || !p.Auth.Enabled() {
		return nil, nil
	}
	hash, err := nvmeauth.KernelHash(p.Auth.Hash)
	if err != nil {
		return nil, err
	}
	group, err := nvmeauth.KernelDHGroup(p.Auth.DHGroup)
	if err != nil {
		return nil, err
	}
	out := map[string]nvmet.HostAuth{}
	var unusable []error
	for _, pub := range vs.Spec.Publications {
		if pub.HostNQN == "" {
			continue
		}
		if _, ok := out[pub.HostNQN]; ok {
			continue
		}
		name := nvmeauth.SecretName(pub.NodeName)
		var sec corev1.Secret
		if err := n.reader.Get(ctx, client.ObjectKey{Namespace: n.opts.AuthNamespace, Name: name}, &sec); err != nil {
			if apierrors.IsNotFound(err) {
				unusable = append(unusable, fmt.Errorf("%w: Secret %s/%s of node %s not found (the controller makes it once the node's host NQN is known)", errAuthSecret, n.opts.AuthNamespace, name, pub.NodeName))
				continue
			}
			return nil, fmt.Errorf("read Secret %s/%s: %w", n.opts.AuthNamespace, name, err)
		}
		if got := sec.Annotations[nvmeauth.AnnotationHostNQN]; got != pub.HostNQN {
			unusable = append(unusable, fmt.Errorf("%w: Secret %s/%s is for host NQN %q, the publication to node %s names %q", errAuthSecret, n.opts.AuthNamespace, name, got, pub.NodeName, pub.HostNQN))
			continue
		}
		a := nvmet.HostAuth{Key: string(sec.Data[nvmeauth.KeyHostSecret]), CtrlKey: string(sec.Data[nvmeauth.KeyCtrlSecret]), Hash: hash, DHGroup: group}
		if _, _, err := nvmeauth.Decode(a.Key); err != nil {
			unusable = append(unusable, fmt.Errorf("%w: Secret %s/%s key %s: %w", errAuthSecret, n.opts.AuthNamespace, name, nvmeauth.KeyHostSecret, err))
			continue
		}
		if a.CtrlKey != "" {
			if _, _, err := nvmeauth.Decode(a.CtrlKey); err != nil {
				unusable = append(unusable, fmt.Errorf("%w: Secret %s/%s key %s: %w", errAuthSecret, n.opts.AuthNamespace, name, nvmeauth.KeyCtrlSecret, err))
				continue
			}
		}
		out[pub.HostNQN] = a
	}
	return out, errors.Join(unusable...)
}
