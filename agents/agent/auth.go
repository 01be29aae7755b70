package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/nvmeauth"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// errAuthSecret marks a host Secret that is missing, for another host or malformed: the
// VolumeState reports ReasonAuthSecretMissing and the host stays out of the ACL.
var errAuthSecret = errors.New("host secret not usable")

// hostSecrets is what hostAuth read from the hosts' Secrets besides the secrets: the key id
// of each host's (nvmeauth.AnnotationKeyID, "" for a Secret made before key ids) and whether
// one was made for a keyGeneration below the one the agent's spec asks for (the controller
// has not rotated it yet: read again later).
type hostSecrets struct {
	keyIDs map[string]string
	behind bool
}

// hostAuth returns the DH-HMAC-CHAP setting of every host the volume allows, from the hosts'
// Secrets (nvmeauth.SecretName(node) in Options.AuthNamespace), or nil when the volume's
// frozen protocol does not ask for authentication. A host whose Secret is missing, for another
// host NQN or malformed is left out of the map and named in the returned error (wrapping
// errAuthSecret; the other hosts are still served); any other error (reading the API) is
// returned alone. Errors name the Secret, never its data.
func (n *node) hostAuth(ctx context.Context, vs *storev1.VolumeState) (map[string]nvmet.HostAuth, hostSecrets, error) {
	meta := hostSecrets{keyIDs: map[string]string{}}
	p := vs.Spec.Policy.ProtocolSpec.NVMeoFTCP
	if p == nil || !p.Auth.Enabled() {
		return nil, meta, nil
	}
	hash, err := nvmeauth.KernelHash(p.Auth.Hash)
	if err != nil {
		return nil, meta, err
	}
	group, err := nvmeauth.KernelDHGroup(p.Auth.DHGroup)
	if err != nil {
		return nil, meta, err
	}
	wantGeneration := n.authKeyGeneration.Load()
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
			return nil, meta, fmt.Errorf("read Secret %s/%s: %w", n.opts.AuthNamespace, name, err)
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
		meta.keyIDs[pub.HostNQN] = sec.Annotations[nvmeauth.AnnotationKeyID]
		if nvmeauth.KeyGenerationOf(sec.Annotations) < wantGeneration {
			meta.behind = true
		}
	}
	return out, meta, errors.Join(unusable...)
}

// recordHostKeys notes the key ids of the secrets now in the host entries (keyIDs: host NQN
// → id) and, when one changed, asks the Agent reconciler to report them in status.hostKeys.
func (n *node) recordHostKeys(keyIDs map[string]string) {
	changed := false
	n.mu.Lock()
	if n.hostKeys == nil {
		n.hostKeys = map[string]string{}
	}
	for h, id := range keyIDs {
		if id != "" && n.hostKeys[h] != id {
			n.hostKeys[h], changed = id, true
		}
	}
	n.mu.Unlock()
	if !changed {
		return
	}
	select {
	case n.agentWake <- event.GenericEvent{Object: &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: n.opts.NodeName}}}:
	default: // a report is pending already; it reads the map when it runs
	}
}

// reportedHostKeys is status.hostKeys: the recorded key ids, sorted by host NQN.
func (n *node) reportedHostKeys() []storev1.HostKey {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]storev1.HostKey, 0, len(n.hostKeys))
	for h, id := range n.hostKeys {
		out = append(out, storev1.HostKey{HostNQN: h, KeyID: id})
	}
	slices.SortFunc(out, func(a, b storev1.HostKey) int { return strings.Compare(a.HostNQN, b.HostNQN) })
	return out
}
