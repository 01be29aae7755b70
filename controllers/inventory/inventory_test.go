package inventory

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func obj(apiVersion, kind, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": map[string]any{"name": name}}}
	if spec != nil {
		u.Object["spec"] = spec
	}
	return u
}

func mustEntry(t *testing.T, u *unstructured.Unstructured) Entry {
	t.Helper()
	e, err := EntryOf(u)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestStaleUsesInventoryOnly is field case B38: only what the last inventory holds and the
// new render lacks is stale; objects outside the inventory are never candidates, whatever
// their labels say.
func TestStaleUsesInventoryOnly(t *testing.T) {
	fast := mustEntry(t, obj("storage.k8s.io/v1", "StorageClass", "fast", nil))
	gold := mustEntry(t, obj("storage.plinth.dev/v1alpha1", "Store", "gold.n1", map[string]any{"pool": "gold"}))
	agent := mustEntry(t, obj("storage.plinth.dev/v1alpha1", "Agent", "n1", nil))
	last := New(fast, gold, agent)
	next := New(fast)
	stale := last.Stale(next)
	var got []string
	for _, e := range stale {
		got = append(got, e.String())
	}
	// Stores go before Agents: reverse apply order.
	if strings.Join(got, ",") != "Store/gold.n1,Agent/n1" {
		t.Fatalf("stale = %v", got)
	}
	if len(New().Stale(next)) != 0 {
		t.Fatal("an empty inventory has nothing to prune")
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	inv := New(
		mustEntry(t, obj("storage.k8s.io/v1", "StorageClass", "fast", nil)),
		mustEntry(t, obj("v1", "ConfigMap", "x", nil)),
		Entry{Group: "storage.plinth.dev", Version: "v1alpha1", Kind: "Store", Name: "p.n"},
	)
	s := inv.Encode()
	back, err := Decode(s)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Equal(inv) {
		t.Fatalf("round trip differs:\n%s\n%s", s, back.Encode())
	}
	if back.Encode() != s {
		t.Fatal("encoding is not stable")
	}
	if !strings.HasPrefix(s, "storage.k8s.io v1 StorageClass fast ") {
		t.Errorf("StorageClasses come first: %q", s)
	}
	for _, bad := range []string{"a b c\n", "a b c d e f\n"} {
		if _, err := Decode(bad); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("Decode(%q) = %v, want a line-1 error", bad, err)
		}
	}
}

func TestDigestChangesWithContent(t *testing.T) {
	a := mustEntry(t, obj("storage.plinth.dev/v1alpha1", "Store", "p.n", map[string]any{"reserve": "0"}))
	b := mustEntry(t, obj("storage.plinth.dev/v1alpha1", "Store", "p.n", map[string]any{"reserve": "1Gi"}))
	c := mustEntry(t, obj("storage.plinth.dev/v1alpha1", "Store", "p.n", map[string]any{"reserve": "0"}))
	if a.Digest == b.Digest || a.Digest != c.Digest || a.ID() != b.ID() {
		t.Fatalf("digests %s %s %s", a.Digest, b.Digest, c.Digest)
	}
	if New(a).Equal(New(b)) || !New(a).Equal(New(c)) {
		t.Fatal("Equal must compare digests")
	}
}

func BenchmarkEncode1000(b *testing.B) {
	inv := New()
	for i := 0; i < 1000; i++ {
		inv.Put(Entry{Group: "storage.plinth.dev", Version: "v1alpha1", Kind: "Store", Name: strings.Repeat("x", 40) + string(rune('a'+i%26)) + strings.Repeat("y", i%7), Digest: strings.Repeat("f", 64)})
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = inv.Encode()
	}
}
