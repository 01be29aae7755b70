package drift

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func u(o map[string]any) *unstructured.Unstructured { return &unstructured.Unstructured{Object: o} }

func TestPaths(t *testing.T) {
	live := u(map[string]any{
		"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
		"metadata": map[string]any{"name": "fast", "resourceVersion": "7", "uid": "x",
			"labels":      map[string]any{"app.kubernetes.io/managed-by": "plinth", "plinth.dev/pool": "hand-edited"},
			"annotations": map[string]any{"other.io/added": "yes"}},
		"provisioner":          "csi.plinth.dev",
		"allowVolumeExpansion": true,
		"parameters":           map[string]any{"a": "1", "b": "2"},
		"status":               map[string]any{"x": "y"},
	})
	merged := u(map[string]any{
		"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
		"metadata": map[string]any{"name": "fast", "resourceVersion": "8",
			"labels":      map[string]any{"app.kubernetes.io/managed-by": "plinth", "plinth.dev/pool": "vg0"},
			"annotations": map[string]any{"other.io/added": "yes"}},
		"provisioner":          "csi.plinth.dev",
		"allowVolumeExpansion": false,
		"parameters":           map[string]any{"a": "1", "b": "2"},
		"status":               map[string]any{"x": "z"},
	})
	got := strings.Join(Paths(live, merged), ",")
	if got != "allowVolumeExpansion,metadata.labels.plinth.dev/pool" {
		t.Fatalf("paths = %s", got)
	}
	if p := Paths(live, live); len(p) != 0 {
		t.Fatalf("identical objects differ in %v", p)
	}
}

// TestNumbers: the API server returns int64 where a decoded desired object may hold float64.
func TestNumbers(t *testing.T) {
	a := u(map[string]any{"spec": map[string]any{"overcommitPercent": int64(100), "nested": map[string]any{"x": []any{"a"}}}})
	b := u(map[string]any{"spec": map[string]any{"overcommitPercent": float64(100), "nested": map[string]any{"x": []any{"a"}}}})
	if p := Paths(a, b); len(p) != 0 {
		t.Fatalf("paths = %v", p)
	}
	c := u(map[string]any{"spec": map[string]any{"overcommitPercent": int64(100), "nested": map[string]any{"x": []any{"b"}}}})
	if p := Paths(a, c); len(p) != 1 || p[0] != "spec.nested.x" {
		t.Fatalf("paths = %v", p)
	}
}

func TestSummary(t *testing.T) {
	items := []Item{{Kind: "StorageClass", Name: "a", Deleted: true}, {Kind: "Store", Name: "b", Fields: []string{"spec.reserve"}}, {Kind: "Store", Name: "c", Fields: []string{"spec.x"}}}
	if s := Summary(items, 2); s != "StorageClass/a deleted; Store/b: spec.reserve; and 1 more" {
		t.Fatalf("summary = %q", s)
	}
}

func TestSubset(t *testing.T) {
	desired := map[string]any{
		"apiVersion": "storage.plinth.dev/v1alpha1", "kind": "Store",
		"metadata": map[string]any{"name": "p.n", "labels": map[string]any{"plinth.dev/pool": "p"}},
		"spec":     map[string]any{"pool": "p", "overcommitPercent": int64(100), "backend": map[string]any{"lvm": map[string]any{"devices": []any{"/dev/a"}}}},
	}
	live := map[string]any{
		"apiVersion": "storage.plinth.dev/v1alpha1", "kind": "Store",
		"metadata": map[string]any{"name": "p.n", "uid": "u", "resourceVersion": "9",
			"labels":      map[string]any{"plinth.dev/pool": "p", "other": "x"},
			"annotations": map[string]any{"someone": "else"}},
		"spec":   map[string]any{"pool": "p", "overcommitPercent": float64(100), "backend": map[string]any{"lvm": map[string]any{"devices": []any{"/dev/a"}, "thinPool": nil}}, "defaulted": "x"},
		"status": map[string]any{"capacity": map[string]any{}},
	}
	if !Subset(desired, live) {
		t.Fatal("live with defaults, other writers' fields and status must contain desired")
	}
	cases := map[string]func(m map[string]any){
		"label changed": func(m map[string]any) {
			m["metadata"].(map[string]any)["labels"].(map[string]any)["plinth.dev/pool"] = "q"
		},
		"value changed": func(m map[string]any) { m["spec"].(map[string]any)["pool"] = "q" },
		"list grew": func(m map[string]any) {
			m["spec"].(map[string]any)["backend"].(map[string]any)["lvm"].(map[string]any)["devices"] = []any{"/dev/a", "/dev/b"}
		},
		"field removed":  func(m map[string]any) { delete(m["spec"].(map[string]any), "overcommitPercent") },
		"labels removed": func(m map[string]any) { delete(m["metadata"].(map[string]any), "labels") },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			l := u(live).DeepCopy().Object
			mutate(l)
			if Subset(desired, l) {
				t.Fatal("difference not seen")
			}
		})
	}
}
