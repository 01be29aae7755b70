package lvm

import (
	"errors"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// Whatever the CSI name, the LV name derived from its volume id is safe.
func TestLVNameFromCSINames(t *testing.T) {
	names := []string{
		"sanity-controller-create-maxlen-" + strings.Repeat("Q", 96), // 128 bytes
		"-lead", "snapshot", "x_tmeta", "weird/name", "pvc-0b7a", "UPPER", "",
	}
	for _, vg := range []string{"data-vg", "vg0", strings.Repeat("v", 40)} {
		for _, n := range names {
			id := backend.VolumeID(n)
			lv, err := LVName(vg, id)
			if err != nil {
				t.Fatalf("LVName(%q, VolumeID(%q)): %v", vg, n, err)
			}
			if again, _ := LVName(vg, backend.VolumeID(n)); again != lv {
				t.Errorf("not idempotent: %q vs %q", lv, again)
			}
			if err := ValidateNames(vg, lv); err != nil {
				t.Errorf("derived name %q invalid: %v", lv, err)
			}
			if len(lv) > 127 || len(DMName(vg, lv)) > 127 || lv[0] == '-' {
				t.Errorf("limits broken: %q", lv)
			}
		}
	}
	if got := DMName("data-vg", "vol-ab"); got != "data--vg-vol--ab" {
		t.Errorf("DMName = %q", got)
	}
}

func TestValidateNames(t *testing.T) {
	long := strings.Repeat("a", 127)
	tests := []struct {
		vg, lv string
		ok     bool
	}{
		{"vg0", "lv0", true},
		{"data-vg", "a+b_c.d-e", true},
		{"vg0", "", true},
		{"", "lv", false},
		{"-vg", "lv", false},
		{"vg0", "-lv", false},
		{"vg0", "snapshot", false},
		{"vg0", "pvmove", false},
		{"vg0", ".", false},
		{"..", "", false},
		{"vg0", "x_tmeta", false},
		{"vg0", "a_rimage_0", false},
		{"vg0", "my_mlog", false},
		{"vg0", "weird/name", false},
		{"vg0", "space name", false},
		{"vg0", "ümlaut", false},
		{long, "", true},
		{long + "a", "", false},
		{"v", strings.Repeat("a", 125), true},   // dm "v-" + 125 = 127
		{"v", strings.Repeat("a", 126), false},  // dm 128
		{"a-b", strings.Repeat("c", 122), true}, // "a--b-" + 122 = 127
		{"a-b", strings.Repeat("c", 123), false},
		{"vg", strings.Repeat("-a", 40) + "x", false}, // leading '-'
		{"vg", "a" + strings.Repeat("-", 62), true},   // dm "vg-a" + 124 = 128? see below
	}
	for _, tt := range tests {
		err := ValidateNames(tt.vg, tt.lv)
		// the last row: compute expectation from the dm rule itself
		if tt.vg == "vg" && strings.HasPrefix(tt.lv, "a-") {
			tt.ok = len(DMName(tt.vg, tt.lv)) <= 127
		}
		if (err == nil) != tt.ok {
			t.Errorf("ValidateNames(%q, %q) = %v, want ok=%v", tt.vg, tt.lv, err, tt.ok)
		}
		if err != nil && !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("error %v does not wrap ErrInvalidArgument", err)
		}
	}
	if _, err := LVName("vg0", "pvc-123"); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("LVName accepted a non volume id: %v", err)
	}
	if _, err := LVName(strings.Repeat("v", 90), backend.VolumeID("x")); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("LVName accepted a dm name over 127 bytes: %v", err)
	}
}
