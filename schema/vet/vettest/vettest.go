// Package vettest generates, from the CUE schema, the malformed policy documents every layer of
// the policy gate must refuse: for each field the schema declares, a valid document with that
// field misspelled, with an unknown sibling added beside it, and with a value of the wrong
// type. Tests of schema/vet (plinth vet, cue vet) and of controllers/policy (the CRDs on the
// real API server, the controller's own vet) judge the same mutants, so a change that lets one
// layer say green where another refuses fails a test instead of a cluster.
package vettest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"cuelang.org/go/cue"
	"sigs.k8s.io/yaml"

	cueschema "github.com/plinth-storage/plinth/schema/cue"
)

// Path segments that are not field names: a list element (index 0 in a document) and an
// entry of a map whose keys a pattern constrains, such as labels (the first key in a document).
const (
	Elem  = "[]"
	Entry = "*"
)

// Field is a field the CUE schema declares for a policy kind.
type Field struct {
	// Kind is the policy kind (StoragePool, Protocol, Placement).
	Kind string
	// Path leads from the document's root to the field: names, Elem and Entry.
	Path []string
	// Type is the kinds of value the schema admits (cue.Value.IncompleteKind).
	Type cue.Kind
	// Required is a field the schema marks with "!".
	Required bool
	// Open is a field whose enclosing struct admits fields the schema does not name ("..."):
	// a misspelled or added key there is no error of the schema. (None is left since
	// metadata was closed; status admits anything but declares no field.)
	Open bool
	// Siblings are the names the enclosing struct declares.
	Siblings []string
}

// String is the dotted path, such as "spec.storageClass.reclaimPolicy".
func (f Field) String() string { return strings.Join(f.Path, ".") }

// named reports whether the field's last segment is a field name (not Elem or Entry).
func (f Field) named() bool {
	last := f.Path[len(f.Path)-1]
	return last != Elem && last != Entry
}

// Fields walks the definition of each policy kind in s (cueschema.Definitions) through struct
// fields (optional and required), list elements and pattern-constrained map entries, and
// returns every field by kind, in the schema's order.
func Fields(s *cueschema.Schema) (map[string][]Field, error) {
	out := map[string][]Field{}
	for kind := range cueschema.Definitions {
		var fs []Field
		if err := walkStruct(kind, s.Defs[kind], nil, &fs); err != nil {
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
		out[kind] = fs
	}
	return out, nil
}

func walkStruct(kind string, v cue.Value, path []string, out *[]Field) error {
	it, err := v.Fields(cue.Optional(true))
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(path, "."), err)
	}
	type child struct {
		sel cue.Selector
		val cue.Value
	}
	var children []child
	var names []string
	for it.Next() {
		children = append(children, child{it.Selector(), it.Value()})
		names = append(names, it.Selector().Unquoted())
	}
	open := false
	if p, ok := probe(v); ok && p.IncompleteKind() == cue.TopKind {
		open = true
	}
	for _, c := range children {
		p := append(append([]string(nil), path...), c.sel.Unquoted())
		*out = append(*out, Field{Kind: kind, Path: p, Type: c.val.IncompleteKind(),
			Required: c.sel.ConstraintType() == cue.RequiredConstraint, Open: open, Siblings: names})
		if err := walkValue(kind, c.val, p, out); err != nil {
			return err
		}
	}
	return nil
}

func walkValue(kind string, v cue.Value, path []string, out *[]Field) error {
	k := v.IncompleteKind()
	switch {
	case k == cue.StructKind:
		if err := walkStruct(kind, v, path, out); err != nil {
			return err
		}
		// A pattern constraint ([#LabelKey]: #LabelValue) answers for a key no field declares;
		// "..." answers with top, which declares nothing.
		if p, ok := probe(v); ok && p.IncompleteKind() != cue.TopKind {
			ep := append(append([]string(nil), path...), Entry)
			*out = append(*out, Field{Kind: kind, Path: ep, Type: p.IncompleteKind()})
			return walkValue(kind, p, ep, out)
		}
	case k == cue.ListKind:
		if el := v.LookupPath(cue.MakePath(cue.AnyIndex)); el.Exists() {
			ep := append(append([]string(nil), path...), Elem)
			*out = append(*out, Field{Kind: kind, Path: ep, Type: el.IncompleteKind()})
			return walkValue(kind, el, ep, out)
		}
	}
	return nil
}

// probe returns what struct v admits for a key it does not declare, if anything.
func probe(v cue.Value) (cue.Value, bool) {
	u := v.Unify(v.Context().CompileString(`{"plinthprobekey": _}`))
	p := u.LookupPath(cue.MakePath(cue.Str("plinthprobekey")))
	if !p.Exists() || p.Err() != nil {
		return cue.Value{}, false
	}
	return p, true
}

