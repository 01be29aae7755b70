package v1alpha1

import (
	"math"
	"testing"
)

func TestHumanBytes(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0"},
		{1023, "1023"},
		{1024, "1Ki"},
		{1536, "1.5Ki"},
		{1<<30 - 1, "1023.9Mi"}, // truncated: never shown as more than it is
		{1 << 30, "1Gi"},
		{1<<30 + 1, "1Gi"},
		{931*(1<<30) + (1<<30)/2, "931.5Gi"},
		{10 << 40, "10Ti"},
		{math.MaxInt64, "7.9Ei"},
		{-1536, "-1.5Ki"},
		{math.MinInt64, "-8Ei"},
	} {
		if got := HumanBytes(c.n); got != c.want {
			t.Errorf("HumanBytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}
