package dhchap

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// The representations nvme-cli 2.3 (Debian bookworm) printed for fixed keys:
//
//	nvme gen-dhchap-key /dev/null --key-length=32 --hmac=0 --secret=000102...1f
//	nvme gen-dhchap-key /dev/null --key-length=48 --hmac=0 --secret=000102...2f
var recorded = []struct {
	n    int
	want string
}{
	{32, "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"},
	{48, "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:"},
}

func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func TestEncodeMatchesNVMeCLI(t *testing.T) {
	for _, r := range recorded {
		got, err := Encode(seq(r.n))
		if err != nil {
			t.Fatal(err)
		}
		if got != r.want {
			t.Errorf("Encode(%d bytes) = %s, nvme-cli printed %s", r.n, got, r.want)
		}
		key, tr, err := Decode(r.want)
		if err != nil || tr != 0 || !bytes.Equal(key, seq(r.n)) {
			t.Errorf("Decode(%s) = %x, %d, %v", r.want, key, tr, err)
		}
	}
}

func TestGenerate(t *testing.T) {
	for hash, n := range map[string]int{"": 32, "sha256": 32, "sha384": 48, "sha512": 64} {
		a, err := Generate(hash)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Generate(hash)
		if a == b {
			t.Errorf("two secrets for %q are equal", hash)
		}
		key, _, err := Decode(a)
		if err != nil || len(key) != n {
			t.Errorf("Generate(%q): %d bytes, %v; want %d", hash, len(key), err, n)
		}
	}
	if _, err := Generate("md5"); err == nil {
		t.Error("Generate(md5) succeeded")
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := recorded[0].want
	flipped := []byte(good)
	flipped[12] ^= 1 // another key byte: the CRC no longer matches
	for _, s := range []string{
		"", "DHHC-1:00:", "DHHC-2:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
		"DHHC-1:04:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
		"DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR",
		"DHHC-1:00:AAEC:", string(flipped),
	} {
		_, _, err := Decode(s)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("Decode(%q): %v, want ErrMalformed", s, err)
			continue
		}
		if len(s) > 20 && strings.Contains(err.Error(), s[10:20]) {
			t.Errorf("Decode's error shows the secret: %v", err)
		}
	}
}

func TestKernelNames(t *testing.T) {
	if h, _ := KernelHash(""); h != "hmac(sha256)" {
		t.Errorf("KernelHash(\"\") = %s", h)
	}
	if h, _ := KernelHash("sha512"); h != "hmac(sha512)" {
		t.Errorf("KernelHash(sha512) = %s", h)
	}
	if g, _ := KernelDHGroup(""); g != "null" {
		t.Errorf("KernelDHGroup(\"\") = %s", g)
	}
	if _, err := KernelDHGroup("modp"); err == nil {
		t.Error("KernelDHGroup(modp) accepted")
	}
}

func FuzzDecode(f *testing.F) {
	for _, r := range recorded {
		f.Add(r.want)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, _, err := Decode(s)
		if err != nil {
			return
		}
		enc, err := Encode(key)
		if err != nil {
			t.Fatalf("decoded key of %d bytes does not encode: %v", len(key), err)
		}
		if _, _, err := Decode(enc); err != nil {
			t.Fatal(err)
		}
	})
}

// Key ids are 16 hex digits and differ; a Secret's keyGeneration is its annotation in decimal,
// 0 when absent or not a non-negative number.
func TestKeyIDAndGeneration(t *testing.T) {
	a, err := NewKeyID()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewKeyID()
	if len(a) != 16 || strings.Trim(a, "0123456789abcdef") != "" || a == b {
		t.Errorf("key ids %q, %q: want two different ids of 16 hex digits", a, b)
	}
	for in, want := range map[string]int64{"": 0, "3": 3, "-1": 0, "x": 0, "12": 12} {
		ann := map[string]string{}
		if in != "" {
			ann[AnnotationKeyGeneration] = in
		}
		if got := KeyGenerationOf(ann); got != want {
			t.Errorf("KeyGenerationOf(%q) = %d, want %d", in, got, want)
		}
	}
}

// A derived key has its master's length, is the same for the same (master, target), differs for
// another target, another master and between host and controller keys, and matches a value
// computed independently (Python's hmac: HMAC-SHA256 of the 32-byte master 00..1f over the label, a zero byte
// and "node-t"), so that the agent, the node plugin and the key server agree across versions.
func TestDeriveKeyPerTarget(t *testing.T) {
	for _, n := range []int{32, 48, 64} {
		master, err := Encode(seq(n))
		if err != nil {
			t.Fatal(err)
		}
		other, _ := Generate(map[int]string{32: "sha256", 48: "sha384", 64: "sha512"}[n])
		a1, err := DeriveHostKey(master, "node-a")
		if err != nil {
			t.Fatal(err)
		}
		a2, _ := DeriveHostKey(master, "node-a")
		b, _ := DeriveHostKey(master, "node-b")
		c, _ := DeriveCtrlKey(master, "node-a")
		o, _ := DeriveHostKey(other, "node-a")
		if a1 != a2 {
			t.Errorf("%d bytes: two derivations for one target differ", n)
		}
		seen := map[string]string{}
		for what, k := range map[string]string{"master": master, "target a": a1, "target b": b, "ctrl key": c, "other master": o} {
			if prev, ok := seen[k]; ok {
				t.Errorf("%d bytes: %s and %s give the same key", n, prev, what)
			}
			seen[k] = what
			if key, tr, err := Decode(k); err != nil || len(key) != n || tr != 0 {
				t.Errorf("%d bytes, %s: %d bytes, transformation %d, %v", n, what, len(key), tr, err)
			}
		}
	}
	master, _ := Encode(seq(32))
	got, _ := DeriveHostKey(master, "node-t")
	if want := "DHHC-1:00:U4E7Q6w9yrMxBTcfgc4H6dXM89+LyODNdgO3eUPYsygnh0m8:"; got != want {
		t.Errorf("DeriveHostKey(00..1f, node-t) = %s, want %s", got, want)
	}
	if _, err := DeriveHostKey("DHHC-1:00:AAAA:", "node-a"); !errors.Is(err, ErrMalformed) {
		t.Errorf("malformed master: %v, want ErrMalformed", err)
	}
	if _, err := DeriveHostKey(master, ""); err == nil {
		t.Error("no target: no error")
	}
}
