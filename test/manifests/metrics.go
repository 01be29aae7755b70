package manifests

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
)

// Metric is a Prometheus metric a package of the project registers: its name, its label names,
// and whether it is a histogram (exposed as <name>_bucket, <name>_sum and <name>_count).
type Metric struct {
	Name      string
	Labels    []string
	Histogram bool
	// Source is the file:line of the definition.
	Source string
}

// Series returns the series names the metric is exposed as.
func (m Metric) Series() []string {
	if m.Histogram {
		return []string{m.Name + "_bucket", m.Name + "_sum", m.Name + "_count"}
	}
	return []string{m.Name}
}

// RegisteredMetrics parses the non-test Go files under root (the module root; test/ and
// hidden folders are skipped) and returns the metrics defined there by name:
// prometheus.New{Counter,Gauge,Histogram,Summary}[Vec](XxxOpts{Name: "plinth_..."}, labels)
// and prometheus.NewDesc("plinth_...", help, labels, ...). Names must be string literals, as
// they are in the code (STYLE: metric names are constants of the contract). A name defined
// twice (the controller and the agent both define plinth_drift_objects) must have the same
// labels and type, else an error.
func RegisteredMetrics(root string) (map[string]Metric, error) {
	out := map[string]Metric{}
	var conflicts []string
	add := func(m Metric) {
		if prev, ok := out[m.Name]; ok && (strings.Join(prev.Labels, ",") != strings.Join(m.Labels, ",") || prev.Histogram != m.Histogram) {
			conflicts = append(conflicts, fmt.Sprintf("%s: %s has labels %v, %s has %v", m.Name, prev.Source, prev.Labels, m.Source, m.Labels))
		}
		out[m.Name] = m
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			n := d.Name()
			if p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "bin" || (n == "test" && filepath.Dir(p) == root)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			fn := sel.Sel.Name
			switch {
			case fn == "NewDesc" && len(call.Args) >= 3:
				if name := stringLit(call.Args[0]); strings.HasPrefix(name, "plinth_") {
					add(Metric{Name: name, Labels: stringList(call.Args[2]), Source: fset.Position(call.Pos()).String()})
				}
			case strings.HasPrefix(fn, "New") && len(call.Args) >= 1:
				lit, ok := call.Args[0].(*ast.CompositeLit)
				if !ok {
					return true
				}
				typ, ok := lit.Type.(*ast.SelectorExpr)
				if !ok || !strings.HasSuffix(typ.Sel.Name, "Opts") {
					return true
				}
				for _, e := range lit.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
						name := stringLit(kv.Value)
						if !strings.HasPrefix(name, "plinth_") {
							continue
						}
						m := Metric{Name: name, Histogram: typ.Sel.Name == "HistogramOpts", Source: fset.Position(call.Pos()).String()}
						if len(call.Args) >= 2 {
							m.Labels = stringList(call.Args[1])
						}
						add(m)
					}
				}
			}
			return true
		})
		return nil
	})
	if err == nil && len(conflicts) > 0 {
		err = fmt.Errorf("metrics defined twice differently: %s", strings.Join(conflicts, "; "))
	}
	return out, err
}

func stringLit(e ast.Expr) string {
	if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
		if s, err := strconv.Unquote(b.Value); err == nil {
			return s
		}
	}
	return ""
}

func stringList(e ast.Expr) []string {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil
	}
	var out []string
	for _, el := range lit.Elts {
		if s := stringLit(el); s != "" {
			out = append(out, s)
		}
	}
	return out
}
