package node

import (
	"context"
	"errors"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/nvme"
	"github.com/plinth-storage/plinth/internal/dhchap"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// DefaultAuthNamespace is the namespace of the DH-HMAC-CHAP host Secrets in the shipped
// manifests (the controller's).
const DefaultAuthNamespace = "plinth-system"

// The node plugin holds no Secret permission: it gets its keys from the controller's key server
// (Options.Keys, docs/design.md#key-distribution).

// hostSecrets puts this node's DH-HMAC-CHAP secrets toward storage node target into t for a
// volume whose protocol asks for mode (only DHHMACCHAP is known). target is the publish
// context's volume.PublishTargetNode, or "" for a publication made before it existed (the Agent whose
// status.address is t.Address names it then). Errors never hold a key: ErrInvalid for an
// unknown mode, ErrPrecondition when this kernel cannot authenticate or the keys are missing,
// refused, for another host NQN or malformed (the CO retries; the controller makes the Secret
// once the node's host NQN is known), ErrUnavailable when they could not be asked for.
func (s *Service) hostSecrets(ctx context.Context, t *nvme.Target, mode, target string, bidirectional bool) error {
	if mode != string(policyv1.AuthDHHMACCHAP) {
		return volume.Errorf(volume.ErrInvalid, "publish context asks for authentication %q: only %s is known", mode, policyv1.AuthDHHMACCHAP)
	}
	if !s.initiator.AuthUsable() {
		return volume.Errorf(volume.ErrPrecondition, "node %s: the volume needs DH-HMAC-CHAP but this kernel has no NVMe host authentication (CONFIG_NVME_HOST_AUTH, Linux 6.0 or newer built with it)", s.nodeName)
	}
	if s.keys == nil {
		return volume.Errorf(volume.ErrPrecondition, "the volume needs DH-HMAC-CHAP: no key server or API server to get the host keys from")
	}
	if target == "" {
		var err error
		if target, err = s.targetAt(ctx, t.Address); err != nil {
			return err
		}
	}
	k, err := s.keys.HostKey(ctx, s.nodeName, target)
	switch {
	case errors.Is(err, hostkeys.ErrNotFound) || errors.Is(err, hostkeys.ErrUnusable) || errors.Is(err, hostkeys.ErrRefused):
		return volume.Errorf(volume.ErrPrecondition, "keys of node %s for storage node %s: %v", s.nodeName, target, err)
	case err != nil:
		return volume.Errorf(volume.ErrUnavailable, "keys of node %s for storage node %s: %v", s.nodeName, target, err)
	}
	if k.HostNQN != s.hostNQN {
		return volume.Errorf(volume.ErrPrecondition, "the keys of node %s are for host NQN %q, this node is %q (the controller makes them anew)", s.nodeName, k.HostNQN, s.hostNQN)
	}
	if _, _, err := dhchap.Decode(k.Key); err != nil {
		return volume.Errorf(volume.ErrPrecondition, "host key of node %s for storage node %s: %v", s.nodeName, target, err)
	}
	t.DHCHAPSecret = k.Key
	if bidirectional {
		if _, _, err := dhchap.Decode(k.CtrlKey); err != nil {
			return volume.Errorf(volume.ErrPrecondition, "controller key of node %s for storage node %s: %v", s.nodeName, target, err)
		}
		t.DHCHAPCtrlSecret = k.CtrlKey
	}
	return nil
}

// targetAt returns the name of the Agent whose status.address is address (the storage node of
// a publication made before publish contexts named it). ErrPrecondition when none is.
func (s *Service) targetAt(ctx context.Context, address string) (string, error) {
	if s.live == nil {
		return "", volume.Errorf(volume.ErrPrecondition, "the publish context names no storage node and there is no API server to find it")
	}
	var agents storev1.AgentList
	if err := s.live.List(ctx, &agents); err != nil {
		return "", volume.Errorf(volume.ErrUnavailable, "list the Agents: %v", err)
	}
	if a := agentAt(agents.Items, address); a != nil {
		return a.Name, nil
	}
	return "", volume.Errorf(volume.ErrPrecondition, "no Agent reports address %q: its storage node is unknown", address)
}

// agentAt returns the Agent whose status.address is address, or nil.
func agentAt(agents []storev1.Agent, address string) *storev1.Agent {
	for i := range agents {
		if address != "" && agents[i].Status.Address == address {
			return &agents[i]
		}
	}
	return nil
}

// optionalHostSecret puts this node's host secret for the storage node into t when the node
// has usable keys and the kernel can authenticate, for volumes that do not ask for
// authentication: nvmet keeps one key per host entry, shared by every subsystem that allows
// the host, so once a volume with DH-HMAC-CHAP allows this node, the target asks for the key on
// its other subsystems too. The kernel authenticates only when the target asks (the connect
// response's AUTHREQ), so a key given to a target that does not ask costs nothing. Without
// keys nothing is added.
func (s *Service) optionalHostSecret(ctx context.Context, t *nvme.Target, target string) {
	if s.keys == nil || !s.initiator.AuthUsable() {
		return
	}
	u := *t
	if err := s.hostSecrets(ctx, &u, string(policyv1.AuthDHHMACCHAP), target, false); err == nil {
		t.DHCHAPSecret = u.DHCHAPSecret
	}
}
