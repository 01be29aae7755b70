package v1alpha1

import (
	"fmt"
	"sort"
	"strconv"
)

// The VolumeAttributesClass parameters a Placement's attributesClasses render, which CSI
// hands the driver as mutable_parameters (CreateVolume) and ControllerModifyVolume. Each
// limit is a decimal integer within the bounds of IOLimits.
const (
	// AttributesClassPlacement names the Placement whose tier the class is.
	AttributesClassPlacement = "plinth.dev/placement"
	// AttributesClassName is the class's own name: CSI hands the driver the parameters only,
	// and a refusal names the class.
	AttributesClassName = "plinth.dev/attributes-class"
	// ParamReadIOPS, ParamWriteIOPS, ParamReadBytesPerSecond and ParamWriteBytesPerSecond
	// carry IOLimits' fields.
	ParamReadIOPS            = "plinth.dev/read-iops"
	ParamWriteIOPS           = "plinth.dev/write-iops"
	ParamReadBytesPerSecond  = "plinth.dev/read-bytes-per-second"
	ParamWriteBytesPerSecond = "plinth.dev/write-bytes-per-second"
)

// AttributesClassParameters are the parameters of the VolumeAttributesClass of tier t of
// Placement placement.
func AttributesClassParameters(placement string, t *AttributesClassTemplate) map[string]string {
	p := map[string]string{AttributesClassPlacement: placement, AttributesClassName: t.Name}
	for key, v := range t.Limits.fields() {
		if *v != nil {
			p[key] = strconv.FormatInt(**v, 10)
		}
	}
	return p
}

// fields maps each parameter key to its field.
func (l *IOLimits) fields() map[string]**int64 {
	return map[string]**int64{
		ParamReadIOPS: &l.ReadIOPS, ParamWriteIOPS: &l.WriteIOPS,
		ParamReadBytesPerSecond: &l.ReadBytesPerSecond, ParamWriteBytesPerSecond: &l.WriteBytesPerSecond,
	}
}

// Empty says whether no limit is set.
func (l *IOLimits) Empty() bool {
	return l == nil || l.ReadIOPS == nil && l.WriteIOPS == nil && l.ReadBytesPerSecond == nil && l.WriteBytesPerSecond == nil
}

// AttributesClassRef is what the parameters of a VolumeAttributesClass name: the class, its
// Placement and its limits.
type AttributesClassRef struct {
	Class, Placement string
	Limits           IOLimits
}

// ParseAttributesClassParameters reads the parameters AttributesClassParameters writes. The
// error names the first key, in sorted order, that is unknown, missing or out of bounds: a
// class not rendered by Plinth, or edited by hand, is refused rather than half applied.
func ParseAttributesClassParameters(params map[string]string) (AttributesClassRef, error) {
	var ref AttributesClassRef
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	f := ref.Limits.fields()
	for _, k := range keys {
		v := params[k]
		switch k {
		case AttributesClassPlacement:
			ref.Placement = v
		case AttributesClassName:
			ref.Class = v
		case ParamReadIOPS, ParamWriteIOPS, ParamReadBytesPerSecond, ParamWriteBytesPerSecond:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return ref, fmt.Errorf("parameter %s=%q: not a decimal integer", k, v)
			}
			lo, hi := int64(MinBytesPerSecondLimit), int64(MaxBytesPerSecondLimit)
			if k == ParamReadIOPS || k == ParamWriteIOPS {
				lo, hi = 1, MaxIOPSLimit
			}
			if n < lo || n > hi {
				return ref, fmt.Errorf("parameter %s=%d: out of bounds [%d, %d]", k, n, lo, hi)
			}
			*f[k] = &n
		default:
			return ref, fmt.Errorf("parameter %s: unknown (known: %s, %s, %s, %s, %s, %s)", k,
				AttributesClassPlacement, AttributesClassName, ParamReadIOPS, ParamWriteIOPS, ParamReadBytesPerSecond, ParamWriteBytesPerSecond)
		}
	}
	switch {
	case ref.Placement == "":
		return ref, fmt.Errorf("parameter %s: missing", AttributesClassPlacement)
	case ref.Class == "":
		return ref, fmt.Errorf("parameter %s: missing", AttributesClassName)
	}
	return ref, nil
}

// Equal says whether l and o set the same limits.
func (l *IOLimits) Equal(o *IOLimits) bool {
	a, b := l.fields(), o.fields()
	for k := range a {
		x, y := *a[k], *b[k]
		if (x == nil) != (y == nil) || x != nil && *x != *y {
			return false
		}
	}
	return true
}

// AttributesClass returns the tier of the Placement named name, or nil.
func (in *PlacementSpec) AttributesClass(name string) *AttributesClassTemplate {
	for i := range in.AttributesClasses {
		if in.AttributesClasses[i].Name == name {
			return &in.AttributesClasses[i]
		}
	}
	return nil
}

// ClaimAttributesClasses are the VolumeAttributesClass names a claim depends on, without
// duplicates: the one it asks for (spec.volumeAttributesClassName), the one in force
// (status.currentVolumeAttributesClassName) and the target of a modification under way
// (status.modifyVolumeStatus.targetVolumeAttributesClassName). A class any of them names is
// in use: pruning it would leave the claim's tier undefined.
func ClaimAttributesClasses(spec *string, current *string, target string) []string {
	var out []string
	add := func(s string) {
		for _, o := range out {
			if o == s {
				return
			}
		}
		if s != "" {
			out = append(out, s)
		}
	}
	if spec != nil {
		add(*spec)
	}
	if current != nil {
		add(*current)
	}
	add(target)
	return out
}
