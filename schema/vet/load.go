package vet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"cuelang.org/go/cue/ast"
	cueerrors "cuelang.org/go/cue/errors"
	"cuelang.org/go/cue/literal"
	cueyaml "cuelang.org/go/encoding/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// PolicyGroup is the API group of the documents vet judges; others pass through untouched.
const PolicyGroup = "policy.plinth.dev"

// originAnnotation is where kustomize records the source file of a built resource
// (buildMetadata: [originAnnotations]).
const originAnnotation = "config.kubernetes.io/origin"

// Document is one YAML document of a policy set.
type Document struct {
	// File is the path of the file that holds the document (for kustomize builds, the source
	// file kustomize recorded, or the kustomization folder when it recorded none).
	File string
	// Line and Column locate the start of the document in File (1-based; 0 if unknown).
	Line, Column int
	// APIVersion, Kind and Name are read from the document ("" when absent or not strings).
	APIVersion, Kind, Name string
	// Expr is the document as CUE syntax, with positions; nil after DropSyntax.
	Expr ast.Expr
	// YAML is the document's text (after kustomize, when built).
	YAML []byte
	// Build is the kustomization folder that built the document, "" for plain files.
	Build string

	// source is the same object in its source file, used for positions of kustomize output.
	source *Document
	// whole: YAML is all of its file's text, so parsing it again gives Expr's positions.
	whole bool
}

// DropSyntax frees the document's syntax tree (Expr, about 4 KiB for a policy document, ten
// times its text) once it has been judged: a document kept for long, such as a controller's
// verdict, then costs about its text. Positions (Position, the problems of the cross-object
// rules) are then found by parsing YAML again. It does so only for a document that is the
// whole text it was read from (LoadBytes of a single document without "---") and returns
// whether it did; Judge needs the tree, so judge before dropping it.
func (d *Document) DropSyntax() bool {
	if !d.whole {
		return false
	}
	d.Expr = nil
	return true
}

// syntax returns Expr, or parses YAML again when DropSyntax dropped it (nil if that fails).
func (d *Document) syntax() ast.Expr {
	if d.Expr != nil || !d.whole {
		return d.Expr
	}
	expr, err := cueyaml.NewDecoder(d.File, bytes.NewReader(d.YAML)).Extract()
	if err != nil {
		return nil
	}
	return expr
}

// Group returns the API group of the document, "" for the core group.
func (d *Document) Group() string {
	if i := strings.IndexByte(d.APIVersion, '/'); i >= 0 {
		return d.APIVersion[:i]
	}
	return ""
}

// IsPolicy reports whether the document belongs to the policy.plinth.dev group.
func (d *Document) IsPolicy() bool { return d.Group() == PolicyGroup }

// Set is a loaded policy set: every document of the paths given, and the problems found while
// reading them (syntax errors, documents that are not mappings).
type Set struct {
	Documents []*Document
	Problems  []Problem
}

// Load reads files and folders. A folder with a kustomization.yaml (or .yml, or Kustomization)
// is built with kustomize first, as Flux would; other folders are walked recursively for
// *.yaml and *.yml files, building each sub-folder that holds a kustomization as a unit.
// Problems in the documents are returned in the Set; the error is only for I/O and kustomize
// failures (a missing path, an unreadable file, a broken kustomization).
func Load(paths ...string) (*Set, error) {
	s := &Set{}
	if len(paths) == 0 {
		return nil, errors.New("no path given")
	}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			if err := s.loadFile(p); err != nil {
				return nil, err
			}
			continue
		}
		if err := s.loadDir(p); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// LoadBytes reads one YAML stream as if it were the file named by path.
func LoadBytes(path string, data []byte) *Set {
	s := &Set{}
	s.parse(path, data, nil)
	return s
}

func kustomizationFile(dir string) string {
	for _, n := range []string{"kustomization.yaml", "kustomization.yml", "Kustomization"} {
		if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
			return n
		}
	}
	return ""
}

func (s *Set) loadDir(dir string) error {
	if kustomizationFile(dir) != "" {
		return s.loadKustomization(dir)
	}
	kdirs, files, err := walkPolicyDir(dir)
	if err != nil {
		return err
	}
	for _, k := range kdirs {
		files = append(files, k+string(filepath.Separator))
	}
	sort.Strings(files)
	for _, f := range files {
		if strings.HasSuffix(f, string(filepath.Separator)) {
			if err := s.loadKustomization(strings.TrimSuffix(f, string(filepath.Separator))); err != nil {
				return err
			}
			continue
		}
		if err := s.loadFile(f); err != nil {
			return err
		}
	}
	return nil
}

