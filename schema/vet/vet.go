package vet

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"cuelang.org/go/cue"
	"cuelang.org/go/cue/ast"
	cueerrors "cuelang.org/go/cue/errors"
	"sigs.k8s.io/yaml"

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
	buf    []byte // a document's JSON, reused from one document to the next
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
	return Combine(v.judgeAll(set.Documents), set.Problems)
}

// Verdict is what vet finds in one document on its own, before the rules that need the whole
// set. It depends only on the document's text and file name, so a caller may keep it while the
// document is unchanged and hand it to Combine again; it is read-only once made.
type Verdict struct {
	// Document is the document judged.
	Document *Document
	// Object is the decoded policy object with the schema's defaults filled in
	// (*policyv1.StoragePool, *policyv1.Protocol or *policyv1.Placement); nil when the document
	// has problems or belongs to another API group.
	Object any
	// Problems are the document's own problems (schema, unknown kind, misgrouped apiVersion).
	Problems []Problem
	// Other is true for a document of another API group, passed through untouched.
	Other bool
}

// Judge judges one document on its own: a policy document against its CUE definition, any
// other document for a policy apiVersion mistyped (see Vet).
func (v *Vetter) Judge(d *Document) *Verdict {
	return v.judgeAll([]*Document{d})[0]
}

// Combine applies the cross-object rules (crossCheck: maps keyed by name, O(n)) to verdicts,
// Judge's in document order, and returns the policies and every problem — setProblems (such
// as Set.Problems), the verdicts' own and the cross-object ones — sorted by position. The
// objects of the returned Policies share their maps, slices and pointers with the verdicts'
// objects: treat them as read-only.
func Combine(verdicts []*Verdict, setProblems []Problem) (*Policies, []Problem) {
	return new(Combiner).Combine(verdicts, setProblems)
}

// Combiner is Combine with its buffers (the Policies' slices, the maps of the cross-object
// rules) kept from one call to the next, for a caller that combines a large set often (a
// controller after each change). The Policies a call returns are overwritten by the next call.
// A Combiner must not be used from several goroutines at once; the zero value is ready.
type Combiner struct {
	out Policies
	sc  scratch
}

