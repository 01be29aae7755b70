package v1alpha1

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Capacity arithmetic of docs/design.md, "Capacity", shared by the agents (which publish a Store's
// status.capacity) and `plinth diff` (which predicts it): one definition, so a prediction
// cannot disagree with what the agent will report.

// ReserveBytes resolves a pool's spec.reserve ("10Gi", "5%", "" or "0" = none) against a
// Store's physical size totalBytes, in bytes. Percent reserves round down to a byte and are
// computed without overflow for any int64 size. Errors name the value: a percent outside
// 0–100, or a string that is not a Kubernetes quantity of whole bytes.
func ReserveBytes(reserve string, totalBytes int64) (int64, error) {
	reserve = strings.TrimSpace(reserve)
	if reserve == "" {
		return 0, nil
	}
	if p, ok := strings.CutSuffix(reserve, "%"); ok {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 || n > 100 {
			return 0, fmt.Errorf("reserve %q: want a percent from 0%% to 100%%", reserve)
		}
		return ScalePercent(totalBytes, n), nil
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

// ProvisionLimit is how many bytes may be provisioned in total on allocatableBytes
// (physical − reserve): allocatable × overcommitPercent/100 on thin backends (LVM thin pools,
// sparse zvols and files; overcommitPercent ≤ 0 means 100, no overcommit), allocatable on
// the others. Rounds down to a byte.
func ProvisionLimit(allocatableBytes int64, thin bool, overcommitPercent int64) int64 {
	if !thin {
		return allocatableBytes
	}
	if overcommitPercent <= 0 {
		overcommitPercent = 100
	}
	return ScalePercent(allocatableBytes, overcommitPercent)
}

// ScalePercent returns bytes × percent / 100 rounded down, without the overflow of the naive
// product for byte counts up to 2^63 / percent.
func ScalePercent(bytes, percent int64) int64 {
	return bytes/100*percent + bytes%100*percent/100
}
