package nvmet

import (
	"errors"
	"strings"
	"testing"
)

func TestParseNQN(t *testing.T) {
	prefix31 := "nqn.2026-01.io.example.storage:" // 31 bytes
	tests := []struct {
		name, nqn string
		ok        bool
	}{
		{"plinth volume", "nqn.2026-01.dev.plinth:vol-0123456789abcdef0123456789abcdef01234567", true},
		{"uuid host nqn", "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427", true},
		{"exactly 223 bytes", prefix31 + strings.Repeat("a", 223-31), true},
		{"224 bytes", prefix31 + strings.Repeat("a", 224-31), false},
		{"231 bytes (31 + 200-char PV name)", prefix31 + strings.Repeat("p", 200), false},
		{"month 13", "nqn.2026-13.io.example:x", false},
		{"iqn prefix", "iqn.2026-01.io.example:x", false},
		{"month 00", "nqn.2026-00.io.example:x", false},
		{"no colon", "nqn.2026-01.io.example", false},
		{"empty unique", "nqn.2026-01.io.example:", false},
		{"empty label", "nqn.2026-01.io..example:x", false},
		{"slash", "nqn.2026-01.io.example:a/b", false},
		{"space", "nqn.2026-01.io.example:a b", false},
		{"newline", "nqn.2026-01.io.example:a\n", false},
		{"non-ascii", "nqn.2026-01.io.example:é", false},
		{"short date", "nqn.26-01.io.example:x", false},
		{"signed year", "nqn.+026-01.io.example:x", false},
		{"discovery nqn", DiscoveryNQN, false},
		{"bad uuid", "nqn.2014-08.org.nvmexpress:uuid:not-a-uuid", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := ParseNQN(tt.nqn)
			if tt.ok {
				if err != nil {
					t.Fatalf("ParseNQN(%q) = %v, want ok", tt.nqn, err)
				}
				if n.String() != tt.nqn {
					t.Fatalf("round trip %q → %q", tt.nqn, n.String())
				}
				return
			}
			if !errors.Is(err, ErrInvalidNQN) {
				t.Fatalf("ParseNQN(%q) = %v, want ErrInvalidNQN", tt.nqn, err)
			}
		})
	}
}

func TestVolumeNQN(t *testing.T) {
	id := "vol-0123456789abcdef0123456789abcdef01234567"
	nqn, err := VolumeNQN(id)
	if err != nil {
		t.Fatal(err)
	}
	if nqn != "nqn.2026-01.dev.plinth:"+id {
		t.Fatalf("VolumeNQN = %q", nqn)
	}
	if got, ok := VolumeIDFromNQN(nqn); !ok || got != id {
		t.Fatalf("VolumeIDFromNQN(%q) = %q, %v", nqn, got, ok)
	}
	if _, ok := VolumeIDFromNQN("nqn.2014-08.org.example:x"); ok {
		t.Fatal("foreign NQN taken for a Plinth volume")
	}
	for _, bad := range []string{"", "a/b", "UPPER case", strings.Repeat("v", 223)} {
		if _, err := VolumeNQN(bad); !errors.Is(err, ErrInvalidNQN) {
			t.Errorf("VolumeNQN(%q) = %v, want ErrInvalidNQN", bad, err)
		}
	}
	// The longest accepted id makes exactly a 223-byte NQN (never truncated).
	longest := strings.Repeat("v", MaxNQNLength-len(NQNPrefix)-1)
	if nqn, err := VolumeNQN(longest); err != nil || len(nqn) != MaxNQNLength {
		t.Fatalf("VolumeNQN(%d bytes) = %d bytes, %v", len(longest), len(nqn), err)
	}
}

func TestDeriveIdentity(t *testing.T) {
	a := DeriveIdentity("nqn.2026-01.dev.plinth:vol-a")
	if a != DeriveIdentity("nqn.2026-01.dev.plinth:vol-a") {
		t.Fatal("identity not stable")
	}
	b := DeriveIdentity("nqn.2026-01.dev.plinth:vol-b")
	if a.UUID == b.UUID || a.NGUID == b.NGUID || a.Serial == b.Serial {
		t.Fatalf("identities collide: %+v %+v", a, b)
	}
	if !validUUID(a.UUID) || !validUUID(a.NGUID) || a.UUID[14] != '8' {
		t.Fatalf("bad uuid/nguid format: %+v", a)
	}
	if len(a.Serial) != 20 { // NVMET_SN_MAX_SIZE
		t.Fatalf("serial %q is not 20 bytes", a.Serial)
	}
}

func FuzzParseNQN(f *testing.F) {
	for _, s := range []string{
		"nqn.2026-01.dev.plinth:vol-x",
		"nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427",
		"nqn.2026-13.io.example:x", "iqn.2026-01.io.example:x", "nqn.", "nqn.2026-01.:",
		"nqn.2026-01.io.example.storage:" + strings.Repeat("a", 192),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseNQN(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidNQN) {
				t.Fatalf("error does not wrap ErrInvalidNQN: %v", err)
			}
			return
		}
		if len(s) > MaxNQNLength {
			t.Fatalf("accepted %d bytes", len(s))
		}
		if strings.ContainsAny(s, "/ \n\x00") {
			t.Fatalf("accepted %q", s)
		}
		if n.String() != s {
			t.Fatalf("round trip %q → %q", s, n.String())
		}
		if n.Month < 1 || n.Month > 12 {
			t.Fatalf("accepted month %d", n.Month)
		}
		if _, err := ParseNQN(n.String()); err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		// Any accepted NQN is a valid configfs name for the derivations.
		if id := DeriveIdentity(s); len(id.Serial) != 20 {
			t.Fatal("serial length")
		}
	})
}
