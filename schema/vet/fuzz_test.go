package vet

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	cueschema "github.com/plinth-storage/plinth/schema/cue"
)

// FuzzVetAgreesWithCUE mutates policy documents and wants plinth vet's verdict on each
// document on its own — Judge, the path `plinth vet` and the controller take — to equal plain
// CUE's: the document alone unified with its kind's closed definition, as
// `cue vet -c -d '#Kind'` judges it. The seeds are every policy document of examples/ and
// policies/ and the committed corpus in testdata/fuzz/FuzzVetAgreesWithCUE, which holds
// misspelled Placement fields and an unknown top-level field that plinth vet once let through.
// Each input is a document (mutated as bytes by the fuzzer) and one edit of its fields, so
// that most inputs stay YAML: node picks a field or list element (in key order, modulo their
// number), op the edit (see edit), text the name or value it writes. An input vet cannot read
// as one document of a policy kind (a YAML error, several documents, another kind) has no CUE
// verdict to compare with and is passed; `go test` runs the seeds.
func FuzzVetAgreesWithCUE(f *testing.F) {
	var seeds int
	for _, dir := range []string{"../../examples", "../../policies"} {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || (filepath.Ext(path) != ".yaml" && filepath.Ext(path) != ".yml") {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, doc := range splitDocuments(data) {
				if strings.Contains(string(doc), "apiVersion: "+PolicyGroup+"/") {
					f.Add(doc, uint16(i*7), uint8(i), []string{"", "specs", "12345", "true", "reclaimPolcy"}[i%5])
					seeds++
				}
			}
			return nil
		})
		if err != nil {
			f.Fatal(err)
		}
	}
	if seeds < 6 {
		f.Fatalf("%d policy documents under examples/ and policies/, want at least 6 seeds", seeds)
	}
	v, err := NewVetter()
	if err != nil {
		f.Fatal(err)
	}
	plain := newPlainCUE(f)
	f.Fuzz(func(t *testing.T, doc []byte, node uint16, op uint8, text string) {
		data := edit(doc, int(node), op, text)
		set := LoadBytes("fuzz.yaml", data)
		if len(set.Problems) > 0 || len(set.Documents) != 1 {
			return
		}
		d := set.Documents[0]
		if _, known := cueschema.Definitions[d.Kind]; !known {
			return
		}
		vr := v.Judge(d)
		cueErr := plain.refuses(d.Kind, data)
		if (len(vr.Problems) > 0) != (cueErr != nil) {
			t.Fatalf("plinth vet and plain CUE disagree on\n%s\nvet: %v\ncue: %v", data, vr.Problems, cueErr)
		}
		for _, p := range vr.Problems {
			if p.Line <= 0 || p.Column <= 0 {
				t.Errorf("problem without a position: %s\n%s", p, data)
			}
		}
	})
}

// edit applies one edit to the node-th field or list element of doc (depth first, keys
// sorted): op%5 0 none, 1 rename the field to text (a letter dropped when text is empty), 2 add
// a sibling field named text (its name with "Extra" when empty), 3 set the value to text read
// as YAML (a string when it does not parse), 4 delete the field. doc is returned unchanged
// when it is not one YAML mapping or the edit does not apply.
func edit(doc []byte, node int, op uint8, text string) []byte {
	if op%5 == 0 {
		return doc
	}
	var tree any
	if err := yaml.Unmarshal(doc, &tree); err != nil {
		return doc
	}
	type site struct {
		m   map[string]any
		l   []any
		key string
		i   int
	}
	var sites []site
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				sites = append(sites, site{m: v, key: k})
				walk(v[k])
			}
		case []any:
			for i, e := range v {
				sites = append(sites, site{l: v, i: i})
				walk(e)
			}
		}
	}
	walk(tree)
	if len(sites) == 0 {
		return doc
	}
	s := sites[node%len(sites)]
	var value any = text
	if err := yaml.Unmarshal([]byte(text), &value); err != nil {
		value = text
	}
	switch op % 5 {
	case 1, 2, 4:
		if s.m == nil {
			return doc // a list element has no name
		}
		switch op % 5 {
		case 1:
			name := text
			if name == "" {
				r := []rune(s.key)
				name = string(r[:len(r)/2]) + string(r[len(r)/2+min(1, len(r)):])
			}
			s.m[name] = s.m[s.key]
			if name != s.key {
				delete(s.m, s.key)
			}
		case 2:
			name := text
			if name == "" {
				name = s.key + "Extra"
			}
			s.m[name] = "v"
		case 4:
			delete(s.m, s.key)
		}
	case 3:
		if s.m != nil {
			s.m[s.key] = value
		} else {
			s.l[s.i] = value
		}
	}
	out, err := yaml.Marshal(tree)
	if err != nil {
		return doc
	}
	return out
}
