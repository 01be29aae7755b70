package v1alpha1

import "testing"

func TestReserveBytes(t *testing.T) {
	for _, tc := range []struct {
		in    string
		total int64
		want  int64
		bad   bool
	}{
		{"", 1 << 30, 0, false},
		{"0", 1 << 30, 0, false},
		{"1Gi", 10 << 30, 1 << 30, false},
		{"500M", 0, 500_000_000, false},
		{"5%", 1000, 50, false},
		{"5%", 1099, 54, false}, // 54.95 rounds down
		{"100%", 4096, 4096, false},
		{"33%", 101, 33, false},
		{"0%", 5, 0, false},
		{"-1Gi", 7, 0, true},
		{"7%", (1 << 62) + 99, (1<<62+99)/100*7 + (1<<62+99)%100*7/100, false},
		{"101%", 100, 0, true},
		{"-1%", 100, 0, true},
		{"x%", 100, 0, true},
		{"lots", 100, 0, true},
		{"1.5", 100, 0, true}, // not whole bytes
	} {
		got, err := ReserveBytes(tc.in, tc.total)
		if got != tc.want || (err != nil) != tc.bad {
			t.Errorf("ReserveBytes(%q, %d) = %d, %v; want %d (error %v)", tc.in, tc.total, got, err, tc.want, tc.bad)
		}
	}
}

func TestProvisionLimit(t *testing.T) {
	for _, tc := range []struct {
		alloc int64
		thin  bool
		pct   int64
		want  int64
	}{
		{1000, false, 300, 1000}, // overcommit applies to thin backends only
		{1000, true, 0, 1000},    // unset means 100
		{1000, true, 100, 1000},
		{1000, true, 250, 2500},
		{999, true, 150, 1498}, // 1498.5 rounds down
		{1 << 55, true, 10000, (1 << 55) * 100},
	} {
		if got := ProvisionLimit(tc.alloc, tc.thin, tc.pct); got != tc.want {
			t.Errorf("ProvisionLimit(%d, %v, %d) = %d, want %d", tc.alloc, tc.thin, tc.pct, got, tc.want)
		}
	}
}
