package controller

import (
	"errors"
	"testing"
)

func TestRoundSize(t *testing.T) {
	const mib = 1 << 20
	const ext = 4 * mib
	for _, tc := range []struct {
		name                  string
		required, limit, unit int64
		want                  int64
		outOfRange            bool
	}{
		{"one byte → one extent", 1, 0, ext, 4194304, false},
		{"1 GiB + 1 → 257 extents", 1073741825, 0, ext, 1077936128, false},
		{"required = limit aligned", 10737418240, 10737418240, ext, 10737418240, false},
		{"203 MiB → 204 MiB", 212860928, 0, ext, 213909504, false},
		{"no range → default", 0, 0, ext, DefaultVolumeBytes, false},
		{"limit only, below default → rounded down", 0, 10*mib + 5, ext, 8 * mib, false},
		{"limit below one unit", 0, mib, ext, 0, true},
		{"rounding crosses limit", 1, 2 * mib, ext, 0, true},
		{"required > limit", 2 * mib, mib, mib, 0, true},
		{"negative", -1, 0, ext, 0, true},
		{"unknown unit → 1 MiB", 1, 0, 0, mib, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RoundSize(tc.required, tc.limit, tc.unit)
			if tc.outOfRange {
				if !errors.Is(err, ErrOutOfRange) {
					t.Errorf("RoundSize = %d, %v; want ErrOutOfRange", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("RoundSize = %d, %v; want %d", got, err, tc.want)
			}
			if got < tc.required {
				t.Errorf("size %d below required %d", got, tc.required)
			}
		})
	}
}

func TestInRange(t *testing.T) {
	const gib = 1 << 30
	if !InRange(10*gib, 8*gib, 0) || InRange(10*gib, 20*gib, 20*gib) || !InRange(10*gib, 10*gib, 10*gib) || InRange(10*gib, 0, 5*gib) {
		t.Error("InRange disagrees with CreateVolume's idempotency rule (size within required..limit)")
	}
}
