package vet

import (
	"fmt"
	"strings"

	"cuelang.org/go/cue"
	cueerrors "cuelang.org/go/cue/errors"

	cueschema "github.com/plinth-storage/plinth/schema/cue"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// Policies is a vetted policy set decoded into the API types, with the schema's defaults
// filled in, in document order.
type Policies struct {
	Pools      []policyv1.StoragePool
	Protocols  []policyv1.Protocol
	Placements []policyv1.Placement
	// Others are the documents of other API groups, passed through untouched.
	Others []*Document
}

// Vetter judges policy sets. It compiles the CUE schema once; a Vetter must not be used from
// several goroutines at once.
type Vetter struct {
	schema *cueschema.Schema
}

// NewVetter compiles the embedded schema.
func NewVetter() (*Vetter, error) {
	s, err := cueschema.Compile()
	if err != nil {
		return nil, err
	}
	return &Vetter{schema: s}, nil
}

// Vet judges every policy document of the set against its CUE definition, then the whole set
// against the cross-object rules, and decodes the valid documents. Problems are sorted by
// position. A set with problems still returns the documents that were valid on their own.
func (v *Vetter) Vet(set *Set) (*Policies, []Problem) {
	problems := append([]Problem(nil), set.Problems...)
	out := &Policies{}
	var docs []*vetted
	for _, d := range set.Documents {
		if !d.IsPolicy() {
			out.Others = append(out.Others, d)
			continue
		}
		vd, ps := v.vetDocument(d)
		problems = append(problems, ps...)
		if vd != nil {
			docs = append(docs, vd)
		}
	}
	problems = append(problems, crossCheck(docs)...)
	for _, vd := range docs {
		switch o := vd.obj.(type) {
		case *policyv1.StoragePool:
			out.Pools = append(out.Pools, *o)
		case *policyv1.Protocol:
			out.Protocols = append(out.Protocols, *o)
		case *policyv1.Placement:
			out.Placements = append(out.Placements, *o)
		}
	}
	SortProblems(problems)
	return out, problems
}

// vetted is a policy document that passed its schema, decoded.
type vetted struct {
	doc *Document
	obj any
}

func (v *Vetter) vetDocument(d *Document) (*vetted, []Problem) {
	if _, ok := cueschema.Definitions[d.Kind]; !ok {
		if d.Kind == "" {
			return nil, []Problem{at(d, []string{"kind"}, "kind is missing")}
		}
		return nil, []Problem{at(d, []string{"kind"},
			fmt.Sprintf("unknown kind %q in %s (known: Placement, Protocol, StoragePool)", d.Kind, PolicyGroup))}
	}
	val := v.schema.Context.BuildExpr(d.Expr)
	if err := val.Err(); err != nil {
		return nil, v.cueProblems(d, err)
	}
	u := v.schema.Defs[d.Kind].Unify(val)
	if err := u.Validate(cue.Concrete(true)); err != nil {
		return nil, v.cueProblems(d, err)
	}
	var obj any
	switch d.Kind {
	case "StoragePool":
		obj = &policyv1.StoragePool{}
	case "Protocol":
		obj = &policyv1.Protocol{}
	case "Placement":
		obj = &policyv1.Placement{}
	}
	if err := u.Decode(obj); err != nil {
		return nil, []Problem{at(d, nil, "cannot decode: "+err.Error())}
	}
	return &vetted{doc: d, obj: obj}, nil
}

// cueProblems turns CUE errors into problems positioned in the document's file. Errors on a
// hidden field (the schema's exactly-one checks) name their parent; an exactly-one error is
// dropped when another error lies below the same parent, because an invalid member makes the
// member look absent to the check.
func (v *Vetter) cueProblems(d *Document, err error) []Problem {
	type item struct {
		path []string
		msg  string
	}
	var items []item
	for _, e := range cueerrors.Errors(err) {
		path := e.Path()
		var clean []string
		for _, sel := range path {
			if strings.HasPrefix(sel, "#") && len(clean) == 0 {
				continue // the definition the document was unified with
			}
			if f, ok := strings.CutPrefix(sel, "_invalid_"); ok {
				clean = append(clean, f) // a schema check that reports on a sibling field
				break
			}
			if strings.HasPrefix(sel, "_") {
				break
			}
			clean = append(clean, strings.Trim(sel, `"`))
		}
		format, args := e.Msg()
		msg := fmt.Sprintf(format, args...)
		items = append(items, item{path: clean, msg: cleanMessage(msg)})
	}
	var ps []Problem
	seen := map[string]bool{}
	for i, it := range items {
		if strings.HasPrefix(it.msg, "exactly one of") {
			shadowed := false
			for j, other := range items {
				if j != i && len(other.path) > len(it.path) && strings.Join(other.path[:len(it.path)], ".") == strings.Join(it.path, ".") {
					shadowed = true
				}
			}
			if shadowed {
				continue
			}
		}
		key := strings.Join(it.path, ".") + "\x00" + it.msg
		if seen[key] {
			continue
		}
		seen[key] = true
		ps = append(ps, at(d, it.path, it.msg))
	}
	return ps
}

// cleanMessage rewrites CUE's messages where they would confuse someone who writes YAML.
func cleanMessage(msg string) string {
	switch {
	case msg == "field is required but not present":
		return "required field is missing"
	case strings.HasPrefix(msg, "incomplete value "):
		return "required field is missing or not concrete: " + strings.TrimPrefix(msg, "incomplete value ")
	}
	return msg
}
