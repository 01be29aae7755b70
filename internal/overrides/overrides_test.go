package overrides

import (
	"slices"
	"strings"
	"testing"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// testPlacements returns a Placement that allows every override ("all") and one that allows
// none ("none").
func testPlacements() (all, none *policyv1.Placement) {
	all = &policyv1.Placement{}
	all.Name = "all"
	all.Spec.Overrides = &policyv1.Overrides{Allowed: []policyv1.OverrideParameter{
		policyv1.OverrideMkfsOptions, policyv1.OverrideMountOptions, policyv1.OverrideStrategy}}
	none = &policyv1.Placement{}
	none.Name = "none"
	return all, none
}

func TestParse(t *testing.T) {
	all, none := testPlacements()
	mkfs := policyv1.OverrideAnnotations[policyv1.OverrideMkfsOptions]
	mount := policyv1.OverrideAnnotations[policyv1.OverrideMountOptions]
	strategy := policyv1.OverrideAnnotations[policyv1.OverrideStrategy]

	// No override annotation: nil, whatever the placement allows.
	for _, pl := range []*policyv1.Placement{all, none} {
		if o, err := Parse(map[string]string{"other": "x"}, pl, ""); o != nil || err != nil {
			t.Errorf("%s without annotations: %+v, %v", pl.Name, o, err)
		}
	}
	o, err := Parse(map[string]string{mkfs: " -m  0 ", mount: "noatime, nosuid", strategy: "Spreadout"}, all, "")
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
		if _, err := Parse(tc.ann, tc.pl, ""); err == nil {
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

// Override values are judged by the allow-lists of the policy schema for the volume's
// filesystem: what a claim author could use against the node (shell syntax, options that read
// the node's files, mount options that widen the mount or undo the Placement's noexec) is
// refused naming the annotation and the rule, and so is a value over the length bound.
func TestParseOptionAllowLists(t *testing.T) {
	pl := &policyv1.Placement{}
	pl.Name = "guarded"
	pl.Spec.Filesystem.MountOptions = []string{"noexec", "nodev"}
	pl.Spec.Overrides = &policyv1.Overrides{Allowed: []policyv1.OverrideParameter{
		policyv1.OverrideMkfsOptions, policyv1.OverrideMountOptions, policyv1.OverrideStrategy}}
	mkfs := policyv1.OverrideAnnotations[policyv1.OverrideMkfsOptions]
	mount := policyv1.OverrideAnnotations[policyv1.OverrideMountOptions]
	strategy := policyv1.OverrideAnnotations[policyv1.OverrideStrategy]

	accepted := []struct {
		fsType string
		ann    map[string]string
	}{
		{"", map[string]string{mkfs: "-m 1 -E lazy_itable_init=0,lazy_journal_init=0 -O ^resize_inode -L data"}},
		{"ext4", map[string]string{mount: "noatime,nosuid,commit=30,data=ordered,errors=remount-ro"}},
		{"xfs", map[string]string{mkfs: "-m crc=1,reflink=1 -i size=512 -K", mount: "noatime,logbsize=256k,nouuid"}},
		{"", map[string]string{mount: "noexec"}}, // the Placement's own, again: no contradiction
	}
	for _, tc := range accepted {
		if o, err := Parse(tc.ann, pl, tc.fsType); err != nil || len(o.Annotations) != len(tc.ann) {
			t.Errorf("%q on %s: %+v, %v; want accepted", tc.ann, tc.fsType, o, err)
		}
	}

	refused := []struct {
		fsType string
		ann    map[string]string
		want   string
	}{
		{"", map[string]string{mkfs: "-m 0; touch /tmp/x"}, `"0;" holds a shell metacharacter`},
		{"", map[string]string{mkfs: "$(touch /tmp/x)"}, `"$(touch" holds a shell metacharacter`},
		{"", map[string]string{mkfs: "-m 0 /dev/sdb"}, `"/dev/sdb" is no flag's value: positional arguments are refused`},
		{"", map[string]string{mkfs: "-d /etc"}, `"-d" is refused: it copies a directory of the node`},
		{"", map[string]string{mkfs: "-e panic"}, `the value of -e must match`},
		{"xfs", map[string]string{mkfs: "-m 0"}, `mkfs.xfs argument "0": the value of -m must match`},
		{"xfs", map[string]string{mkfs: "-p /etc/proto"}, `"-p" is refused`},
		{"", map[string]string{mount: "bind"}, `"bind" is refused`},
		{"", map[string]string{mount: "remount,rw"}, `"remount" is refused`},
		{"", map[string]string{mount: "x-mount.mkdir=/root/x"}, `"x-mount.mkdir=/root/x" is refused: x-* options`},
		{"", map[string]string{mount: "helper=evil"}, `"helper=evil" is refused`},
		{"", map[string]string{mount: "suid"}, `"suid" is refused`},
		{"", map[string]string{mount: "dev"}, `"dev" is refused`},
		{"", map[string]string{mount: "exec"}, `"exec" contradicts "noexec" before it`},
		{"", map[string]string{mount: "errors=panic"}, `"errors=panic" is refused: a corrupted volume would panic the node`},
		{"xfs", map[string]string{mount: "data=ordered"}, `"data=ordered" is not one Plinth passes to xfs`},
		{"", map[string]string{mount: strings.Repeat("noatime,", 700)}, "5600 bytes, more than the 1024"},
		{"", map[string]string{strategy: strings.Repeat("S", 1025)}, "1025 bytes, more than the 1024"},
	}
	for _, tc := range refused {
		_, err := Parse(tc.ann, pl, tc.fsType)
		if err == nil {
			t.Errorf("%.80q on %q: accepted, want refused", tc.ann, tc.fsType)
			continue
		}
		for k := range tc.ann {
			if !strings.Contains(err.Error(), "annotation "+k) {
				t.Errorf("%.80q: %v does not name the annotation %s", tc.ann, err, k)
			}
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.80q on %q: %v, want %q", tc.ann, tc.fsType, err, tc.want)
		}
	}
}