// Combine is Combine, reusing c's buffers.
func (c *Combiner) Combine(verdicts []*Verdict, setProblems []Problem) (*Policies, []Problem) {
	problems := append([]Problem(nil), setProblems...)
	sc := &c.sc
	sc.reset()
	var others []*Document
	var pools, protocols, placements int
	for _, vr := range verdicts {
		problems = append(problems, vr.Problems...)
		switch vr.Object.(type) {
		case *policyv1.StoragePool:
			pools++
		case *policyv1.Protocol:
			protocols++
		case *policyv1.Placement:
			placements++
		}
		switch {
		case vr.Other:
			others = append(others, vr.Document)
		case vr.Object == nil:
			sc.invalid[vr.Document.Kind+"/"+vr.Document.Name] = true
		default:
			sc.all = append(sc.all, vetted{doc: vr.Document, obj: vr.Object})
		}
	}
	for i := range sc.all {
		sc.docs = append(sc.docs, &sc.all[i])
	}
	problems = append(problems, crossCheck(sc)...)
	out := &c.out
	*out = Policies{Pools: reuse(out.Pools, pools), Protocols: reuse(out.Protocols, protocols),
		Placements: reuse(out.Placements, placements), Others: others}
	for _, vd := range sc.docs {
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

// reuse returns s emptied with room for n elements, or nil when n is 0 (as a set without such
// documents decodes).
func reuse[T any](s []T, n int) []T {
	if n == 0 {
		return nil
	}
	if cap(s) < n {
		return make([]T, 0, n)
	}
	clear(s[n:cap(s)]) // the n first are overwritten; the rest would keep old objects alive
	return s[:0]
}

// misgrouped reports a document that is meant as policy but would be passed through as
// another group's: a policy kind (StoragePool, Protocol, Placement) under another apiVersion,
// or an apiVersion whose group mistypes Plinth's (such as policy.plinth.io). Silently skipped,
// it would render nothing and make Plinth prune what it rendered before.
func misgrouped(d *Document) (Problem, bool) {
	g := d.Group()
	_, policyKind := cueschema.Definitions[d.Kind]
	typo := strings.Contains(g, "plinth") && g != PolicyGroup && g != "storage.plinth.dev"
	if !policyKind && !typo {
		return Problem{}, false
	}
	what := fmt.Sprintf("%q", d.APIVersion)
	if policyKind {
		what += " with kind " + d.Kind
	}
	return at(d, []string{"apiVersion"}, fmt.Sprintf("%s is not a policy apiVersion: policy documents are %s/v1alpha1 (StoragePool, Protocol, Placement); fix the group or move the document out of the policy set",
		what, PolicyGroup)), true
}

// defaulter is a policy object that fills its own defaults.
type defaulter interface{ Default() }

// newPolicyObject returns an empty object of a policy kind (a key of cueschema.Definitions).
func newPolicyObject(kind string) defaulter {
	switch kind {
	case "StoragePool":
		return &policyv1.StoragePool{}
	case "Protocol":
		return &policyv1.Protocol{}
	case "Placement":
		return &policyv1.Placement{}
	}
	return nil
}

// vetted is a policy document that passed its schema, decoded.
type vetted struct {
	doc *Document
	obj any
}

// batchSize is how many documents judgeAll builds in one CUE evaluation before unifying each
// with its definition: one evaluation of many literal documents costs fewer bytes than one per
// document, and the batch's value stays small.
const batchSize = 64

// judgeAll judges docs in order (see Judge): the policy documents of a known kind against
// their definitions, in batches of batchSize (judgeBatch).
func (v *Vetter) judgeAll(docs []*Document) []*Verdict {
	out := make([]*Verdict, len(docs))
	var batch []int
	for i, d := range docs {
		if !d.IsPolicy() {
			if p, ok := misgrouped(d); ok {
				out[i] = &Verdict{Document: d, Problems: []Problem{p}}
			} else {
				out[i] = &Verdict{Document: d, Other: true}
			}
			continue
		}
		if _, ok := cueschema.Definitions[d.Kind]; !ok {
			p := at(d, []string{"kind"}, "kind is missing")
			if d.Kind != "" {
				p = at(d, []string{"kind"},
					fmt.Sprintf("unknown kind %q in %s (known: Placement, Protocol, StoragePool)", d.Kind, PolicyGroup))
			}
			out[i] = &Verdict{Document: d, Problems: []Problem{p}}
			continue
		}
		if batch = append(batch, i); len(batch) == batchSize {
			v.judgeBatch(docs, batch, out)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		v.judgeBatch(docs, batch, out)
	}
	return out
}

// judgeBatch judges the policy documents docs[i] of a known kind, i in idx, into out[i]: the
// documents are built together, as the fields of one struct {d0: document, d1: ...} without
// the schema, then each is unified with its compiled #Kind, as `cue vet -c -d '#Kind'` judges
// it.
//
// The verdict depends on this path, and faster ways tried gave a wrong one or kept memory for
// good. Built as one expression, "#Kind & document" (BuildExpr in the schema's scope, alone
// or as the fields of a batch) is evaluated as a value: CUE completes its fields without the
// check that the closed definition admits each one, so misspelled and unknown fields passed
// (every Placement field, the top-level fields of every kind). Built as a file (BuildFile),
// the batch is checked, but every file stays registered in the cue.Context (its runtime's
// index of instances): about 47 KiB per document judged, never freed, in a Vetter the
// controller keeps for its lifetime. Building the documents and then unifying evaluates each
// twice; that is the price of the right verdict.
// TestMisspelledUnknownOrMistypedFieldsAreRefusedLikeCUE (mutants generated from the schema),
// FuzzVetAgreesWithCUE and TestVetterKeepsNoMemoryPerDocument guard this path; a faster one
// lands only with all three green.
func (v *Vetter) judgeBatch(docs []*Document, idx []int, out []*Verdict) {
	st := &ast.StructLit{Elts: make([]ast.Decl, len(idx))}
	for j, i := range idx {
		st.Elts[j] = &ast.Field{Label: ast.NewIdent(batchLabel(j)), Value: docs[i].Expr}
	}
	b := v.schema.Context.BuildExpr(st)
	for j, i := range idx {
		d := docs[i]
		u := v.schema.Defs[d.Kind].Unify(b.LookupPath(cue.MakePath(cue.Str(batchLabel(j)))))
		vd, ps := v.vetDocument(d, u, batchLabel(j))
		out[i] = &Verdict{Document: d, Problems: ps}
		if vd != nil {
			out[i].Object = vd.obj
		}
	}
}

// batchLabel is the field of the j-th document in judgeBatch's struct.
func batchLabel(j int) string { return "d" + strconv.Itoa(j) }

// vetDocument validates u, the document d (the field label of judgeBatch's struct) unified
// with its definition, and decodes it when valid.
func (v *Vetter) vetDocument(d *Document, u cue.Value, label string) (*vetted, []Problem) {
	if err := u.Validate(cue.Concrete(true)); err != nil {
		return nil, v.cueProblems(d, err, label)
	}
	obj := newPolicyObject(d.Kind)
	// The document is valid: decode its syntax tree as JSON (several times faster than
	// decoding the CUE value, and than parsing the YAML text again) and fill the defaults
	// the schema states (TestDecodeMatchesCUE holds the paths equal). A tree appendJSON does
	// not take is decoded from the CUE value.
	var ok bool
	v.buf, ok = appendJSON(v.buf[:0], d.Expr)
	var err error
	if ok {
		err = json.Unmarshal(v.buf, obj)
	} else {
		err = u.Decode(obj)
	}
	if err != nil {
		return nil, []Problem{at(d, nil, "cannot decode: "+err.Error())}
	}
	obj.Default()
	return &vetted{doc: d, obj: obj}, nil
}

// cueProblems turns CUE errors into problems positioned in the document's file. Errors on a
// hidden field (the schema's exactly-one checks) name their parent; an exactly-one error is
// dropped when another error lies below the same parent, because an invalid member makes the
// member look absent to the check.
func (v *Vetter) cueProblems(d *Document, err error, label string) []Problem {
	var items []cueIssue
	for _, e := range cueerrors.Errors(err) {
		path := e.Path()
		if len(path) > 0 && path[0] == label {
			path = path[1:] // an error of the document alone, in judgeBatch's struct
		}
		var clean []string
		for _, sel := range path {
			if strings.HasPrefix(sel, "#") && len(clean) == 0 {
				continue // the definition the document was unified with
			}
			if f, ok := strings.CutPrefix(sel, "_invalid_"); ok {
				// A schema check that reports on another field: "_invalid_a__b" is a.b, and
				// its fields are that field's elements ("_invalid_a"."3" is a.3).
				clean = append(clean, strings.Split(f, "__")...)
				continue
			}
			if strings.HasPrefix(sel, "_") {
				break
			}
			clean = append(clean, strings.Trim(sel, `"`))
		}
		format, args := e.Msg()
		msg := fmt.Sprintf(format, args...)
		items = append(items, cueIssue{path: clean, msg: cleanMessage(msg)})
	}
	// Per path: drop CUE's summaries of a failed disjunction ("2 errors in empty
	// disjunction", "conflicting values <default> and x") when a more precise error exists;
	// when only conflicts remain, the value is not one of the allowed ones.
	byPath := map[string][]int{}
	var order []string
	for i, it := range items {
		k := strings.Join(it.path, ".")
		if _, ok := byPath[k]; !ok {
			order = append(order, k)
		}
		byPath[k] = append(byPath[k], i)
	}
	var ps []Problem
	for _, k := range order {
		var precise, conflicts []int
		for _, i := range byPath[k] {
			m := items[i].msg
			switch {
			case strings.Contains(m, "errors in empty disjunction"):
			case strings.HasPrefix(m, "conflicting values "):
				conflicts = append(conflicts, i)
			default:
				precise = append(precise, i)
			}
		}
		if len(precise) == 0 && len(conflicts) > 0 {
			items[conflicts[0]].msg = oneOfMessage(items, conflicts, valueAt(d.YAML, items[conflicts[0]].path))
			precise = conflicts[:1]
		}
		seen := map[string]bool{}
		for _, i := range precise {
			it := items[i]
			if strings.HasPrefix(it.msg, "exactly one of") && shadowed(items, i) {
				continue
			}
			if seen[it.msg] {
				continue
			}
			seen[it.msg] = true
			ps = append(ps, at(d, it.path, describe(it.path, it.msg)))
		}
	}
	return ps
}

// cueIssue is one CUE error reduced to its field path and message.
type cueIssue struct {
	path []string
	msg  string
}

// shadowed reports whether another error lies below the path of items[i].
func shadowed(items []cueIssue, i int) bool {
	prefix := strings.Join(items[i].path, ".") + "."
	for j, other := range items {
		if j != i && strings.HasPrefix(strings.Join(other.path, ".")+".", prefix) && len(other.path) > len(items[i].path) {
			return true
		}
	}
	return false
}

// oneOfMessage turns CUE's "conflicting values A and B" errors of one field into
// "invalid value X: must be one of A, ...". CUE does not keep one order within a conflict (the
// schema's value comes first or second), so actual — the document's own value as JSON, from
// valueAt — tells the sides apart; without it the second side is taken as the document's.
func oneOfMessage(items []cueIssue, idx []int, actual string) string {
	var allowed []string
	got := actual
	for _, i := range idx {
		rest := strings.TrimPrefix(items[i].msg, "conflicting values ")
		a, b, ok := strings.Cut(rest, " and ")
		if !ok {
			return items[i].msg
		}
		switch {
		case actual != "" && a == actual:
			allowed = append(allowed, b)
		case actual != "" && b == actual:
			allowed = append(allowed, a)
		default:
			allowed = append(allowed, a)
			if actual == "" {
				got = b
			}
		}
	}
	return fmt.Sprintf("invalid value %s: must be one of %s", got, strings.Join(allowed, ", "))
}

// valueAt returns the scalar at path in a YAML document as JSON (a string quoted, as CUE
// prints it), or "" when the document does not parse or has no scalar there.
func valueAt(doc []byte, path []string) string {
	var v any
	if err := yaml.Unmarshal(doc, &v); err != nil {
		return ""
	}
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		if v, ok = m[k]; !ok {
			return ""
		}
	}
	switch v.(type) {
	case map[string]any, []any, nil:
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

// hints explain the regular expressions of the schema, keyed by the field name they guard.
var hints = map[string]string{
	"name":          "must be a lowercase DNS-1123 name: letters, digits and '-', starting and ending with a letter or digit",
	"reserve":       "must be a byte quantity such as 10Gi or 500M, or a percent from 1% to 100% such as 5%",
	"volumeGroup":   "must be an LVM name (lvm(8) VALID NAMES): [A-Za-z0-9+_.-], not starting with '-', without reserved suffixes such as _tmeta or _rimage",
	"spreadAcross":  "must be a Kubernetes label key such as topology.kubernetes.io/zone",
	"key":           "must be a Kubernetes label key such as topology.kubernetes.io/zone",
	"pool":          "must be a zpool name: starts with a letter, then [A-Za-z0-9_.:-]",
	"parentDataset": "must be a dataset path such as k8s/volumes: components of [A-Za-z0-9_.:-] separated by '/'",
	"directory":     "must be an absolute path",
	"devices":       "must be block device paths under /dev",
	"evacuateNodes": "must be Node names: lowercase DNS-1123 subdomains of at most 253 bytes",
}

// describe rewrites a CUE message about a regular expression into a sentence naming the rule.
func describe(path []string, msg string) string {
	if !strings.Contains(msg, "(out of bound =~") && !strings.Contains(msg, "(out of bound !~") {
		return msg
	}
	value := strings.TrimPrefix(msg, "invalid value ")
	if i := strings.Index(value, " (out of bound"); i >= 0 {
		value = value[:i]
	}
	field := ""
	for i := len(path) - 1; i >= 0; i-- {
		if _, err := fmt.Sscanf(path[i], "%d", new(int)); err != nil {
			field = path[i]
			break
		}
	}
	if len(path) >= 2 && path[len(path)-2] == "thinPool" && field == "name" {
		field = "volumeGroup"
	}
	if h, ok := hints[field]; ok {
		return "invalid value " + value + ": " + h
	}
	return msg
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
