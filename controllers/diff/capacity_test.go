package diff

import "testing"

// TestReserveBytes checks the rules of agents/agent.ReserveBytes (empty, quantity, percent
// rounding down, out-of-range percent, negative quantity):
// the node agent and plinth diff must resolve a reserve to the same bytes.
func TestReserveBytes(t *testing.T) {
	for _, tc := range []struct {
		reserve string
		total   int64
		want    int64
		err     bool
	}{
		{"", 100, 0, false}, {"10Gi", 1 << 40, 10 << 30, false}, {"5%", 1000, 50, false},
		{"33%", 101, 33, false}, {"0%", 5, 0, false}, {"100%", 7, 7, false},
		{"101%", 7, 0, true}, {"-1%", 7, 0, true}, {"x", 7, 0, true}, {"-1Gi", 7, 0, true},
	} {
		got, err := reserveBytes(tc.reserve, tc.total)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("reserveBytes(%q, %d) = %d, %v; want %d, error %v", tc.reserve, tc.total, got, err, tc.want, tc.err)
		}
	}
	if got := limit(1000, true, 150); got != 1500 {
		t.Errorf("thin limit %d", got)
	}
	if got := limit(1000, false, 150); got != 1000 {
		t.Errorf("linear limit %d", got)
	}
}
