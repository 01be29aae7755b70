package vet

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"cuelang.org/go/cue"
	cueyaml "cuelang.org/go/encoding/yaml"

	cueschema "github.com/plinth-storage/plinth/schema/cue"
	"github.com/plinth-storage/plinth/schema/vet/vettest"
	"github.com/plinth-storage/plinth/test/prereq"
)

// plainCUE judges one YAML document as `cue vet -c -d '#Kind' policy.cue doc.yaml` does,
// through the CUE Go API: the document decoded by CUE's YAML decoder, on its own, unified with
// the kind's closed definition and validated for concreteness. It reads the YAML text itself
// (not vet's Load) and is the stand-in for the cue command where the pinned binary is absent,
// and the reference of the differential fuzz test.
type plainCUE struct{ s *cueschema.Schema }

func newPlainCUE(t testing.TB) *plainCUE {
	t.Helper()
	s, err := cueschema.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return &plainCUE{s: s}
}

// refuses returns the error of judging doc (one YAML document) as kind, nil when accepted.
// A document that is not YAML is refused as cue vet refuses it. The document is built as an
// expression: a file (BuildFile) would stay registered in the context for good.
func (p *plainCUE) refuses(kind string, doc []byte) error {
	expr, err := cueyaml.NewDecoder("doc.yaml", bytes.NewReader(doc)).Extract()
	if err != nil {
		return err
	}
	v := p.s.Context.BuildExpr(expr)
	if err := v.Err(); err != nil {
		return err
	}
	return p.s.Defs[kind].Unify(v).Validate(cue.Concrete(true))
}

// mutantSet is the base documents with the mutant's base replaced by the mutant, in a file of
// its own (mutant.yaml): the set plinth vet judges.
func mutantSet(bases *Set, m vettest.Mutant) *Set {
	ms := LoadBytes("mutant.yaml", m.YAML)
	out := &Set{Problems: ms.Problems}
	for _, d := range bases.Documents {
		if d.Kind == m.Field.Kind && d.Name == m.Name {
			continue
		}
		out.Documents = append(out.Documents, d)
	}
	out.Documents = append(out.Documents, ms.Documents...)
	return out
}

