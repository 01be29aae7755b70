package lvm

import (
	"errors"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// TestClassifyIgnoresQuotedNames: words inside quoted VG/LV names (a VG called "plinth-busy")
// must not turn a "not found" into "in use".
func TestClassifyIgnoresQuotedNames(t *testing.T) {
	cases := []struct {
		stderr string
		want   error
	}{
		{`Volume group "plinth-busy" not found`, backend.ErrNotFound},
		{`Logical volume plinth-data/vol-1 in use.`, backend.ErrInUse},
		{`Logical volume "vol-1" contains a filesystem in use.`, backend.ErrInUse},
		{`Volume group "insufficient-not-found" has insufficient free space (10 extents): 20 required.`, backend.ErrInsufficientCapacity},
		{`A volume group called "busy" already exists.`, backend.ErrAlreadyExists},
		{`some other failure`, nil},
	}
	for _, c := range cases {
		if got := classify(c.stderr); !errors.Is(got, c.want) && got != c.want {
			t.Errorf("classify(%q) = %v, want %v", c.stderr, got, c.want)
		}
	}
}
