package node

import (
	"context"

	"github.com/plinth-storage/plinth/internal/dhchap"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The node plugin reads the Agents (status.address and status.hostKeys of the storage nodes
// its controllers connect to) in each rotation round with authenticated controllers.
//
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=agents,verbs=get;list

// RotateKeys makes every controller of this node that authenticated with DH-HMAC-CHAP
// re-authenticate with the node's current host secret for its storage node when it holds
// another (the controller rotated the node's master: Protocol keyGeneration). The storage node
// is the Agent whose status.address is the controller's address; the keys are this node's
// toward it (Options.Keys, docs/design.md#key-distribution). A rotation keeps the controller
// secret; a controller whose controller secret differs too is left alone (one sysfs write
// re-authenticates with what the kernel then holds: two would make a failing round between
// them). The order is the storage node's first: a controller switches only once that Agent
// lists the keys' key id for this host in status.hostKeys, that is once the target's host entry
// holds the new secret; a target asked with a secret it does not hold drops the connection. A
// controller that is reconnecting gets the secret too: the kernel presents it at its next
// attempt. Without authenticated controllers it asks for nothing; errors are logged and the
// next round retries. Secrets are never logged: controllers, storage node and key id are.
func (s *Service) RotateKeys(ctx context.Context) {
	if s.keys == nil || s.live == nil || s.initiator == nil || s.hostNQN == "" || !s.initiator.AuthUsable() {
		return
	}
	ctrls, err := s.initiator.AuthControllers(s.hostNQN)
	if err != nil {
		s.log.Error(err, "key rotation: list the authenticated NVMe controllers")
		return
	}
	if len(ctrls) == 0 {
		return
	}
	var agents storev1.AgentList
	if err := s.live.List(ctx, &agents); err != nil {
		s.log.Error(err, "key rotation: list the Agents")
		return
	}
	keys := map[string]*hostkeys.Key{} // per storage node; nil: not usable this round
	for _, c := range ctrls {
		a := agentAt(agents.Items, c.Address)
		if a == nil {
			s.log.V(1).Info("key rotation: no Agent reports the controller's address", "controller", c.Name, "address", c.Address)
			continue
		}
		k, asked := keys[a.Name]
		if !asked {
			got, err := s.keys.HostKey(ctx, s.nodeName, a.Name)
			if err != nil {
				s.log.Error(err, "key rotation: get this node's keys", "storageNode", a.Name)
			} else if _, _, derr := dhchap.Decode(got.Key); derr == nil && got.KeyID != "" && got.HostNQN == s.hostNQN {
				k = &got
			} // else for another NQN (stage reports it), malformed, or made before key ids
			keys[a.Name] = k
		}
		if k == nil || c.Secret == k.Key {
			continue
		}
		if c.CtrlSecret != "" && c.CtrlSecret != k.CtrlKey {
			// both secrets changed (a new host NQN or hash, not a rotation): a live switch would
			// re-authenticate once with one new and one old secret and fail (the target drops
			// the connection), so the controller keeps its secrets until it is staged again
			s.log.Info("key rotation: the controller secret changed too; restage the volume to use the new secrets", "controller", c.Name, "subsystem", c.SubsysNQN, "storageNode", a.Name)
			continue
		}
		if !targetHolds(agents.Items, c.Address, s.hostNQN, k.KeyID) {
			s.log.V(1).Info("key rotation: the storage node does not hold the new secrets yet", "controller", c.Name, "storageNode", a.Name, "keyID", k.KeyID)
			continue
		}
		if err := s.initiator.Reauthenticate(c.Name, k.Key, ""); err != nil {
			s.log.Error(err, "key rotation: hand the new secrets to the controller", "controller", c.Name, "subsystem", c.SubsysNQN)
			continue
		}
		s.log.Info("re-authenticating an NVMe controller with the rotated DH-HMAC-CHAP secrets", "controller", c.Name, "subsystem", c.SubsysNQN,
			"address", c.Address, "storageNode", a.Name, "keyID", k.KeyID, "bidirectional", c.CtrlSecret != "")
	}
}

// targetHolds reports whether the Agent whose status.address is address lists keyID for
// hostNQN in status.hostKeys.
func targetHolds(agents []storev1.Agent, address, hostNQN, keyID string) bool {
	for i := range agents {
		if address == "" || agents[i].Status.Address != address {
			continue
		}
		for _, k := range agents[i].Status.HostKeys {
			if k.HostNQN == hostNQN && k.KeyID == keyID {
				return true
			}
		}
	}
	return false
}
