package overrides

import (
	"slices"
	"strings"
	"testing"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

func TestParse(t *testing.T) {
	all := &policyv1.Placement{}
	all.Name = "all"
	all.Spec.Overrides = &policyv1.Overrides{Allowed: []policyv1.OverrideParameter{
		policyv1.OverrideMkfsOptions, policyv1.OverrideMountOptions, policyv1.OverrideStrategy}}
	none := &policyv1.Placement{}
	none.Name = "none"
	mkfs := policyv1.OverrideAnnotations[policyv1.OverrideMkfsOptions]
	mount := policyv1.OverrideAnnotations[policyv1.OverrideMountOptions]
	strategy := policyv1.OverrideAnnotations[policyv1.OverrideStrategy]

	// No override annotation: nil, whatever the placement allows.
	for _, pl := range []*policyv1.Placement{all, none} {
		if o, err := Parse(map[string]string{"other": "x"}, pl); o != nil || err != nil {
			t.Errorf("%s without annotations: %+v, %v", pl.Name, o, err)
		}
	}
	o, err := Parse(map[string]string{mkfs: " -m  0 ", mount: "noatime, nosuid", strategy: "Spreadout"}, all)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Annotations) != 3 {
		t.Errorf("annotations %v, want 3", o.Annotations)
	}
	fs := policyv1.Filesystem{MkfsOptions: []string{"-b", "4096"}, MountOptions: []string{"discard"}}
	s := policyv1.StrategyBinpack
	o.Apply(&fs, &s)
	if !slices.Equal(fs.MkfsOptions, []string{"-m", "0"}) || !slices.Equal(fs.MountOptions, []string{"discard", "noatime", "nosuid"}) || s != policyv1.StrategySpreadout {
		t.Errorf("applied: %+v %s", fs, s)
	}
	var nilSet *Set
	nilSet.Apply(&fs, &s) // nil: no change, no panic

	for _, tc := range []struct {
		ann  map[string]string
		pl   *policyv1.Placement
		want []string
	}{
		{map[string]string{strategy: "Spreadout"}, none, []string{strategy, `Placement "none" does not allow overriding strategy`}},
		{map[string]string{strategy: "spreadout"}, all, []string{strategy, `"spreadout"`, "conflicting values"}},
		{map[string]string{mount: "a,,b"}, all, []string{mount, "empty mount option"}},
		// Two bad annotations: the first by name is reported, every time.
		{map[string]string{strategy: "x", mkfs: "-m 0", mount: ","}, none, []string{mkfs}},
	} {
		if _, err := Parse(tc.ann, tc.pl); err == nil {
			t.Errorf("%v on %s: accepted", tc.ann, tc.pl.Name)
		} else {
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v on %s: %q lacks %q", tc.ann, tc.pl.Name, err, w)
				}
			}
		}
	}
}
