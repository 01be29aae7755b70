package cueschema

import (
	"strings"
	"testing"
)

// TestCheckPlacementField judges single Placement fields by the schema, as the CSI controller
// does for the overrides a PVC asks for.
func TestCheckPlacementField(t *testing.T) {
	for _, tc := range []struct {
		path  []string
		value any
		want  string // "" = accepted, else a substring of the error
	}{
		{[]string{"strategy"}, "Spreadout", ""},
		{[]string{"strategy"}, "Binpack", ""},
		{[]string{"strategy"}, "spreadout", "spreadout"},
		{[]string{"filesystem", "mkfsOptions"}, []string{"-m", "0"}, ""},
		{[]string{"filesystem", "mkfsOptions"}, "-m 0", "mismatched types"},
		{[]string{"filesystem", "mountOptions"}, []string{"noatime"}, ""},
		{[]string{"filesystem", "nosuch"}, "x", "no field spec.filesystem.nosuch"},
		// The whole filesystem: its options judged for its fsType.
		{[]string{"filesystem"}, map[string]any{"fsType": "xfs", "mkfsOptions": []string{"-m", "crc=1"}, "mountOptions": []string{"logbsize=64k"}}, ""},
		{[]string{"filesystem"}, map[string]any{"fsType": "xfs", "mkfsOptions": []string{"-m", "0"}}, `mkfs.xfs argument "0": the value of -m must match`},
		{[]string{"filesystem"}, map[string]any{"mountOptions": []string{"noexec", "exec"}}, `"exec" contradicts "noexec"`},
	} {
		err := CheckPlacementField(tc.path, tc.value)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v = %v: %v, want accepted", tc.path, tc.value, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v = %v: %v, want an error with %q", tc.path, tc.value, err, tc.want)
		}
	}
}
