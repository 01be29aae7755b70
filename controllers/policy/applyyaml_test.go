package policy_test

import (
	"encoding/json"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/controllers/render"
)

// applyBodyObjects are rendered objects of every kind (fleet policies on two Nodes) and a
// hand-made object with what render does not produce today: nested lists, empty collections,
// strings YAML would read as other types, escapes, numbers of each kind.
func applyBodyObjects(t testing.TB) []*unstructured.Unstructured {
	t.Helper()
	p, proto, pl := fleetPolicies()
	pl.Spec.Filesystem.MountOptions = []string{"noatime", "discard"}
	pl.Spec.StorageClass.IsDefault = true
	pol := vetFleetPolicies(t, p, proto, pl)
	var nodes []corev1.Node
	for _, n := range []string{"fleet-00001", "fleet-00002"} {
		nodes = append(nodes, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"plinth.dev/storage": "fleet"}}})
	}
	out, err := render.Render(render.Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements, Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := out.Unstructured()
	if err != nil {
		t.Fatal(err)
	}
	odd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Odd",
		"metadata": map[string]any{"name": "odd", "annotations": map[string]any{
			"yes": "no", "on": "off", "null": "~", "n": "0x1F", "e": "", "colon": "a: b", "hash": "# c",
			"quote": `"'\`, "lines": "one\ntwo\tthree", "html": "<&>", "utf8": "ünï €", "dash": "- x", "brace": "{[x]}"}},
		"spec": map[string]any{
			"ints": []any{int64(0), int64(-1), int64(1 << 53), int64(42)}, "floats": []any{0.5, -2.25, 1e21},
			"bools": []any{true, false}, "nil": nil, "emptyMap": map[string]any{}, "emptyList": []any{},
			"nested": []any{[]any{"a", map[string]any{"k": "v", "l": []any{"x"}}}, map[string]any{}, []any{}},
			"maps":   []any{map[string]any{"a": int64(1), "b": map[string]any{"c": "d"}}},
		},
	}}
	return append(objs, odd)
}

// TestApplyBodyDecodesAsJSON: the API server reads an apply body with sigs.k8s.io/yaml; every
// object must read back exactly as its JSON encoding (the body the client sent before) does.
func TestApplyBodyDecodesAsJSON(t *testing.T) {
	for _, u := range applyBodyObjects(t) {
		body, err := policy.ApplyBody(u.Object)
		if err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
		var got, want map[string]any
		if err := yaml.Unmarshal(body, &got); err != nil {
			t.Fatalf("%s %s: decode:\n%s\n%v", u.GetKind(), u.GetName(), body, err)
		}
		j, err := json.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(j, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s %s reads back as\n%v\nwant\n%v\nbody:\n%s", u.GetKind(), u.GetName(), got, want, body)
		}
	}
	if _, err := policy.ApplyBody(map[string]any{"x": struct{}{}}); err == nil {
		t.Error("a value of an unknown type encoded without an error")
	}
}

// BenchmarkApplyBodyDecode: the API server's decode of one apply body (sigs.k8s.io/yaml
// Unmarshal, as its apply handler does), for the rendered Store sent as JSON and as applyBody.
func BenchmarkApplyBodyDecode(b *testing.B) {
	var store *unstructured.Unstructured
	for _, u := range applyBodyObjects(b) {
		if u.GetKind() == "Store" {
			store = u
			break
		}
	}
	j, err := json.Marshal(store.Object)
	if err != nil {
		b.Fatal(err)
	}
	y, err := policy.ApplyBody(store.Object)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		body []byte
	}{{"json", j}, {"block-yaml", y}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := map[string]any{}
				if err := yaml.Unmarshal(c.body, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
