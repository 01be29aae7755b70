package failpoint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestEveryPointPlacedAndArmed reads the module's sources: every point of the catalogue (the
// string constants of failpoint.go, all listed by Known) is hit somewhere in the code
// (Hit(failpoint.X) in a non-test file) and armed by some test outside this package — a
// _test.go file or a test script naming the constant (failpoint.X) or arming the point by
// name (name=once, name=exit in PLINTH_FAILPOINTS). A point no test arms is a crash nobody
// has shown the node to recover from; this test names it.
func TestEveryPointPlacedAndArmed(t *testing.T) {
	consts := catalogue(t)
	known := Known()
	var values []string
	for _, v := range consts {
		values = append(values, v)
	}
	slices.Sort(values)
	if !slices.Equal(values, known) {
		t.Fatalf("the constants of failpoint.go %v and Known() %v differ", values, known)
	}

	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	hitRe := regexp.MustCompile(`\bfailpoint\.Hit\(failpoint\.(\w+)\)`)
	refRe := regexp.MustCompile(`\bfailpoint\.(\w+)\b`)
	hit := map[string][]string{}   // constant → files that hit it
	armed := map[string][]string{} // point name → test files that arm it
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "vendor", "bin", ".work", "node_modules", "testdata":
				return filepath.SkipDir
			}
			if path == self {
				return filepath.SkipDir // this package's own tests name points to parse them, not to arm them
			}
			return nil
		}
		isTest := strings.HasSuffix(path, "_test.go")
		isScript := strings.HasSuffix(path, ".sh")
		if !strings.HasSuffix(path, ".go") && !isScript {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		src := string(b)
		rel, _ := filepath.Rel(root, path)
		if !isTest && !isScript {
			for _, m := range hitRe.FindAllStringSubmatch(src, -1) {
				hit[m[1]] = append(hit[m[1]], rel)
			}
			return nil
		}
		for _, m := range refRe.FindAllStringSubmatch(src, -1) {
			if v, ok := consts[m[1]]; ok && !slices.Contains(armed[v], rel) {
				armed[v] = append(armed[v], rel)
			}
		}
		for _, v := range consts {
			if (strings.Contains(src, v+"=once") || strings.Contains(src, v+"=exit")) && !slices.Contains(armed[v], rel) {
				armed[v] = append(armed[v], rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d source files under %s: not the module", files, root)
	}
	for ident, v := range consts {
		if len(hit[ident]) == 0 {
			t.Errorf("point %s (failpoint.%s) is hit nowhere: no failpoint.Hit(failpoint.%s) in the code", v, ident, ident)
		}
		if len(armed[v]) == 0 {
			t.Errorf("point %s (failpoint.%s) is armed by no test: no _test.go file or test script names failpoint.%s or arms %s=once", v, ident, ident, v)
		}
	}
	t.Logf("%d points; armed in: %v", len(consts), armed)
}

// catalogue returns the string constants of failpoint.go whose value is a point name
// (identifier → name): every untyped string constant but Env.
func catalogue(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "failpoint.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if vs.Type != nil {
				continue // the Actions
			}
			for i, n := range vs.Names {
				if i >= len(vs.Values) || n.Name == "Env" {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue // ExitCode
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				out[n.Name] = v
			}
		}
	}
	return out
}