//go:embed bases.yaml
var basesYAML []byte

// Base is a valid policy document a mutant starts from.
type Base struct {
	Kind, Name string
	// Tree is the document as sigs.k8s.io/yaml decodes it (maps, slices, strings, float64,
	// bools); read-only.
	Tree map[string]any
}

// Bases returns the valid documents of bases.yaml, one set that passes plinth vet, cue vet and
// the CRDs, and sets every field Fields returns (Mutants fails on a field none sets).
func Bases() ([]Base, error) {
	var out []Base
	for i, chunk := range bytes.Split(basesYAML, []byte("\n---\n")) {
		var tree map[string]any
		if err := yaml.Unmarshal(chunk, &tree); err != nil {
			return nil, fmt.Errorf("bases.yaml document %d: %w", i+1, err)
		}
		md, _ := tree["metadata"].(map[string]any)
		kind, _ := tree["kind"].(string)
		name, _ := md["name"].(string)
		out = append(out, Base{Kind: kind, Name: name, Tree: tree})
	}
	return out, nil
}

// BasesYAML is the text of the base documents, one YAML stream.
func BasesYAML() []byte { return append([]byte(nil), basesYAML...) }

// Mutation is how a mutant differs from its base document.
type Mutation string

const (
	// Misspelled renames the field's key (a letter dropped).
	Misspelled Mutation = "misspelled"
	// UnknownSibling adds a key the schema does not declare beside the field.
	UnknownSibling Mutation = "unknown sibling"
	// WrongType replaces the field's value by one of a kind the schema does not admit.
	WrongType Mutation = "wrong type"
)

// Mutant is a base document with one mutation.
type Mutant struct {
	// Field is the schema's field the mutation is made at.
	Field Field
	How   Mutation
	// Name is the base document's metadata.name (the object an apply targets).
	Name string
	// Key is the key written by Misspelled or UnknownSibling; Value the value written by
	// WrongType.
	Key   string
	Value any
	// YAML is the document, block style with one field per line; JSON the same document.
	YAML, JSON []byte
	// Line and LastLine are the first and last line (1-based) in YAML of the mutated field,
	// its key and value.
	Line, LastLine int
	// SchemaRefuses is the verdict of CUE's closed definition: every mutant but a misspelled
	// optional field or an added key in a struct the schema leaves open (see Field.Open).
	SchemaRefuses bool
}

// String names the mutant, such as "Placement spec.strategy misspelled (stratgy)".
func (m Mutant) String() string {
	s := fmt.Sprintf("%s %s %s", m.Field.Kind, m.Field, m.How)
	switch m.How {
	case WrongType:
		b, _ := json.Marshal(m.Value)
		s += " (" + string(b) + ")"
	default:
		s += " (" + m.Key + ")"
	}
	return s
}

// Mutants returns every mutant of every field Fields finds in s: for a named field Misspelled,
// UnknownSibling and WrongType; for a list element or a map entry (which have no spelling)
// WrongType only. Each starts from the first base document that sets the field; a field no
// base document sets is an error.
func Mutants(s *cueschema.Schema) ([]Mutant, error) {
	fields, err := Fields(s)
	if err != nil {
		return nil, err
	}
	bases, err := Bases()
	if err != nil {
		return nil, err
	}
	var out []Mutant
	for _, kind := range Kinds() {
		for _, f := range fields[kind] {
			var base *Base
			var concrete []string
			for i := range bases {
				if bases[i].Kind != kind {
					continue
				}
				if c, ok := concretePath(bases[i].Tree, f.Path); ok {
					base, concrete = &bases[i], c
					break
				}
			}
			if base == nil {
				return nil, fmt.Errorf("%s %s: no base document in bases.yaml sets it; add it to one", kind, f)
			}
			hows := []Mutation{WrongType}
			if f.named() {
				hows = []Mutation{Misspelled, UnknownSibling, WrongType}
			}
			for _, how := range hows {
				m, ok := mutate(*base, f, concrete, how)
				if ok {
					out = append(out, m)
				}
			}
		}
	}
	return out, nil
}

