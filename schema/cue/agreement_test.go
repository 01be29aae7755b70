package cueschema

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"cuelang.org/go/cue"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// field is what both schemas say about one field of a spec.
type field struct {
	Type     string // object, array, string, integer, boolean
	Required bool
	Default  string // JSON of the default, "" when none
}

// TestCRDAndCUEAgree proves the CRD OpenAPI schemas (generated from the Go types) and the
// CUE schema describe the same fields: the same paths, types, required fields and defaults;
// every CRD enum value and numeric bound is accepted by CUE, and the value just past each
// bound or outside each enum is rejected by CUE.
func TestCRDAndCUEAgree(t *testing.T) {
	s, err := Compile()
	if err != nil {
		t.Fatal(err)
	}
	for kind, def := range Definitions {
		t.Run(kind, func(t *testing.T) {
			crd := loadCRD(t, kind)
			spec := crd.Properties["spec"]
			crdFields := map[string]field{}
			walkCRD("", spec, crdFields)
			cueSpec := s.Defs[kind].LookupPath(cue.MakePath(cue.Str("spec").Required()))
			cueFields := map[string]field{}
			walkCUE(t, "", cueSpec, cueFields)

			var paths []string
			for p := range crdFields {
				paths = append(paths, p)
			}
			for p := range cueFields {
				if _, ok := crdFields[p]; !ok {
					paths = append(paths, p)
				}
			}
			sort.Strings(paths)
			for _, p := range paths {
				c, inCRD := crdFields[p]
				q, inCUE := cueFields[p]
				switch {
				case !inCUE:
					t.Errorf("%s.spec%s: in the CRD (%s) but not in CUE", def, p, c.Type)
				case !inCRD:
					t.Errorf("%s.spec%s: in CUE (%s) but not in the CRD", def, p, q.Type)
				case !reflect.DeepEqual(c, q):
					t.Errorf("%s.spec%s: CRD %+v, CUE %+v", def, p, c, q)
				}
			}
			checkBounds(t, s, "", spec, cueSpec)
		})
	}
}

