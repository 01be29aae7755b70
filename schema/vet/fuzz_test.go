package vet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	cueschema "github.com/plinth-storage/plinth/schema/cue"
)

// FuzzVetAgreesWithCUE mutates policy documents (the seeds: every policy document of
// examples/ and policies/, and the committed corpus in testdata/fuzz/FuzzVetAgreesWithCUE,
// which holds misspelled Placement fields that plinth vet once let through) and wants plinth
// vet's verdict on each document on its own — Judge, the path `plinth vet` and the controller
// take — to equal plain CUE's: the document alone unified with its kind's closed definition,
// as `cue vet -c -d '#Kind'` judges it. An input vet cannot read as one policy document of a
// known kind (a YAML error, several documents, a kind that is not a policy kind) has no CUE
// verdict to compare with and is skipped; `go test` runs the seeds.
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
			for _, doc := range splitDocuments(data) {
				if strings.Contains(string(doc), "apiVersion: "+PolicyGroup+"/") {
					f.Add(doc)
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
	f.Fuzz(func(t *testing.T, data []byte) {
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
