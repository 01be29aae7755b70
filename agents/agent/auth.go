package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/dhchap"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// errAuthSecret marks host keys that are missing, refused, for another host or malformed: the
// VolumeState reports ReasonAuthSecretMissing and the host stays out of the ACL.
var errAuthSecret = errors.New("host secret not usable")

// hostSecrets is what hostAuth learnt of each host's keys besides the secrets, by host NQN:
// its node and the key id (dhchap.AnnotationKeyID, "" for a Secret made before key ids).
type hostSecrets struct {
	keyIDs map[string]hostKeyEntry
}

// hostKeyEntry is what the agent knows of the keys in one host entry: the host's node (to ask
// for its keys again) and their key id.
type hostKeyEntry struct {
	node, keyID string
}

// hostAuth returns the DH-HMAC-CHAP setting of every host the volume allows, with the keys of
// each (host, this node) pair from Options.Keys (docs/design.md#key-distribution), or nil when
// the volume's frozen protocol does not ask for authentication. A host whose keys are missing,
// refused, for another host NQN or malformed is left out of the map and named in the returned
// error (wrapping errAuthSecret; the other hosts are still served); any other error (asking
// the key server or the API) is returned alone. Errors never hold a key.
func (n *node) hostAuth(ctx context.Context, vs *storev1.VolumeState) (map[string]nvmet.HostAuth, hostSecrets, error) {
	meta := hostSecrets{keyIDs: map[string]hostKeyEntry{}}
	p := vs.Spec.Policy.ProtocolSpec.NVMeoFTCP
	if p == nil || !p.Auth.Enabled() {
		return nil, meta, nil
	}
	hash, err := dhchap.KernelHash(p.Auth.Hash)
	if err != nil {
		return nil, meta, err
	}
	group, err := dhchap.KernelDHGroup(p.Auth.DHGroup)
	if err != nil {
		return nil, meta, err
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
		k, err := n.keys.HostKey(ctx, pub.NodeName, n.opts.NodeName)
		switch {
		case errors.Is(err, hostkeys.ErrNotFound) || errors.Is(err, hostkeys.ErrUnusable) || errors.Is(err, hostkeys.ErrRefused):
			unusable = append(unusable, fmt.Errorf("%w: keys of node %s: %w", errAuthSecret, pub.NodeName, err))
			continue
		case err != nil:
			return nil, meta, fmt.Errorf("keys of node %s: %w", pub.NodeName, err)
		}
		if k.HostNQN != pub.HostNQN {
			unusable = append(unusable, fmt.Errorf("%w: the keys of node %s are for host NQN %q, the publication names %q (the controller makes them anew)", errAuthSecret, pub.NodeName, k.HostNQN, pub.HostNQN))
			continue
		}
		a := nvmet.HostAuth{Key: k.Key, CtrlKey: k.CtrlKey, Hash: hash, DHGroup: group}
		if _, _, err := dhchap.Decode(a.Key); err != nil {
			unusable = append(unusable, fmt.Errorf("%w: host key of node %s: %w", errAuthSecret, pub.NodeName, err))
			continue
		}
		if a.CtrlKey != "" {
			if _, _, err := dhchap.Decode(a.CtrlKey); err != nil {
				unusable = append(unusable, fmt.Errorf("%w: controller key of node %s: %w", errAuthSecret, pub.NodeName, err))
				continue
			}
		}
		out[pub.HostNQN] = a
		meta.keyIDs[pub.HostNQN] = hostKeyEntry{node: pub.NodeName, keyID: k.KeyID}
	}
	return out, meta, errors.Join(unusable...)
}

// recordHostKeys notes the key ids of the secrets now in the host entries (keyIDs: by host
// NQN) and, when one changed, asks the Agent reconciler to report them in status.hostKeys.
func (n *node) recordHostKeys(keyIDs map[string]hostKeyEntry) {
	changed := false
	n.mu.Lock()
	if n.hostKeys == nil {
		n.hostKeys = map[string]hostKeyEntry{}
	}
	for h, e := range keyIDs {
		if e.keyID != "" && n.hostKeys[h] != e {
			changed = changed || n.hostKeys[h].keyID != e.keyID
			n.hostKeys[h] = e
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
	for h, e := range n.hostKeys {
		out = append(out, storev1.HostKey{HostNQN: h, KeyID: e.keyID})
	}
	slices.SortFunc(out, func(a, b storev1.HostKey) int { return strings.Compare(a.HostNQN, b.HostNQN) })
	return out
}
