package vet

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	cueyaml "cuelang.org/go/encoding/yaml"
	"sigs.k8s.io/yaml"
)

// TestAppendJSON holds the JSON appendJSON makes of the CUE YAML decoder's syntax tree equal
// to the JSON of the YAML text (sigs.k8s.io/yaml) where the two readings of YAML agree, and
// requires it to decline the forms it does not take, so the caller decodes the CUE value.
func TestAppendJSON(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		ok        bool
		// want is the JSON expected where the readings differ; "" compares with sigs.k8s.io/yaml.
		want string
	}{
		{"scalars", "a: x\nb: 3\nc: -4\nd: 1.5\ne: -2.5e3\nf: true\ng: false\nh: null\ni: ''\n", true, ""},
		{"nesting", "a: {b: [1, {c: [x, z]}], d: {}}\ne: []\n", true, ""},
		// YAML 1.1 (sigs.k8s.io/yaml) reads these as booleans, YAML 1.2 (CUE, and so the
		// schema) as strings: the typed decode must see what the schema judged.
		{"yaml 1.1 booleans", "a: [y, yes, on, n, off]\n", true, `{"a":["y","yes","on","n","off"]}`},
		{"escapes", "a: \"q\\\"uote\\\\back\\ttab\\nnl\\u0001\\u00e9\"\nb: 'it''s'\nc: \"\\u2028é日本\"\n", true, ""},
		{"block scalars", "a: |\n  line one\n  line \"two\"\nb: >-\n  folded\n  text\n", true, ""},
		{"keys", "\"quoted key\": 1\nexample.com/rack: r1\n\"a\\\"b\": 2\n", true, ""},
		{"numeric and bool-looking strings", "a: \"1\"\nb: \"true\"\nc: \"null\"\nd: 10.20.0.0/16\ne: 5%\n", true, ""},
		{"anchors", "a: &x {b: 1}\nc: *x\n", true, ""},
		{"octal", "a: 0o17\n", false, ""},
		{"hex", "a: 0x1f\n", false, ""},
		{"tagged float", "a: !!float 1\n", false, ""},
		{"infinity", "a: .inf\n", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expr, err := cueyaml.NewDecoder("doc.yaml", bytes.NewReader([]byte(tc.doc))).Extract()
			if err != nil {
				t.Fatal(err)
			}
			got, ok := appendJSON(nil, expr)
			if ok != tc.ok {
				t.Fatalf("appendJSON ok = %v, want %v (JSON %s)", ok, tc.ok, got)
			}
			if !ok {
				return
			}
			want := []byte(tc.want)
			if tc.want == "" {
				if want, err = yaml.YAMLToJSON([]byte(tc.doc)); err != nil {
					t.Fatal(err)
				}
			}
			var g, w any
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatalf("appendJSON made invalid JSON %s: %v", got, err)
			}
			if err := json.Unmarshal(want, &w); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(g, w) {
				t.Errorf("JSON differs\n got %s\nwant %s", got, want)
			}
		})
	}
}

// TestVetDecodesWhatTheSchemaJudged vets documents whose typed decode needs the CUE reading
// of YAML: a port in hexadecimal and a queue size in octal (syntax appendJSON declines, so the
// CUE value is decoded) and an mkfs option value (the label "on") that YAML 1.1 would read as a boolean.
func TestVetDecodesWhatTheSchemaJudged(t *testing.T) {
	v, err := NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	doc := "apiVersion: policy.plinth.dev/v1alpha1\nkind: Protocol\nmetadata: {name: p}\nspec:\n  nvmeofTcp: {port: 0x1144, maxQueueSize: 0o100, bindCIDR: 10.0.0.0/8}\n---\n" +
		"apiVersion: policy.plinth.dev/v1alpha1\nkind: StoragePool\nmetadata: {name: s}\nspec:\n  backend: {file: {directory: /var/lib/plinth}}\n---\n" +
		"apiVersion: policy.plinth.dev/v1alpha1\nkind: Placement\nmetadata: {name: x}\nspec:\n  poolRef: {name: s}\n  protocolRef: {name: p}\n  storageClass: {name: x}\n  filesystem: {mkfsOptions: [-L, on]}\n"
	pol, problems := v.Vet(LoadBytes("doc.yaml", []byte(doc)))
	if len(problems) > 0 {
		t.Fatalf("problems: %v", problems)
	}
	if len(pol.Protocols) != 1 || len(pol.Placements) != 1 {
		t.Fatalf("decoded %d protocols, %d placements; want 1 each", len(pol.Protocols), len(pol.Placements))
	}
	tcp := pol.Protocols[0].Spec.NVMeoFTCP
	if tcp == nil || tcp.Port != 4420 || tcp.MaxQueueSize != 64 {
		t.Errorf("nvmeofTcp decoded as %+v, want port 4420 and maxQueueSize 64", tcp)
	}
	if fs := pol.Placements[0].Spec.Filesystem; !reflect.DeepEqual(fs.MkfsOptions, []string{"-L", "on"}) {
		t.Errorf("filesystem decoded as %+v, want mkfsOptions [-L on]", fs)
	}
}