// Kinds are the policy kinds in a fixed order.
func Kinds() []string {
	ks := make([]string, 0, len(cueschema.Definitions))
	for k := range cueschema.Definitions {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// concretePath turns a field path into the keys of tree that reach it (Elem as "0", Entry as
// the first key in sorted order), and reports whether tree sets it.
func concretePath(tree any, path []string) ([]string, bool) {
	var out []string
	cur := tree
	for _, seg := range path {
		switch seg {
		case Elem:
			l, ok := cur.([]any)
			if !ok || len(l) == 0 {
				return nil, false
			}
			out, cur = append(out, "0"), l[0]
		case Entry:
			m, ok := cur.(map[string]any)
			if !ok || len(m) == 0 {
				return nil, false
			}
			k := sortedKeys(m)[0]
			out, cur = append(out, k), m[k]
		default:
			m, ok := cur.(map[string]any)
			if !ok {
				return nil, false
			}
			v, ok := m[seg]
			if !ok {
				return nil, false
			}
			out, cur = append(out, seg), v
		}
	}
	return out, true
}

// mutate applies how to a deep copy of base at the concrete path of f.
func mutate(base Base, f Field, concrete []string, how Mutation) (Mutant, bool) {
	tree := deepCopy(base.Tree)
	parent := tree
	for _, k := range concrete[:len(concrete)-1] {
		switch p := parent.(type) {
		case map[string]any:
			parent = p[k]
		case []any:
			i, _ := strconv.Atoi(k)
			parent = p[i]
		}
	}
	last := concrete[len(concrete)-1]
	m := Mutant{Field: f, How: how, Name: base.Name, SchemaRefuses: true}
	target := append([]string(nil), concrete...)
	switch how {
	case Misspelled:
		pm := parent.(map[string]any)
		m.Key = misspell(last, f.Siblings)
		pm[m.Key] = pm[last]
		delete(pm, last)
		target[len(target)-1] = m.Key
		m.SchemaRefuses = !f.Open || f.Required
	case UnknownSibling:
		pm := parent.(map[string]any)
		m.Key = last + "Extra"
		pm[m.Key] = "plinth-unknown-field"
		target[len(target)-1] = m.Key
		m.SchemaRefuses = !f.Open
	case WrongType:
		v, ok := wrongValue(f.Type)
		if !ok {
			return Mutant{}, false
		}
		m.Value = v
		switch p := parent.(type) {
		case map[string]any:
			p[last] = v
		case []any:
			i, _ := strconv.Atoi(last)
			p[i] = v
		}
	}
	var e emitter
	e.want = strings.Join(target, "\x00")
	e.node(tree, 0, nil)
	m.YAML, m.Line, m.LastLine = e.buf.Bytes(), e.first, e.last
	var err error
	if m.JSON, err = json.Marshal(tree); err != nil {
		return Mutant{}, false
	}
	return m, true
}

// misspell drops the letter in the middle of name; if that names a sibling, an "x" is added.
func misspell(name string, siblings []string) string {
	r := []rune(name)
	out := name + "x"
	if len(r) >= 3 {
		out = string(r[:len(r)/2]) + string(r[len(r)/2+1:])
	}
	for _, s := range siblings {
		if s == out {
			return out + "x"
		}
	}
	return out
}

// wrongValue is a value of a kind that k does not admit.
func wrongValue(k cue.Kind) (any, bool) {
	switch {
	case k&cue.StringKind == 0:
		return "plinth-wrong-type", true
	case k&cue.NumberKind == 0:
		return 12345, true
	case k&cue.BoolKind == 0:
		return true, true
	}
	return nil, false
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		l := make([]any, len(v))
		for i, e := range v {
			l[i] = deepCopy(e)
		}
		return l
	}
	return v
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// emitter writes a tree as block YAML, one field or list element per line, keys sorted,
// strings double-quoted (JSON's quoting is YAML's), and records the lines of the node at
// want (its path joined by NUL).
type emitter struct {
	buf         bytes.Buffer
	line        int
	want        string
	first, last int
}

func (e *emitter) writeLine(indent int, s string) {
	e.buf.WriteString(strings.Repeat(" ", indent))
	e.buf.WriteString(s)
	e.buf.WriteByte('\n')
	e.line++
}

// node writes the fields or elements of a map or list at indent.
func (e *emitter) node(v any, indent int, path []string) {
	switch v := v.(type) {
	case map[string]any:
		for _, k := range sortedKeys(v) {
			e.entry(quote(k)+":", v[k], indent, append(path, k))
		}
	case []any:
		for i, el := range v {
			e.entry("-", el, indent, append(path, strconv.Itoa(i)))
		}
	}
}

// entry writes "head value" (a field "key:" or a list element "-") and its nested lines.
func (e *emitter) entry(head string, v any, indent int, path []string) {
	start := e.line + 1
	switch c := v.(type) {
	case map[string]any:
		if len(c) == 0 {
			e.writeLine(indent, head+" {}")
		} else {
			e.writeLine(indent, head)
			e.node(c, indent+2, path)
		}
	case []any:
		if len(c) == 0 {
			e.writeLine(indent, head+" []")
		} else {
			e.writeLine(indent, head)
			e.node(c, indent+2, path)
		}
	default:
		e.writeLine(indent, head+" "+scalar(c))
	}
	if strings.Join(path, "\x00") == e.want {
		e.first, e.last = start, e.line
	}
}

func scalar(v any) string {
	switch v := v.(type) {
	case string:
		return quote(v)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case nil:
		return "null"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
