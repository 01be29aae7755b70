package diff

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// reserveBytes resolves a pool's reserve ("10Gi", "5%", "" = 0) against a Store's physical
// size totalBytes, as the node agent does (agents/agent.ReserveBytes, which controllers may
// not import; TestReserveBytes holds the same table). Percent reserves round down to a byte.
func reserveBytes(reserve string, totalBytes int64) (int64, error) {
	reserve = strings.TrimSpace(reserve)
	if reserve == "" {
		return 0, nil
	}
	if p, ok := strings.CutSuffix(reserve, "%"); ok {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 || n > 100 {
			return 0, fmt.Errorf("reserve %q: want a percent from 0%% to 100%%", reserve)
		}
		return totalBytes/100*n + totalBytes%100*n/100, nil
	}
	q, err := resource.ParseQuantity(reserve)
	if err != nil {
		return 0, fmt.Errorf("reserve %q: %w", reserve, err)
	}
	v, ok := q.AsInt64()
	if !ok || v < 0 {
		return 0, fmt.Errorf("reserve %q: not a byte count", reserve)
	}
	return v, nil
}

// limit is what may be provisioned on allocatable bytes: × overcommitPercent/100 on thin
// backends (≤ 0 means 100), allocatable otherwise (DESIGN.md "Capacity").
func limit(allocatable int64, thin bool, overcommitPercent int64) int64 {
	if !thin {
		return allocatable
	}
	if overcommitPercent <= 0 {
		overcommitPercent = 100
	}
	return allocatable/100*overcommitPercent + allocatable%100*overcommitPercent/100
}

// FormatBytes prints n bytes with a binary unit: exact multiples as "40Gi", others with one
// decimal ("1.5Gi"); below 1 KiB as "512B".
func FormatBytes(n int64) string {
	neg := n < 0
	if neg {
		n = -n
	}
	units := []string{"Ei", "Pi", "Ti", "Gi", "Mi", "Ki"}
	s := fmt.Sprintf("%dB", n)
	for i, u := range units {
		size := int64(1) << (10 * (len(units) - i))
		if n >= size {
			if n%size == 0 {
				s = fmt.Sprintf("%d%s", n/size, u)
			} else {
				s = strconv.FormatFloat(float64(n)/float64(size), 'f', 1, 64) + u
			}
			break
		}
	}
	if neg {
		return "-" + s
	}
	return s
}
