package overrides

import (
	"maps"
	"slices"
	"strings"
	"testing"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// FuzzParse feeds arbitrary PVC override annotations (a user writes them) to Parse, for a
// volume of ext4, xfs, an unknown filesystem or the placement's, with a placement that allows
// every override and one that allows none. Properties: no panic; nil
// without an override annotation; a placement that allows none refuses any; an error names
// one of the annotations given; an accepted Set records exactly the override annotations
// given, judges them the same way twice, and Apply leaves the placement's own slices alone.
func FuzzParse(f *testing.F) {
	f.Add(true, " -m  0 ", true, "noatime, nosuid", true, "Spreadout", uint8(0))
	f.Add(false, "", true, "noatime,,nosuid", false, "", uint8(1))
	f.Add(true, "-O ^has_journal", false, "", true, "binpack", uint8(2))
	f.Add(false, "", false, "", false, "", uint8(3))
	f.Fuzz(func(t *testing.T, hasMkfs bool, mkfs string, hasMount bool, mount string, hasStrategy bool, strategy string, fs uint8) {
		fsType := []string{"", "ext4", "xfs", "btrfs"}[fs%4]
		ann := map[string]string{"unrelated.example/x": "y"}
		given := map[string]string{}
		for _, o := range []struct {
			has   bool
			p     policyv1.OverrideParameter
			value string
		}{{hasMkfs, policyv1.OverrideMkfsOptions, mkfs}, {hasMount, policyv1.OverrideMountOptions, mount}, {hasStrategy, policyv1.OverrideStrategy, strategy}} {
			if o.has {
				ann[policyv1.OverrideAnnotations[o.p]] = o.value
				given[policyv1.OverrideAnnotations[o.p]] = o.value
			}
		}
		all, none := testPlacements()

		o, err := Parse(ann, none, fsType)
		if len(given) == 0 {
			if o != nil || err != nil {
				t.Fatalf("no override annotation, placement %s: %+v, %v", none.Name, o, err)
			}
		} else if err == nil {
			t.Fatalf("placement %s allows no override, accepted %v", none.Name, given)
		}
		o, err = Parse(ann, all, fsType)
		o2, err2 := Parse(ann, all, fsType)
		if (err == nil) != (err2 == nil) || (o == nil) != (o2 == nil) {
			t.Fatalf("two judgements of %v differ: %+v, %v and %+v, %v", given, o, err, o2, err2)
		}
		if err != nil {
			if !slices.ContainsFunc(slices.Collect(maps.Keys(given)), func(k string) bool { return strings.Contains(err.Error(), k) }) {
				t.Fatalf("error for %v names no annotation: %v", given, err)
			}
			return
		}
		if len(given) == 0 {
			if o != nil {
				t.Fatalf("no override annotation: %+v", o)
			}
			return
		}
		if o == nil || !maps.Equal(o.Annotations, given) {
			t.Fatalf("accepted %v as %+v", given, o)
		}
		own := policyv1.Filesystem{MkfsOptions: []string{"-b", "4096"}, MountOptions: make([]string, 1, 8)}
		own.MountOptions[0] = "discard"
		applied, s := own, policyv1.StrategyBinpack
		o.Apply(&applied, &s)
		if !slices.Equal(own.MkfsOptions, []string{"-b", "4096"}) || !slices.Equal(own.MountOptions[:cap(own.MountOptions)][:1], []string{"discard"}) ||
			slices.ContainsFunc(own.MountOptions[1:cap(own.MountOptions)], func(s string) bool { return s != "" }) {
			t.Fatalf("Apply of %v changed the placement's own options: %+v", given, own)
		}
	})
}
