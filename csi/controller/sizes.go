package controller

import (
	"errors"
	"fmt"
)

// DefaultVolumeBytes is the size of a volume whose CreateVolume names no capacity range
// (CSI spec: "the Plugin MAY choose an implementation-defined capacity range"): 1 GiB.
const DefaultVolumeBytes int64 = 1 << 30

// DefaultExtentBytes is the unit sizes round to when a Store does not report
// status.extentBytes yet: 1 MiB, the file backend's unit.
const DefaultExtentBytes int64 = 1 << 20

// ErrOutOfRange means no multiple of the unit lies in [required, limit] (CSI OUT_OF_RANGE).
var ErrOutOfRange = errors.New("capacity range cannot be satisfied")

// RoundSize returns the volume size for a CSI CapacityRange on a store whose allocation unit
// is unit bytes: required rounded UP to the unit (never smaller than asked:
// external-provisioner deletes a volume reported smaller), never above limit (0 = no limit).
// With neither set it is DefaultVolumeBytes, or limit rounded down when that is smaller.
// Negative values, limit < required, or no unit multiple within the range are ErrOutOfRange
// (CSI spec, CapacityRange).
func RoundSize(required, limit, unit int64) (int64, error) {
	if unit <= 0 {
		unit = DefaultExtentBytes
	}
	if required < 0 || limit < 0 {
		return 0, fmt.Errorf("%w: negative bytes (required %d, limit %d)", ErrOutOfRange, required, limit)
	}
	if limit > 0 && required > limit {
		return 0, fmt.Errorf("%w: required %d > limit %d", ErrOutOfRange, required, limit)
	}
	if required == 0 {
		size := roundUp(DefaultVolumeBytes, unit)
		if limit > 0 && size > limit {
			size = limit / unit * unit
			if size == 0 {
				return 0, fmt.Errorf("%w: limit %d is below the unit %d", ErrOutOfRange, limit, unit)
			}
		}
		return size, nil
	}
	size := roundUp(required, unit)
	if size < required { // overflow
		return 0, fmt.Errorf("%w: required %d too large", ErrOutOfRange, required)
	}
	if limit > 0 && size > limit {
		return 0, fmt.Errorf("%w: required %d rounds up to %d (unit %d), above limit %d", ErrOutOfRange, required, size, unit, limit)
	}
	return size, nil
}

// InRange reports whether an existing volume of size bytes satisfies a CapacityRange (0 = unset),
// the idempotency rule of CreateVolume.
func InRange(size, required, limit int64) bool {
	return size >= required && (limit == 0 || size <= limit)
}

// roundUp returns the least multiple of unit (> 0) at or above n (>= 0). Adding only the
// remainder's complement keeps every multiple up to math.MaxInt64 reachable (n + unit - 1
// overflowed for n within a unit of the top); a multiple above it wraps below n, which callers
// check.
func roundUp(n, unit int64) int64 {
	if r := n % unit; r != 0 {
		return n + (unit - r)
	}
	return n
}
