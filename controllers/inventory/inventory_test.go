package inventory

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
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

// TestStaleUsesInventoryOnly: only what the last inventory holds and the
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

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// fleet returns the inventory of a fleet of nodes: per node one Agent and one Store, each with
// a distinct sha256 digest, plus one StorageClass, as render makes them.
func fleet(nodes int) *Inventory {
	inv := New(Entry{Group: "storage.k8s.io", Version: "v1", Kind: "StorageClass", Name: "fast", Digest: sha256Hex("sc")})
	for i := 0; i < nodes; i++ {
		node := fmt.Sprintf("node-%05d", i)
		inv.Put(Entry{Group: "storage.plinth.dev", Version: "v1alpha1", Kind: "Agent", Name: node, Digest: sha256Hex("a" + node)})
		inv.Put(Entry{Group: "storage.plinth.dev", Version: "v1alpha1", Kind: "Store", Name: "gold." + node, Digest: sha256Hex("s" + node)})
	}
	return inv
}

// TestConfigMapForms: an inventory up to CompressAbove bytes of text is stored as text, a
// larger one gzip-compressed under binaryData, and one that does not fit even compressed is
// an error naming its object count; each form reads back to the same entries.
func TestConfigMapForms(t *testing.T) {
	for _, tc := range []struct {
		nodes          int
		wantCompressed bool
		wantErr        bool
	}{
		{nodes: 1000},                       // 2,001 objects, about 240 KiB of text
		{nodes: 5000, wantCompressed: true}, // 10,001 objects, about 1.2 MiB of text
		{nodes: 20000, wantErr: true},       // 40,001 objects: more than 1 MiB compressed
	} {
		inv := fleet(tc.nodes)
		data, binary, err := encodeConfigMap(inv)
		if tc.wantErr {
			want := fmt.Sprintf("the inventory of %d objects is", inv.Len())
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%d nodes: error %v, want one starting %q", tc.nodes, err, want)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%d nodes: %v", tc.nodes, err)
		}
		if _, compressed := binary[BinaryDataKey]; compressed != tc.wantCompressed || (data == nil) == !compressed {
			t.Fatalf("%d nodes: data keys %d, binaryData keys %d; want compressed: %v", tc.nodes, len(data), len(binary), tc.wantCompressed)
		}
		size := len(data[DataKey]) + len(binary[BinaryDataKey])
		t.Logf("%d nodes: %d objects stored in %d bytes (compressed: %v)", tc.nodes, inv.Len(), size, tc.wantCompressed)
		if size > MaxStoredBytes {
			t.Errorf("%d nodes: %d bytes stored, more than %d", tc.nodes, size, MaxStoredBytes)
		}
		got, err := decodeConfigMap(&corev1.ConfigMap{Data: data, BinaryData: binary})
		if err != nil {
			t.Fatalf("%d nodes: decode: %v", tc.nodes, err)
		}
		if got.Len() != 2*tc.nodes+1 || !got.Equal(inv) {
			t.Errorf("%d nodes: read back %d entries (equal: %v), want %d", tc.nodes, got.Len(), got.Equal(inv), 2*tc.nodes+1)
		}
	}
}

// TestConfigMapRefusesBadGzip: a damaged compressed inventory is an error, never an empty
// inventory (which would make every applied object look stale).
func TestConfigMapRefusesBadGzip(t *testing.T) {
	_, err := decodeConfigMap(&corev1.ConfigMap{BinaryData: map[string][]byte{BinaryDataKey: []byte("not gzip")}})
	if err == nil || !strings.Contains(err.Error(), BinaryDataKey) {
		t.Fatalf("error %v, want one naming %s", err, BinaryDataKey)
	}
}
