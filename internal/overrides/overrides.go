// Package overrides judges the per-PVC overrides of a Placement's parameters: the
// plinth.dev/... annotations a PVC sets (policyv1.OverrideAnnotations) for the parameters its
// Placement lists in spec.overrides.allowed, each value bounded in length and checked by the
// policy's CUE schema (the allow-lists of mkfs and mount options of #Filesystem).
// The CSI controller applies them at CreateVolume; plinth diff reports Pending PVCs a policy
// change would make invalid.
package overrides

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	cueschema "github.com/plinth-storage/plinth/schema/cue"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// Set is what one PVC changed of its placement's parameters.
type Set struct {
	// Annotations are the override annotations the PVC set (name → value), frozen into the
	// VolumeState.
	Annotations map[string]string
	mkfs        []string
	mount       []string
	strategy    policyv1.Strategy
}

// Parse judges the override annotations among annotations (a PVC's) against pl's
// spec.overrides.allowed and the schema, for a volume of filesystem fsType ("" is pl's). Each
// value is at most policyv1.OverrideValueMaxBytes long. mkfsOptions are judged as the
// volume's whole mkfs arguments, mountOptions after pl's own (#Filesystem in the schema: an
// option a Placement's contradicts is refused). It returns nil when there are none; errors
// name the annotation (the first one in name order, so the message is stable) and the rule.
func Parse(annotations map[string]string, pl *policyv1.Placement, fsType string) (*Set, error) {
	var allowed []policyv1.OverrideParameter
	if pl.Spec.Overrides != nil {
		allowed = pl.Spec.Overrides.Allowed
	}
	if fsType == "" {
		fsType = pl.Spec.Filesystem.FSType
	}
	if fsType == "" {
		fsType = "ext4"
	}
	params := make([]policyv1.OverrideParameter, 0, len(policyv1.OverrideAnnotations))
	for p := range policyv1.OverrideAnnotations {
		params = append(params, p)
	}
	sort.Slice(params, func(i, j int) bool {
		return policyv1.OverrideAnnotations[params[i]] < policyv1.OverrideAnnotations[params[j]]
	})
	o := &Set{Annotations: map[string]string{}}
	for _, p := range params {
		key := policyv1.OverrideAnnotations[p]
		raw, ok := annotations[key]
		if !ok {
			continue
		}
		if len(raw) > policyv1.OverrideValueMaxBytes {
			return nil, fmt.Errorf("annotation %s: %d bytes, more than the %d an override value may hold", key, len(raw), policyv1.OverrideValueMaxBytes)
		}
		if !slices.Contains(allowed, p) {
			return nil, fmt.Errorf("annotation %s: Placement %q does not allow overriding %s (spec.overrides.allowed: %v)", key, pl.Name, p, allowed)
		}
		var path []string
		var value any
		switch p {
		case policyv1.OverrideMkfsOptions:
			o.mkfs = strings.Fields(raw)
			path, value = []string{"filesystem"}, map[string]any{"fsType": fsType, "mkfsOptions": o.mkfs}
		case policyv1.OverrideMountOptions:
			for _, opt := range strings.Split(raw, ",") {
				if opt = strings.TrimSpace(opt); opt == "" {
					return nil, fmt.Errorf("annotation %s: empty mount option in %q", key, raw)
				}
				o.mount = append(o.mount, opt)
			}
			merged := append(slices.Clone(pl.Spec.Filesystem.MountOptions), o.mount...)
			path, value = []string{"filesystem"}, map[string]any{"fsType": fsType, "mountOptions": merged}
		case policyv1.OverrideStrategy:
			o.strategy = policyv1.Strategy(raw)
			path, value = []string{"strategy"}, raw
		}
		if err := cueschema.CheckPlacementField(path, value); err != nil {
			return nil, fmt.Errorf("annotation %s=%q: %w", key, raw, err)
		}
		o.Annotations[key] = raw
	}
	if len(o.Annotations) == 0 {
		return nil, nil
	}
	return o, nil
}

// Apply changes fs and strategy by o (nil: no change): mkfsOptions and strategy are
// replaced, mountOptions added to.
func (o *Set) Apply(fs *policyv1.Filesystem, strategy *policyv1.Strategy) {
	if o == nil {
		return
	}
	if o.mkfs != nil {
		fs.MkfsOptions = o.mkfs
	}
	if o.mount != nil {
		fs.MountOptions = append(slices.Clone(fs.MountOptions), o.mount...)
	}
	if o.strategy != "" {
		*strategy = o.strategy
	}
}
