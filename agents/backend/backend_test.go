package backend

import (
	"errors"
	"strings"
	"testing"
)

const gib = int64(1) << 30

func TestAvailable(t *testing.T) {
	tests := []struct {
		name      string
		c         Capacity
		reserve   int64
		overPct   int64
		want      int64
		wantAlloc int64
	}{
		// VG free 40 GiB, reservation 20 GiB.
		{"reserve linear", Capacity{TotalBytes: 100 * gib, FreeBytes: 40 * gib}, 20 * gib, 0, 20 * gib, 80 * gib},
		// VG free 10 GiB, reservation 20 GiB → 0, no underflow.
		{"reserve above free clamps", Capacity{TotalBytes: 100 * gib, FreeBytes: 10 * gib}, 20 * gib, 0, 0, 80 * gib},
		{"reserve above total", Capacity{TotalBytes: 10 * gib, FreeBytes: 10 * gib}, 20 * gib, 0, 0, 0},
		{"negative reserve", Capacity{TotalBytes: 10 * gib, FreeBytes: 5 * gib}, -1, 0, 5 * gib, 10 * gib},
		// VG free 0, pool 99 GiB, Σ virtual 20 GiB, ratio 10 → 970 GiB.
		{"thin overcommit", Capacity{Thin: true, TotalBytes: 99 * gib, FreeBytes: 89 * gib, ProvisionedBytes: 20 * gib}, 0, 1000, 970 * gib, 99 * gib},
		{"thin no overcommit", Capacity{Thin: true, TotalBytes: 99 * gib, ProvisionedBytes: 20 * gib}, 0, 0, 79 * gib, 99 * gib},
		{"thin overprovisioned", Capacity{Thin: true, TotalBytes: 10 * gib, ProvisionedBytes: 30 * gib}, 0, 100, 0, 10 * gib},
		{"thin reserve", Capacity{Thin: true, TotalBytes: 10 * gib}, 2 * gib, 200, 16 * gib, 8 * gib},
		// Snapshots take thin space no volume's virtual size counts: 99 − 20 − 4.
		{"thin snapshots", Capacity{Thin: true, TotalBytes: 99 * gib, ProvisionedBytes: 20 * gib, SnapshotBytes: 4 * gib}, 0, 0, 75 * gib, 99 * gib},
		// Linear: the snapshot space is already gone from free.
		{"linear snapshots", Capacity{TotalBytes: 100 * gib, FreeBytes: 40 * gib, SnapshotBytes: 4 * gib}, 20 * gib, 0, 20 * gib, 80 * gib},
		// Raw: 30 GiB free in three 10 GiB gaps takes one 10 GiB volume, not 30 GiB.
		{"contiguous largest region", Capacity{Contiguous: true, TotalBytes: 100 * gib, FreeBytes: 30 * gib, LargestFreeBytes: 10 * gib}, 0, 0, 10 * gib, 100 * gib},
		// ... and the reserve still bounds it when it is tighter than the largest region.
		{"contiguous reserve", Capacity{Contiguous: true, TotalBytes: 100 * gib, FreeBytes: 30 * gib, LargestFreeBytes: 30 * gib}, 25 * gib, 0, 5 * gib, 75 * gib},
		{"contiguous full", Capacity{Contiguous: true, TotalBytes: 100 * gib}, 0, 0, 0, 100 * gib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.Available(tt.reserve, tt.overPct); got != tt.want {
				t.Errorf("Available = %d, want %d", got, tt.want)
			}
			if got := tt.c.Allocatable(tt.reserve); got != tt.wantAlloc {
				t.Errorf("Allocatable = %d, want %d", got, tt.wantAlloc)
			}
		})
	}
}

func TestRoundUp(t *testing.T) {
	const ext = 4 << 20
	tests := []struct{ in, unit, want int64 }{
		{1, ext, 4194304},             // one byte → one extent
		{1073741825, ext, 1077936128}, // 1 GiB + 1 → 257 × 4 MiB
		{1073741824, ext, 1073741824}, // aligned stays
		{4194303, ext, 4194304},       // one below
		{5, 0, 5},                     // no unit
		{1 << 40, 4096, 1 << 40},      // big aligned
	}
	for _, tt := range tests {
		if got := RoundUp(tt.in, tt.unit); got != tt.want {
			t.Errorf("RoundUp(%d, %d) = %d, want %d", tt.in, tt.unit, got, tt.want)
		}
	}
}

func TestVolumeID(t *testing.T) {
	names := []string{"pvc-1", "sanity-controller-create-maxlen-" + strings.Repeat("Q", 96), "-lead", "snapshot", "x_tmeta", "weird/name", ""}
	seen := map[string]string{}
	for _, n := range names {
		id := VolumeID(n)
		if err := ValidateVolumeID(id); err != nil {
			t.Errorf("VolumeID(%q) = %q invalid: %v", n, id, err)
		}
		if id != VolumeID(n) {
			t.Errorf("VolumeID(%q) not stable", n)
		}
		if prev, ok := seen[id]; ok {
			t.Errorf("collision %q and %q", prev, n)
		}
		seen[id] = n
	}
	// Known value: sha256("pvc-1") prefix.
	if got := VolumeID("pvc-1"); len(got) != 44 || !strings.HasPrefix(got, "vol-") {
		t.Errorf("VolumeID shape %q", got)
	}
	for _, bad := range []string{"", "vol-", "vol-" + strings.Repeat("A", 40), "vol-" + strings.Repeat("a", 41), "pvc-" + strings.Repeat("a", 40), "vol-" + strings.Repeat("g", 40)} {
		if err := ValidateVolumeID(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ValidateVolumeID(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func TestCommandError(t *testing.T) {
	base := errors.New("exit status 5")
	e := &CommandError{Args: []string{"lvcreate", "-n", "x", "vg"}, ExitCode: 5, Stderr: "Volume group \"vg\" not found", Kind: ErrNotFound, Err: base}
	if !errors.Is(e, ErrNotFound) || !errors.Is(e, base) {
		t.Fatalf("errors.Is failed on %v", e)
	}
	if want := `lvcreate -n x vg: exit 5: Volume group "vg" not found`; e.Error() != want {
		t.Fatalf("Error() = %q, want %q", e.Error(), want)
	}
}
