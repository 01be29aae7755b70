// Package hostnqn holds the one rule for NVMe host NQNs that two nodes present at once. An
// NVMe-oF target admits hosts by host NQN alone (nvmet's allowed_hosts): two nodes with the same
// host NQN — cloned machine images that share /etc/nvme/hostnqn — would both be admitted to every
// volume published to either. The node plugin (Node annotation plinth.dev/host-nqn), the agent
// (Agent status.hostNQN) and the CSI controller (the ACL built at ControllerPublish) apply the
// rule without importing each other: a leaf package.
package hostnqn

import (
	"fmt"
	"slices"
	"strings"
)

// ReasonDuplicate is the condition and event reason of a host NQN that another node already
// presents (PascalCase, like every Plinth reason).
const ReasonDuplicate = "DuplicateHostNQN"

// Rejected decides whether node self may register (or keep) a host NQN that the nodes others
// also present. holds says whether self already had it registered before it saw them. The
// first registration keeps the NQN: self is rejected when another node holds it and self does
// not. When both already hold it (two registrations that raced), the node whose name sorts
// first keeps it and the others are rejected, so every node reaches the same answer without
// talking to the others. No others: never rejected.
func Rejected(self string, holds bool, others []string) bool {
	if len(others) == 0 {
		return false
	}
	if !holds {
		return true
	}
	return slices.Min(others) < self
}

// Message says which nodes present nqn and what the operator does about it; self is the node
// whose registration is rejected or whose publication is refused.
func Message(nqn, self string, others []string) string {
	o := slices.Clone(others)
	slices.Sort(o)
	return fmt.Sprintf("host NQN %s of node %s is also presented by node %s: an NVMe-oF target admits hosts by host NQN alone, "+
		"so either node could reach the other's volumes; give each node its own /etc/nvme/hostnqn (nvme gen-hostnqn) and restart its plinth pods",
		nqn, self, strings.Join(o, ", "))
}
