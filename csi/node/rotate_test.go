package node

import (
	"testing"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// A controller switches to rotated secrets only when the Agent serving its address lists the
// Secret's key id for this host: another host's entry, another storage node's report, an older
// key id or an unknown address do not count.
func TestTargetHolds(t *testing.T) {
	const host, other = "nqn.h:a", "nqn.h:b"
	agents := []storev1.Agent{
		{Status: storev1.AgentStatus{Address: "10.0.0.1", HostKeys: []storev1.HostKey{{HostNQN: host, KeyID: "new"}, {HostNQN: other, KeyID: "x"}}}},
		{Status: storev1.AgentStatus{Address: "10.0.0.2", HostKeys: []storev1.HostKey{{HostNQN: host, KeyID: "old"}, {HostNQN: other, KeyID: "new"}}}},
		{Status: storev1.AgentStatus{HostKeys: []storev1.HostKey{{HostNQN: host, KeyID: "new"}}}}, // no address yet
	}
	for _, tc := range []struct {
		address, host, keyID string
		want                 bool
	}{
		{"10.0.0.1", host, "new", true},
		{"10.0.0.2", host, "new", false}, // that storage node still holds the old secrets
		{"10.0.0.2", other, "new", true},
		{"10.0.0.1", host, "old", false},
		{"10.0.0.3", host, "new", false},
		{"", host, "new", false}, // a controller without a known address never switches
	} {
		if got := targetHolds(agents, tc.address, tc.host, tc.keyID); got != tc.want {
			t.Errorf("targetHolds(%s, %s, %s) = %v, want %v", tc.address, tc.host, tc.keyID, got, tc.want)
		}
	}
}
