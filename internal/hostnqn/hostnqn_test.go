package hostnqn

import (
	"strings"
	"testing"
)

func TestRejected(t *testing.T) {
	for _, tc := range []struct {
		name   string
		self   string
		holds  bool
		others []string
		want   bool
	}{
		{"alone", "b", false, nil, false},
		{"alone, holding", "b", true, nil, false},
		{"second registration", "a", false, []string{"b"}, true},
		{"first registration keeps it", "b", true, []string{"c"}, false},
		{"raced: the first name keeps it", "a", true, []string{"b"}, false},
		{"raced: the later name gives way", "b", true, []string{"a"}, true},
		{"raced with several", "b", true, []string{"c", "a"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Rejected(tc.self, tc.holds, tc.others); got != tc.want {
				t.Errorf("Rejected(%q, %v, %v) = %v, want %v", tc.self, tc.holds, tc.others, got, tc.want)
			}
		})
	}
}

// Both nodes apply the rule to what they see of each other and reach opposite answers: exactly
// one keeps the NQN.
func TestRejectedExactlyOneKeeps(t *testing.T) {
	nodes := []string{"worker-b", "worker-a", "worker-c"}
	keep := 0
	for _, n := range nodes {
		var others []string
		for _, o := range nodes {
			if o != n {
				others = append(others, o)
			}
		}
		if !Rejected(n, true, others) {
			keep++
		}
	}
	if keep != 1 {
		t.Errorf("%d nodes keep the NQN, want 1", keep)
	}
}

func TestMessageNamesBothNodes(t *testing.T) {
	m := Message("nqn.2014-08.org.nvmexpress:uuid:x", "worker-c", []string{"worker-b", "worker-a"})
	for _, want := range []string{"nqn.2014-08.org.nvmexpress:uuid:x", "worker-c", "worker-a, worker-b", "nvme gen-hostnqn"} {
		if !strings.Contains(m, want) {
			t.Errorf("message %q lacks %q", m, want)
		}
	}
}
