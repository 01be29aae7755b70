package identity

import (
	"errors"
	"strings"
	"testing"
)

func sample() Stamp {
	return Stamp{
		VolumeID: "vol-0123456789abcdef0123456789abcdef01234567", PVCNamespace: "shop", PVCName: "data-db-0",
		PVCUID: "5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b", PVName: "pvc-5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b",
		StorageClass: "plinth-fast", Placement: "fast", SizeBytes: 1 << 30, Filesystem: "ext4",
		VolumeMode: "Filesystem", PolicyDigest: "00112233445566778899aabbccddeeff", StoreUID: "9d1e-store",
	}
}

func TestStampRoundTripsThroughEveryEncoding(t *testing.T) {
	unbound := sample()
	unbound.PVCNamespace, unbound.PVCName, unbound.PVCUID, unbound.PVName, unbound.StorageClass = "", "", "", "", ""
	block := sample()
	block.VolumeMode, block.Filesystem = "Block", ""
	for name, s := range map[string]Stamp{"bound": sample(), "unbound": unbound, "block": block} {
		t.Run(name, func(t *testing.T) {
			text, err := s.Text()
			if err != nil {
				t.Fatal(err)
			}
			line, _ := s.Line()
			tags, _ := s.LVTags()
			decoders := map[string]func() (Stamp, error){
				"text": func() (Stamp, error) { return ParseText(text) },
				"line": func() (Stamp, error) { return ParseLine(line) },
				"lvm":  func() (Stamp, error) { return FromLVTags(append([]string{"plinth.dev/mapped-bytes.1"}, tags...)) },
				"zfs":  func() (Stamp, error) { return FromZFSProperty(line) },
			}
			for enc, dec := range decoders {
				got, err := dec()
				if err != nil || got != s {
					t.Errorf("%s: got %+v, %v; want %+v", enc, got, err, s)
				}
			}
			for _, tag := range tags {
				if len(tag) > 1024 || strings.Trim(tag, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+.-/=!:&#") != "" {
					t.Errorf("LV tag %q is outside lvm2's tag charset or length", tag)
				}
			}
			if s.Bound() != (name == "bound" || name == "block") {
				t.Errorf("Bound() = %v", s.Bound())
			}
		})
	}
}

func TestTornOrForeignStampIsRefused(t *testing.T) {
	text, _ := sample().Text()
	lines := strings.SplitAfter(text, "\n")
	newer := strings.Replace(text, "v=1\n", "v=2\n", 1)
	cases := []struct {
		name, text string
		want       error
	}{
		{"empty", "", ErrNoStamp},
		{"tab in a zfs value", strings.Replace(text, "pvc=data-db-0", "pvc=data-db-0\tx", 1), ErrTorn},
		{"cut mid-record", text[:len(text)/2], ErrTorn},
		{"cut at a line end, checksum lost", strings.Join(lines[:len(lines)-2], ""), ErrTorn},
		{"one field changed", strings.Replace(text, "size=1073741824", "size=2147483648", 1), ErrTorn},
		{"field repeated", text + "vol=vol-0123456789abcdef0123456789abcdef01234567\n", ErrTorn},
		{"unknown field", strings.Replace(text, "v=1\n", "v=1\nextra=1\n", 1), ErrTorn},
		{"no version", strings.Join(lines[1:], ""), ErrTorn},
		{"newer version", newer, ErrUnknownVersion},
		{"leading zero size", strings.Replace(text, "size=1073741824", "size=01073741824", 1), ErrTorn},
		{"empty optional field", strings.Replace(text, "sc=plinth-fast", "sc=", 1), ErrTorn},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if s, err := ParseText(c.text); !errors.Is(err, c.want) {
				t.Fatalf("ParseText = %+v, %v; want %v", s, err, c.want)
			}
		})
	}
}

func TestHalfAClaimIsNotAStamp(t *testing.T) {
	s := sample()
	s.PVCUID = ""
	if _, err := s.Text(); err == nil {
		t.Fatal("a stamp with a claim name and no UID was encoded")
	}
	s = sample()
	s.PVCName = "Has Space"
	if _, err := s.LVTags(); err == nil {
		t.Fatal("a value outside [A-Za-z0-9._-] was encoded")
	}
}

func TestPolicyDigestIsStableAndSensitive(t *testing.T) {
	type p struct{ A, B string }
	a, _ := PolicyDigest(p{"x", "y"})
	b, _ := PolicyDigest(p{"x", "y"})
	c, _ := PolicyDigest(p{"x", "z"})
	if a != b || a == c || !digestRe.MatchString(a) {
		t.Fatalf("digests %s %s %s", a, b, c)
	}
}

func TestUnsetZFSPropertyIsNoStamp(t *testing.T) {
	for _, v := range []string{"-", ""} {
		if _, err := FromZFSProperty(v); !errors.Is(err, ErrNoStamp) {
			t.Errorf("FromZFSProperty(%q) = %v, want ErrNoStamp", v, err)
		}
	}
	line, _ := sample().Line()
	if len(line) > 4096 {
		t.Fatalf("line of %d bytes", len(line))
	}
}
