// Package drift describes how a live API object differs from what Plinth would apply: the
// field paths that differ between the live object and the server-side dry-run of the desired
// one. Comparing with the dry-run result (not the rendered object) leaves out server defaults
// and fields other writers own, and status is never compared.
package drift

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Item is one drifted object.
type Item struct {
	// Kind and Name of the drifted object.
	Kind, Name string
	// Deleted is true when the object is missing.
	Deleted bool
	// Fields are the differing field paths, sorted (empty when Deleted).
	Fields []string
}

// String is "Kind/name deleted" or "Kind/name: field, field".
func (i Item) String() string {
	if i.Deleted {
		return i.Kind + "/" + i.Name + " deleted"
	}
	return i.Kind + "/" + i.Name + ": " + strings.Join(i.Fields, ", ")
}

// Summary joins items for a condition message, at most max of them, then "and N more".
func Summary(items []Item, max int) string {
	var parts []string
	for i, it := range items {
		if i == max {
			parts = append(parts, fmt.Sprintf("and %d more", len(items)-max))
			break
		}
		parts = append(parts, it.String())
	}
	return strings.Join(parts, "; ")
}

// Paths returns the field paths whose values differ between live and merged (the dry-run
// result of applying the desired object to live): labels and annotations under metadata, and
// every top-level field except metadata and status. Paths use dots; list elements are
// compared whole ("spec.stores").
func Paths(live, merged *unstructured.Unstructured) []string {
	var out []string
	for _, k := range []string{"labels", "annotations"} {
		l, _, _ := unstructured.NestedStringMap(live.Object, "metadata", k)
		m, _, _ := unstructured.NestedStringMap(merged.Object, "metadata", k)
		for key := range union(l, m) {
			lv, lok := l[key]
			mv, mok := m[key]
			if lok != mok || lv != mv {
				out = append(out, "metadata."+k+"."+key)
			}
		}
	}
	walk("", without(live.Object), without(merged.Object), &out)
	sort.Strings(out)
	return out
}

func without(o map[string]any) map[string]any {
	c := make(map[string]any, len(o))
	for k, v := range o {
		switch k {
		case "metadata", "status", "apiVersion", "kind":
			continue
		}
		c[k] = v
	}
	return c
}

func walk(prefix string, a, b map[string]any, out *[]string) {
	for k := range unionAny(a, b) {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		av, aok := a[k]
		bv, bok := b[k]
		am, aIsMap := av.(map[string]any)
		bm, bIsMap := bv.(map[string]any)
		switch {
		case aok && bok && aIsMap && bIsMap:
			walk(p, am, bm, out)
		case aok != bok || !equal(av, bv):
			*out = append(*out, p)
		}
	}
}

// equal compares JSON values, treating int64 and float64 of the same number as equal.
func equal(a, b any) bool {
	if reflect.DeepEqual(a, b) {
		return true
	}
	fa, aok := number(a)
	fb, bok := number(b)
	return aok && bok && fa == fb
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

func union(a, b map[string]string) map[string]struct{} {
	u := make(map[string]struct{}, len(a)+len(b))
	for k := range a {
		u[k] = struct{}{}
	}
	for k := range b {
		u[k] = struct{}{}
	}
	return u
}

func unionAny(a, b map[string]any) map[string]struct{} {
	u := make(map[string]struct{}, len(a)+len(b))
	for k := range a {
		u[k] = struct{}{}
	}
	for k := range b {
		u[k] = struct{}{}
	}
	return u
}

// Subset reports whether every field of desired is present in live with an equal value
// (maps recursively, lists element by element with equal length, numbers by value). Fields
// only live has — server defaults, other writers' fields, status — are ignored, so a live
// object that Subset accepts needs no apply; one it rejects goes to the server-side dry-run,
// which decides whether it drifted. Of metadata only name, labels and annotations count.
func Subset(desired, live map[string]any) bool {
	for k, dv := range desired {
		if k == "status" {
			continue
		}
		lv, ok := live[k]
		if k == "metadata" {
			dm, _ := dv.(map[string]any)
			lm, _ := lv.(map[string]any)
			if !ok || lm == nil {
				return false
			}
			for _, mk := range []string{"name", "labels", "annotations"} {
				if v, has := dm[mk]; has && !subsetValue(v, lm[mk]) {
					return false
				}
			}
			continue
		}
		if !ok || !subsetValue(dv, lv) {
			return false
		}
	}
	return true
}

func subsetValue(d, l any) bool {
	switch dv := d.(type) {
	case map[string]any:
		lv, ok := l.(map[string]any)
		if !ok {
			return len(dv) == 0 && l == nil
		}
		for k, v := range dv {
			lx, has := lv[k]
			if !has || !subsetValue(v, lx) {
				return false
			}
		}
		return true
	case []any:
		lv, ok := l.([]any)
		if !ok {
			return len(dv) == 0 && l == nil
		}
		if len(dv) != len(lv) {
			return false
		}
		for i := range dv {
			if !subsetValue(dv[i], lv[i]) {
				return false
			}
		}
		return true
	}
	return equal(d, l)
}