func (s *Set) loadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s.parse(path, data, nil)
	return nil
}

// loadKustomization builds dir with kustomize through a wrapper kustomization in a temporary
// folder that turns on origin annotations, so every built document can be traced back to the
// file (and, through that file's own parse, the line) it came from.
func (s *Set) loadKustomization(dir string) error {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	wrap, err := os.MkdirTemp("", "plinth-vet-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(wrap)
	rel, err := filepath.Rel(wrap, absDir)
	if err != nil {
		return err
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %q\nbuildMetadata: [originAnnotations]\n", filepath.ToSlash(rel))
	if err := os.WriteFile(filepath.Join(wrap, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		return err
	}
	kz := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resMap, err := kz.Run(filesys.MakeFsOnDisk(), wrap)
	if err != nil {
		return fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	sources := map[string]*Set{}
	for _, r := range resMap.Resources() {
		origin := ""
		if ann := r.GetAnnotations(); ann != nil {
			origin = ann[originAnnotation]
		}
		if origin != "" {
			ann := r.GetAnnotations()
			delete(ann, originAnnotation)
			if len(ann) == 0 {
				ann = nil
			}
			if err := r.SetAnnotations(ann); err != nil {
				return fmt.Errorf("kustomize build %s: %w", dir, err)
			}
		}
		y, err := r.AsYAML()
		if err != nil {
			return fmt.Errorf("kustomize build %s: %w", dir, err)
		}
		file := dir
		var src *Document
		if origin != "" {
			var o struct {
				Path string `json:"path"`
			}
			if yaml.Unmarshal([]byte(origin), &o) == nil && o.Path != "" && !strings.Contains(o.Path, "://") {
				abs := filepath.Join(wrap, filepath.FromSlash(o.Path))
				file = displayPath(abs)
				src = sourceDocument(sources, file, r.GetKind(), r.GetName())
			}
		}
		n := len(s.Documents)
		s.parse(file, y, src)
		for _, d := range s.Documents[n:] {
			d.Build = dir
		}
	}
	return nil
}

// displayPath makes an absolute path relative to the working directory when it lies below it.
func displayPath(abs string) string {
	wd, err := os.Getwd()
	if err != nil {
		return abs
	}
	if rel, err := filepath.Rel(wd, abs); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return abs
}

func sourceDocument(cache map[string]*Set, file, kind, name string) *Document {
	set, ok := cache[file]
	if !ok {
		set = &Set{}
		if data, err := os.ReadFile(file); err == nil {
			set.parse(file, data, nil)
		}
		cache[file] = set
	}
	for _, d := range set.Documents {
		if d.Kind == kind && d.Name == name {
			return d
		}
	}
	return nil
}

// parse splits a YAML stream into documents with their positions.
func (s *Set) parse(path string, data []byte, source *Document) {
	chunks := splitDocuments(data)
	if len(chunks) == 0 {
		return // only whitespace and "---"
	}
	dec := cueyaml.NewDecoder(path, bytes.NewReader(data))
	for i := 0; ; i++ {
		expr, err := dec.Extract()
		if err == io.EOF {
			return
		}
		if err != nil {
			s.Problems = append(s.Problems, syntaxProblem(path, err, source))
			return
		}
		if lit, ok := expr.(*ast.BasicLit); ok && lit.Value == "null" {
			continue // an empty document, such as the one after a trailing "---"
		}
		if _, ok := expr.(*ast.StructLit); !ok {
			pos := expr.Pos()
			s.Problems = append(s.Problems, Problem{File: path, Line: pos.Line(), Column: pos.Column(),
				Message: "document is not a mapping (a Kubernetes object must be a YAML mapping)"})
			continue
		}
		d := &Document{File: path, Expr: expr, source: source}
		if pos := expr.Pos(); pos.IsValid() {
			d.Line, d.Column = pos.Line(), pos.Column()
		}
		if source != nil {
			d.Line, d.Column = source.Line, source.Column
		}
		d.APIVersion, d.Kind, d.Name = headerOf(expr)
		if i < len(chunks) {
			d.YAML = chunks[i]
			d.whole = len(chunks) == 1 && source == nil && bytes.Equal(chunks[0], data)
		} else {
			d.YAML = data
		}
		s.Documents = append(s.Documents, d)
	}
}

// splitDocuments splits a YAML stream at "---" lines. It is used only to keep each document's
// text for pass-through; positions come from the CUE decoder.
func splitDocuments(data []byte) [][]byte {
	var out [][]byte
	var cur bytes.Buffer
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if t := bytes.TrimRight(line, " \t\r\n"); bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			if len(bytes.TrimSpace(cur.Bytes())) > 0 {
				out = append(out, append([]byte(nil), cur.Bytes()...))
			}
			cur.Reset()
			continue
		}
		cur.Write(line)
	}
	if len(bytes.TrimSpace(cur.Bytes())) > 0 {
		out = append(out, append([]byte(nil), cur.Bytes()...))
	}
	return out
}

func syntaxProblem(path string, err error, source *Document) Problem {
	// The YAML decoder reports "PATH:LINE: MESSAGE" without a structured position.
	msg := err.Error()
	p := Problem{File: path, Message: "invalid YAML: " + msg}
	if rest, ok := strings.CutPrefix(msg, path+":"); ok {
		var line int
		if n, _ := fmt.Sscanf(rest, "%d:", &line); n == 1 {
			p.Line, p.Column = line, 1
			if _, m, ok := strings.Cut(rest, ": "); ok {
				p.Message = "invalid YAML: " + m
			}
		}
	}
	for _, e := range cueerrors.Errors(err) {
		if pos := e.Position(); pos.IsValid() {
			p.Line, p.Column = pos.Line(), pos.Column()
		}
	}
	if source != nil && p.Line == 0 {
		p.Line, p.Column = source.Line, source.Column
	}
	return p
}

// headerOf reads apiVersion, kind and metadata.name from a document's syntax without evaluating it.
func headerOf(expr ast.Expr) (apiVersion, kind, name string) {
	st, ok := expr.(*ast.StructLit)
	if !ok {
		return
	}
	for _, el := range st.Elts {
		f, ok := el.(*ast.Field)
		if !ok {
			continue
		}
		label, _, _ := ast.LabelName(f.Label)
		switch label {
		case "apiVersion":
			apiVersion = stringLit(f.Value)
		case "kind":
			kind = stringLit(f.Value)
		case "metadata":
			if md, ok := f.Value.(*ast.StructLit); ok {
				for _, mel := range md.Elts {
					if mf, ok := mel.(*ast.Field); ok {
						if l, _, _ := ast.LabelName(mf.Label); l == "name" {
							name = stringLit(mf.Value)
						}
					}
				}
			}
		}
	}
	return
}

func stringLit(e ast.Expr) string {
	lit, ok := e.(*ast.BasicLit)
	if !ok {
		return ""
	}
	v, err := literal.Unquote(lit.Value)
	if err != nil {
		return ""
	}
	return v
}

// fieldPos finds the position of a dotted field path in a document's syntax; it walks up the
// path until a field is found and returns false when none is.
func fieldPos(expr ast.Expr, path []string) (line, col int, ok bool) {
	for n := len(path); n >= 0; n-- {
		if e := lookupSyntax(expr, path[:n]); e != nil {
			if pos := e.Pos(); pos.IsValid() {
				return pos.Line(), pos.Column(), true
			}
		}
	}
	return 0, 0, false
}

func lookupSyntax(expr ast.Expr, path []string) ast.Node {
	var cur ast.Node = expr
	for _, sel := range path {
		st, ok := cur.(*ast.StructLit)
		if !ok {
			if l, ok := cur.(*ast.ListLit); ok {
				var idx int
				if _, err := fmt.Sscanf(sel, "%d", &idx); err == nil && idx >= 0 && idx < len(l.Elts) {
					cur = l.Elts[idx]
					continue
				}
			}
			return nil
		}
		var next ast.Node
		for _, el := range st.Elts {
			if f, ok := el.(*ast.Field); ok {
				if l, _, _ := ast.LabelName(f.Label); l == sel {
					next = f.Value
					break
				}
			}
		}
		if next == nil {
			return nil
		}
		cur = next
	}
	return cur
}
