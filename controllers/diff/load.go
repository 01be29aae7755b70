package diff

import (
	"errors"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

// policySet is one side of the comparison: vetted policy objects (schema defaults filled in)
// by name, and where each was written (nil docs for policy read from the cluster).
type policySet struct {
	pools  map[string]*policyv1.StoragePool
	protos map[string]*policyv1.Protocol
	places map[string]*policyv1.Placement
	// docs maps "Kind/name" to its document.
	docs map[string]*vet.Document
	// list is the vetted set as render takes it.
	list *vet.Policies
}

func newPolicySet(pol *vet.Policies, set *vet.Set) *policySet {
	s := &policySet{pools: map[string]*policyv1.StoragePool{}, protos: map[string]*policyv1.Protocol{},
		places: map[string]*policyv1.Placement{}, docs: map[string]*vet.Document{}, list: pol}
	for i := range pol.Pools {
		s.pools[pol.Pools[i].Name] = &pol.Pools[i]
	}
	for i := range pol.Protocols {
		s.protos[pol.Protocols[i].Name] = &pol.Protocols[i]
	}
	for i := range pol.Placements {
		s.places[pol.Placements[i].Name] = &pol.Placements[i]
	}
	if set != nil {
		for _, d := range set.Documents {
			if d.IsPolicy() {
				if _, dup := s.docs[d.Kind+"/"+d.Name]; !dup {
					s.docs[d.Kind+"/"+d.Name] = d
				}
			}
		}
	}
	return s
}

// loadTree loads and vets the policy tree at paths with the code of `plinth vet` (kustomize
// overlays built as Flux would). Problems are returned, not an error; the error is for I/O.
func loadTree(v *vet.Vetter, paths []string) (*policySet, []vet.Problem, error) {
	set, err := vet.Load(paths...)
	if err != nil {
		return nil, nil, err
	}
	pol, problems := v.Vet(set)
	return newPolicySet(pol, set), problems, nil
}

// renderSet renders s for nodes with the code of `plinth render`; render errors become
// problems positioned at the offending policy field.
func renderSet(s *policySet, nodes []corev1.Node) (*render.Output, []vet.Problem) {
	out, err := render.Render(render.Input{Pools: s.list.Pools, Protocols: s.list.Protocols, Placements: s.list.Placements, Nodes: nodes})
	if err == nil {
		return out, nil
	}
	var ps []vet.Problem
	for _, e := range render.Errors(err) {
		p := vet.Problem{Message: e.Error()}
		var re *render.Error
		if errors.As(e, &re) {
			p = vet.Problem{Kind: re.Kind, Name: re.Name, Field: re.Field, Message: re.Message}
			if d := s.docs[re.Kind+"/"+re.Name]; d != nil {
				p.File, p.Line, p.Column = d.Position(strings.Split(re.Field, ".")...)
			}
		}
		ps = append(ps, p)
	}
	vet.SortProblems(ps)
	return nil, ps
}

// policyChanges lists the policy objects of after that differ from before by spec (labels and
// annotations of policy objects belong to the sync tool, not to the policy).
func policyChanges(before, after *policySet, deletedAt func(kind, name string) (string, int)) []PolicyChange {
	var out []PolicyChange
	add := func(kind, name string, b, a any) {
		pc := PolicyChange{Kind: kind, Name: name}
		if d := after.docs[kind+"/"+name]; d != nil {
			pc.File, pc.Line, _ = d.Position()
		}
		switch {
		case b == nil:
			pc.Action = ActionCreate
		case a == nil:
			pc.Action = "delete"
			pc.File, pc.Line = deletedAt(kind, name)
		default:
			pc.Fields = specPaths(b, a)
			if len(pc.Fields) == 0 {
				return
			}
			pc.Action = ActionChange
		}
		out = append(out, pc)
	}
	for _, n := range names(before.pools, after.pools) {
		add("StoragePool", n, specOf(before.pools[n]), specOf(after.pools[n]))
	}
	for _, n := range names(before.protos, after.protos) {
		add("Protocol", n, specOf(before.protos[n]), specOf(after.protos[n]))
	}
	for _, n := range names(before.places, after.places) {
		add("Placement", n, specOf(before.places[n]), specOf(after.places[n]))
	}
	return out
}

// specOf returns the spec of a policy object, or nil (an untyped nil) for a nil pointer.
func specOf[T any](p *T) any {
	if p == nil {
		return nil
	}
	switch o := any(p).(type) {
	case *policyv1.StoragePool:
		return &o.Spec
	case *policyv1.Protocol:
		return &o.Spec
	case *policyv1.Placement:
		return &o.Spec
	}
	return nil
}

// specPaths lists the dotted paths under "spec." whose values differ (drift.Paths on the two
// specs; lists compare whole).
func specPaths(before, after any) []string {
	b, err1 := runtime.DefaultUnstructuredConverter.ToUnstructured(before)
	a, err2 := runtime.DefaultUnstructuredConverter.ToUnstructured(after)
	if err1 != nil || err2 != nil {
		return []string{"spec"}
	}
	return drift.Paths(&unstructured.Unstructured{Object: map[string]any{"spec": b}},
		&unstructured.Unstructured{Object: map[string]any{"spec": a}})
}

func names[T any](a, b map[string]*T) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range []map[string]*T{a, b} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

// position returns where field (dotted) of the policy object kind/name is written in s, or
// fallback with line 0 when s has no document for it.
func (s *policySet) position(kind, name, field, fallback string) (string, int, int) {
	if d := s.docs[kind+"/"+name]; d != nil {
		var path []string
		if field != "" {
			path = strings.Split(field, ".")
		}
		return d.Position(path...)
	}
	return fallback, 0, 0
}

// changed reports whether any of fields (dotted, under spec) is among paths or below one.
func changed(paths []string, field string) bool {
	for _, p := range paths {
		if p == field || strings.HasPrefix(p, field+".") || strings.HasPrefix(field, p+".") {
			return true
		}
	}
	return false
}

func sortObjects(objs []ObjectChange) {
	sort.SliceStable(objs, func(i, j int) bool {
		if a, b := inventory.KindOrder(objs[i].Kind), inventory.KindOrder(objs[j].Kind); a != b {
			return a < b
		}
		return objs[i].Name < objs[j].Name
	})
}

func sortViolations(vs []Violation) {
	sort.SliceStable(vs, func(i, j int) bool {
		a, b := vs[i], vs[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Object != b.Object {
			return a.Object < b.Object
		}
		return a.Message < b.Message
	})
}
