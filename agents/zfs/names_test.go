package zfs

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// TestZvolNames: names derive from the volume id only, use [A-Za-z0-9_.:-], stay at
// or under 254 bytes, are stable across retries; a parent too long for any
// volume is refused before any command runs.
func TestZvolNames(t *testing.T) {
	const pool, parent = "tank", "k8s/volumes"
	for _, csiName := range []string{strings.Repeat("a", 128), "pvc@snap", "métrique"} {
		id := backend.VolumeID(csiName)
		n1, err := ZvolName(pool, parent, id)
		if err != nil {
			t.Fatalf("%q: %v", csiName, err)
		}
		n2, _ := ZvolName(pool, parent, backend.VolumeID(csiName))
		if n1 != n2 {
			t.Errorf("%q: unstable %q vs %q", csiName, n1, n2)
		}
		if len(n1) > MaxNameLen || !strings.HasPrefix(n1, "tank/k8s/volumes/vol-") {
			t.Errorf("%q: name %q", csiName, n1)
		}
		for _, c := range strings.TrimPrefix(n1, "tank/k8s/volumes/") {
			if !strings.ContainsRune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-", c) {
				t.Errorf("%q: character %q in %q", csiName, c, n1)
			}
		}
	}
	// (d) a parent of 240 bytes: no child name fits; refused by New before any command.
	long := strings.Repeat("p", 240)
	called := false
	_, err := New(Config{Pool: pool, ParentDataset: long, Run: func(_ context.Context, name string, args ...string) ([]byte, []byte, int, error) {
		called = true
		return nil, nil, 0, nil
	}})
	if !errors.Is(err, backend.ErrInvalidArgument) || called {
		t.Errorf("240-byte parent: err=%v called=%v", err, called)
	}
	t.Logf("parent too long: %v", err)
	// The longest parent that still fits: 254 = len(pool/parent) + 1 + 44.
	fit := strings.Repeat("p", MaxNameLen-len(pool)-1-1-44)
	n, err := ZvolName(pool, fit, backend.VolumeID("x"))
	if err != nil || len(n) != MaxNameLen {
		t.Errorf("longest parent: %d %v", len(n), err)
	}
	if _, err := ZvolName(pool, fit+"p", backend.VolumeID("x")); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("one byte over: %v", err)
	}
}

func TestValidateParent(t *testing.T) {
	tests := []struct {
		pool, parent string
		ok           bool
	}{
		{"tank", "", true},
		{"tank", "k8s/volumes", true},
		{"t.a_n:k-1", "a.b/c_d:e-f", true},
		{"", "x", false},
		{"1tank", "", false},
		{"mirror0", "", false},
		{"raidz", "", false},
		{"draid1", "", false},
		{"spare", "", false},
		{"log", "", false},
		{"logs", "", true},
		{"c0t0d0", "", false},
		{"tank", "a//b", false},
		{"tank", "/a", false},
		{"tank", "a/", false},
		{"tank", "a/./b", false},
		{"tank", "a/../b", false},
		{"tank", "a b", false},
		{"tank", "a@b", false},
		{"tank", "a%b", false},
		{"tank", "métrique", false},
		{strings.Repeat("t", 64), "", false},
		{"ta nk", "", false},
	}
	for _, tt := range tests {
		err := ValidateParent(tt.pool, tt.parent)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateParent(%q, %q) = %v, want ok=%v", tt.pool, tt.parent, err, tt.ok)
		}
		if err != nil && !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("ValidateParent(%q, %q): %v not ErrInvalidArgument", tt.pool, tt.parent, err)
		}
	}
	if _, err := ZvolName("tank", "", "pvc-1"); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("bad id: %v", err)
	}
	if n, _ := ZvolName("tank", "", backend.VolumeID("a")); !strings.HasPrefix(n, "tank/vol-") {
		t.Errorf("root parent: %q", n)
	}
}

func TestValidateProperty(t *testing.T) {
	good := map[string]string{"compression": "lz4", "com.example:owner": "team a", "sync": "always", "primarycache": "metadata"}
	for k, v := range good {
		if err := validateProperty(k, v); err != nil {
			t.Errorf("%s=%s: %v", k, v, err)
		}
	}
	bad := map[string]string{"volsize": "1G", "volblocksize": "8K", "refreservation": "none", PropManaged: "false",
		"Compression": "lz4", "": "x", "a b": "x", "compression": "lz4\nx", "checksum": "a\tb"}
	for k, v := range bad {
		if err := validateProperty(k, v); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("%q=%q: %v, want ErrInvalidArgument", k, v, err)
		}
	}
}

func TestParseVolBlockSize(t *testing.T) {
	for in, want := range map[string]int64{"": 16384, "4K": 4096, "8K": 8192, "16K": 16384, "32k": 32768, "64K": 65536, "128K": 131072, "16384": 16384} {
		if got, err := ParseVolBlockSize(in); err != nil || got != want {
			t.Errorf("ParseVolBlockSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"2K", "256K", "12K", "x", "-16K", "16M"} {
		if _, err := ParseVolBlockSize(in); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("ParseVolBlockSize(%q): %v", in, err)
		}
	}
}