func loadCRD(t *testing.T, kind string) *apiextv1.JSONSchemaProps {
	t.Helper()
	file := filepath.Join("..", "crd", "bases", "policy.plinth.dev_"+strings.ToLower(kind)+"s.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema
}

func walkCRD(path string, s apiextv1.JSONSchemaProps, out map[string]field) {
	req := map[string]bool{}
	for _, r := range s.Required {
		req[r] = true
	}
	for name, p := range s.Properties {
		f := field{Type: p.Type, Required: req[name]}
		if p.Default != nil {
			f.Default = string(p.Default.Raw)
		}
		out[path+"."+name] = f
		walkChild(path+"."+name, p, out)
	}
}

func walkChild(path string, p apiextv1.JSONSchemaProps, out map[string]field) {
	switch p.Type {
	case "object":
		walkCRD(path, p, out)
		if p.AdditionalProperties != nil && p.AdditionalProperties.Schema != nil {
			ap := *p.AdditionalProperties.Schema
			out[path+".*"] = field{Type: ap.Type}
			walkChild(path+".*", ap, out)
		}
	case "array":
		if p.Items != nil && p.Items.Schema != nil {
			it := *p.Items.Schema
			out[path+"[]"] = field{Type: it.Type}
			walkChild(path+"[]", it, out)
		}
	}
}

func cueType(v cue.Value) string {
	k := v.IncompleteKind()
	if k == cue.TopKind {
		return "any"
	}
	switch {
	case k&cue.StructKind != 0:
		return "object"
	case k&cue.ListKind != 0:
		return "array"
	case k&cue.StringKind != 0:
		return "string"
	case k&cue.IntKind != 0:
		return "integer"
	case k&cue.BoolKind != 0:
		return "boolean"
	}
	return k.String()
}

func walkCUE(t *testing.T, path string, v cue.Value, out map[string]field) {
	it, err := v.Fields(cue.Optional(true))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for it.Next() {
		name := it.Selector().Unquoted()
		fv := it.Value()
		f := field{Type: cueType(fv), Required: it.Selector().ConstraintType() == cue.RequiredConstraint}
		if d, ok := fv.Default(); ok && d.IsConcrete() {
			b, err := d.MarshalJSON()
			if err == nil && !fv.IsConcrete() { // a default marker on a non-concrete value
				f.Default = string(b)
			}
		}
		p := path + "." + name
		out[p] = f
		walkCUEChild(t, p, fv, out)
	}
}

func walkCUEChild(t *testing.T, path string, v cue.Value, out map[string]field) {
	switch cueType(v) {
	case "object":
		walkCUE(t, path, v, out)
		// A pattern constraint ([string]: T, [#LabelKey]: T) answers for a key no field declares.
		probe := v.Unify(v.Context().CompileString(`{"samplekey": _}`))
		if ap := probe.LookupPath(cue.MakePath(cue.Str("samplekey"))); ap.Exists() && ap.Err() == nil {
			out[path+".*"] = field{Type: cueType(ap)}
			walkCUEChild(t, path+".*", ap, out)
		}
	case "array":
		if el := v.LookupPath(cue.MakePath(cue.AnyIndex)); el.Exists() {
			out[path+"[]"] = field{Type: cueType(el)}
			walkCUEChild(t, path+"[]", el, out)
		}
	}
}

// checkBounds unifies CUE with each enum value and bound of the CRD, and with the values just
// outside them.
func checkBounds(t *testing.T, s *Schema, path string, crd apiextv1.JSONSchemaProps, v cue.Value) {
	for name, p := range crd.Properties {
		fv := v.LookupPath(cue.MakePath(cue.Str(name)))
		for _, sel := range []cue.Selector{cue.Str(name).Optional(), cue.Str(name).Required()} {
			if !fv.Exists() {
				fv = v.LookupPath(cue.MakePath(sel))
			}
		}
		if !fv.Exists() {
			continue // reported by the field comparison
		}
		fp := path + "." + name
		accepts := func(x any) bool { return fv.Unify(s.Context.Encode(x)).Validate(cue.Concrete(true)) == nil }
		for _, e := range p.Enum {
			var x any
			if err := yaml.Unmarshal(e.Raw, &x); err != nil {
				t.Fatal(err)
			}
			if !accepts(x) {
				t.Errorf("spec%s: CUE rejects CRD enum value %s", fp, e.Raw)
			}
		}
		if len(p.Enum) > 0 && accepts("not-an-enum-value") {
			t.Errorf("spec%s: CUE accepts a value outside the CRD enum", fp)
		}
		if p.Minimum != nil {
			if !accepts(int64(*p.Minimum)) || accepts(int64(*p.Minimum)-1) {
				t.Errorf("spec%s: CUE disagrees with the CRD minimum %v", fp, *p.Minimum)
			}
		}
		if p.Maximum != nil {
			if !accepts(int64(*p.Maximum)) || accepts(int64(*p.Maximum)+1) {
				t.Errorf("spec%s: CUE disagrees with the CRD maximum %v", fp, *p.Maximum)
			}
		}
		if p.MaxLength != nil && p.Type == "string" {
			if accepts(strings.Repeat("a", int(*p.MaxLength)+1)) {
				t.Errorf("spec%s: CUE accepts a string longer than the CRD maxLength %d", fp, *p.MaxLength)
			}
		}
		if p.Type == "object" {
			checkBounds(t, s, fp, p, fv)
		}
	}
}

// optionRules computes, from the schema's tables (#Mke2fs, #MkfsXFS, #MountOptions,
// #Ext4MountOptions, #XFSMountOptions), the regular expressions the Placement CRD's CEL rules
// must hold for fsType: one for the mkfs arguments joined by spaces (a flag, with its value
// after a space or attached, or a switch), one for each mount option.
func optionRules(t *testing.T, s *Schema, fsType string) (mkfs, mount string) {
	t.Helper()
	def := func(name string) cue.Value { return s.Root.LookupPath(cue.ParsePath(name)) }
	strs := func(v cue.Value) []string {
		var out []string
		if err := v.Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	values := func(v cue.Value) map[string]string {
		out := map[string]string{}
		if err := v.Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	bare := func(re string) string { return strings.TrimSuffix(strings.TrimPrefix(re, "^"), "$") }
	mk, fsMount := def("#Mke2fs"), def("#Ext4MountOptions")
	if fsType == "xfs" {
		mk, fsMount = def("#MkfsXFS"), def("#XFSMountOptions")
	}
	tokens := strs(mk.LookupPath(cue.ParsePath("switches")))
	vals := values(mk.LookupPath(cue.ParsePath("values")))
	for _, f := range sortedKeys(vals) {
		tokens = append(tokens, f+" ?("+bare(vals[f])+")")
	}
	tok := "(" + strings.Join(tokens, "|") + ")"
	mkfs = "^(" + tok + "( " + tok + ")*)?$"

	common := def("#MountOptions")
	opts := append(strs(common.LookupPath(cue.ParsePath("switches"))), strs(fsMount.LookupPath(cue.ParsePath("switches")))...)
	mvals := values(fsMount.LookupPath(cue.ParsePath("values")))
	for k, v := range values(common.LookupPath(cue.ParsePath("values"))) {
		mvals[k] = v
	}
	for _, k := range sortedKeys(mvals) {
		opts = append(opts, k+"=("+bare(mvals[k])+")")
	}
	mount = "^(" + strings.Join(opts, "|") + ")$"
	return mkfs, mount
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestCRDOptionRulesAgree: the Placement CRD's CEL rules on filesystem options hold the
// expressions of the schema's allow-lists (optionRules), so the API server refuses what vet
// refuses (test/framework/controlplane runs a corpus through both on the real API server).
func TestCRDOptionRulesAgree(t *testing.T) {
	s, err := Compile()
	if err != nil {
		t.Fatal(err)
	}
	spec := loadCRD(t, "Placement").Properties["spec"]
	var rules []string
	for _, r := range spec.XValidations {
		rules = append(rules, r.Rule)
	}
	all := strings.Join(rules, "\n")
	for _, fsType := range []string{"ext4", "xfs"} {
		mkfs, mount := optionRules(t, s, fsType)
		for what, re := range map[string]string{"mkfs": mkfs, "mount": mount} {
			if !strings.Contains(all, "'"+strings.ReplaceAll(re, `\`, `\\`)+"'") {
				t.Errorf("the Placement CRD's spec rules lack the %s %s expression of the schema; the rule must hold\n'%s'", fsType, what, strings.ReplaceAll(re, `\`, `\\`))
			}
		}
	}
}
