package diff

import (
	"fmt"
	"strconv"
)

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