// TestMisspelledUnknownOrMistypedFieldsAreRefusedLikeCUE judges the mutants the CUE schema
// generates (schema/vet/vettest: for every field of StoragePool, Protocol and Placement, the
// field misspelled, an unknown sibling added, a value of the wrong type) with plinth vet's
// Vetter and with plain CUE, and wants from both the verdict of the closed definition (every
// mutant refused, now that metadata is closed as server-side apply is; a struct left open
// would let its misspelled optional fields and added keys pass, and the mutant says so).
// controllers/policy's test holds the API server and the controller's vet to the same
// verdicts. Vet must name a problem in the mutant's file on the mutated field's lines, on the
// field itself (a misspelled required field is reported missing) or on a sibling in the same
// struct. Plain CUE is the CUE Go API judging the YAML text alone; the subtest cue-cli runs
// the real cue command (PLINTH_CUE; make test-unit sets it, and where it is unset under CI or
// PLINTH_INTEGRATION=1 the subtest fails).
func TestMisspelledUnknownOrMistypedFieldsAreRefusedLikeCUE(t *testing.T) {
	plain := newPlainCUE(t)
	mutants, err := vettest.Mutants(plain.s)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	bases := LoadBytes("bases.yaml", vettest.BasesYAML())
	if _, problems := v.Vet(bases); len(problems) > 0 || len(bases.Problems) > 0 {
		t.Fatalf("the base documents must vet clean: %v %v", problems, bases.Problems)
	}
	for _, d := range bases.Documents {
		if err := plain.refuses(d.Kind, d.YAML); err != nil {
			t.Fatalf("plain CUE refuses base %s/%s: %v", d.Kind, d.Name, err)
		}
	}

	counts := map[string]map[vettest.Mutation]int{}
	refused := 0
	for _, m := range mutants {
		if counts[m.Field.Kind] == nil {
			counts[m.Field.Kind] = map[vettest.Mutation]int{}
		}
		counts[m.Field.Kind][m.How]++
		if m.SchemaRefuses {
			refused++
		}
		_, problems := v.Vet(mutantSet(bases, m))
		var own []Problem
		for _, p := range problems {
			if p.File == "mutant.yaml" {
				own = append(own, p)
			}
		}
		cueErr := plain.refuses(m.Field.Kind, m.YAML)
		switch {
		case m.SchemaRefuses && len(own) == 0:
			t.Errorf("%s: plinth vet accepts it (problems elsewhere: %v), the closed definition refuses it\n%s", m, problems, m.YAML)
			continue
		case !m.SchemaRefuses && len(problems) > 0:
			t.Errorf("%s: plinth vet refuses it (%v), the schema leaves the struct open\n%s", m, problems, m.YAML)
		}
		if (cueErr != nil) != m.SchemaRefuses {
			t.Errorf("%s: plain CUE error %v, want refused=%v\n%s", m, cueErr, m.SchemaRefuses, m.YAML)
		}
		if m.SchemaRefuses && !positioned(own, m) {
			t.Errorf("%s: no problem on lines %d-%d of mutant.yaml or on %s: %v\n%s", m, m.Line, m.LastLine, m.Field, own, m.YAML)
		}
	}
	total := 0
	for _, kind := range vettest.Kinds() {
		c := counts[kind]
		n := c[vettest.Misspelled] + c[vettest.UnknownSibling] + c[vettest.WrongType]
		total += n
		t.Logf("%s: %d mutants (%d misspelled, %d unknown sibling, %d wrong type)", kind, n,
			c[vettest.Misspelled], c[vettest.UnknownSibling], c[vettest.WrongType])
		// Every kind has its header, metadata and spec fields, each with three mutants.
		if c[vettest.Misspelled] < 5 || c[vettest.UnknownSibling] != c[vettest.Misspelled] || c[vettest.WrongType] < c[vettest.Misspelled] {
			t.Errorf("%s: mutant counts %v: want each named field mutated three ways", kind, c)
		}
	}
	t.Logf("%d mutants, %d refused by the schema", total, refused)

	t.Run("cue-cli", func(t *testing.T) {
		cueBin := prereq.Env(t, "PLINTH_CUE", "the pinned cue binary; make test-unit and make test-integration set it")
		dir := t.TempDir()
		type result struct {
			m   vettest.Mutant
			out []byte
			err error
		}
		results := make([]result, len(mutants))
		var wg sync.WaitGroup
		next := make(chan int)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					m := mutants[i]
					f := filepath.Join(dir, fmt.Sprintf("mutant-%d.yaml", i))
					if err := os.WriteFile(f, m.YAML, 0o644); err != nil {
						results[i] = result{m: m, err: err}
						continue
					}
					out, err := exec.Command(cueBin, "vet", "-c", "-d", cueschema.Definitions[m.Field.Kind], "../cue/policy.cue", f).CombinedOutput()
					results[i] = result{m: m, out: out, err: err}
				}
			}()
		}
		for i := range mutants {
			next <- i
		}
		close(next)
		wg.Wait()
		for _, r := range results {
			var exit *exec.ExitError
			if r.err != nil && !asExit(r.err, &exit) {
				t.Fatalf("%s: cue: %v", r.m, r.err)
			}
			if (r.err != nil) != r.m.SchemaRefuses {
				t.Errorf("%s: cue vet exit %v, want refused=%v\n%s\n%s", r.m, r.err, r.m.SchemaRefuses, r.out, r.m.YAML)
			}
		}
	})
}

func asExit(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*target = e
	return ok
}

// positioned reports whether a problem names the mutated field's lines, the field itself (a
// required field misspelled is reported missing where its struct is), or a sibling in the same
// struct (CUE reports a failed rule of the struct, such as auth's "bidirectional needs mode
// DHHMACCHAP" for a misspelled mode, instead of the unknown key).
func positioned(ps []Problem, m vettest.Mutant) bool {
	field := strings.Join(m.Field.Path, ".")
	parent := strings.Join(m.Field.Path[:len(m.Field.Path)-1], ".")
	for _, p := range ps {
		switch {
		case p.Line <= 0 || p.Column <= 0:
		case p.Line >= m.Line && p.Line <= m.LastLine:
			return true
		case p.Field == field:
			return true
		case parent != "" && strings.HasPrefix(p.Field, parent+"."):
			return true
		}
	}
	return false
}
