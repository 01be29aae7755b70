package csi

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/nvmeauth"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The node plugin reads the Agents (status.address and status.hostKeys of the storage nodes
// its controllers connect to) when its host secrets were rotated.
//
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=agents,verbs=get;list

// rotateKeys makes every controller of this node that authenticated with DH-HMAC-CHAP
// re-authenticate with the host secret of the node's host Secret when it holds another (the
// controller rotated it: Protocol keyGeneration). A rotation keeps the controller secret; a
// controller whose controller secret differs too is left alone (one sysfs write
// re-authenticates with what the kernel then holds: two would make a failing round between
// them). The order is the storage node's first: a controller switches only once the Agent of
// the storage node it connects to (by address) lists the Secret's key id for this host in
// status.hostKeys, that is once the target's host entry holds the new secret; a target asked
// with a secret it does not hold drops the connection. A controller that is reconnecting gets
// the secret too: the kernel presents it at its next attempt. Without authenticated
// controllers it reads nothing from the API; errors are logged and the next round retries.
// Secrets are never logged: controllers, Secret and key id are.
func (d *Driver) rotateKeys(ctx context.Context) {
	if d.live == nil || d.initiator == nil || d.hostNQN == "" || !d.initiator.AuthUsable() {
		return
	}
	ctrls, err := d.initiator.AuthControllers(d.hostNQN)
	if err != nil {
		d.log.Error(err, "key rotation: list the authenticated NVMe controllers")
		return
	}
	if len(ctrls) == 0 {
		return
	}
	ns := d.opts.AuthNamespace
	if ns == "" {
		ns = DefaultAuthNamespace
	}
	name := nvmeauth.SecretName(d.opts.NodeName)
	var sec corev1.Secret
	if err := d.live.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sec); err != nil {
		d.log.Error(err, "key rotation: read the host Secret", "secret", ns+"/"+name)
		return
	}
	if got := sec.Annotations[nvmeauth.AnnotationHostNQN]; got != d.hostNQN {
		return // for another NQN: the controller makes it anew; stage reports it
	}
	key, ctrlKey := string(sec.Data[nvmeauth.KeyHostSecret]), string(sec.Data[nvmeauth.KeyCtrlSecret])
	keyID := sec.Annotations[nvmeauth.AnnotationKeyID]
	if _, _, err := nvmeauth.Decode(key); err != nil || keyID == "" {
		return // malformed, or made before key ids (nothing to order a switch by)
	}
	var agents *storev1.AgentList
	for _, c := range ctrls {
		if c.Secret == key {
			continue
		}
		if c.CtrlSecret != "" && c.CtrlSecret != ctrlKey {
			// both secrets changed (a new host NQN or hash, not a rotation): a live switch would
			// re-authenticate once with one new and one old secret and fail (the target drops
			// the connection), so the controller keeps its secrets until it is staged again
			d.log.Info("key rotation: the controller secret changed too; restage the volume to use the new secrets", "controller", c.Name, "subsystem", c.SubsysNQN, "secret", ns+"/"+name)
			continue
		}
		if agents == nil {
			agents = &storev1.AgentList{}
			if err := d.live.List(ctx, agents); err != nil {
				d.log.Error(err, "key rotation: list the Agents")
				return
			}
		}
		if !targetHolds(agents.Items, c.Address, d.hostNQN, keyID) {
			d.log.V(1).Info("key rotation: the storage node does not hold the new secrets yet", "controller", c.Name, "address", c.Address, "keyID", keyID)
			continue
		}
		if err := d.initiator.Reauthenticate(c.Name, key, ""); err != nil {
			d.log.Error(err, "key rotation: hand the new secrets to the controller", "controller", c.Name, "subsystem", c.SubsysNQN)
			continue
		}
		d.log.Info("re-authenticating an NVMe controller with the rotated DH-HMAC-CHAP secrets", "controller", c.Name, "subsystem", c.SubsysNQN,
			"address", c.Address, "secret", ns+"/"+name, "keyID", keyID, "bidirectional", c.CtrlSecret != "")
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
