// Package cueschema embeds Plinth's CUE schema of the policy API (policy.cue, a CUE module
// rooted here) and compiles it. The definitions #StoragePool, #Protocol and #Placement judge
// single documents, in CI with plain `cue vet` and in Go through schema/vet.
package cueschema

import (
	_ "embed"
	"fmt"
	"strings"
	"sync"

	"cuelang.org/go/cue"
	"cuelang.org/go/cue/cuecontext"
	"cuelang.org/go/cue/errors"
	"cuelang.org/go/cue/parser"
)

// Source is the text of policy.cue, the schema of policy.plinth.dev/v1alpha1 documents.
//
//go:embed policy.cue
var Source string

// Definitions maps each policy kind to its CUE definition name.
var Definitions = map[string]string{
	"StoragePool": "#StoragePool",
	"Protocol":    "#Protocol",
	"Placement":   "#Placement",
}

// Schema is the compiled schema. It is safe for concurrent use only through separate
// *cue.Context values; Compile returns a fresh one each time.
type Schema struct {
	Context *cue.Context
	// Root is the whole compiled schema file: the scope in which an expression naming a
	// definition (such as "#StoragePool & {...}") is built.
	Root cue.Value
	// Defs holds the compiled definition of each kind in Definitions.
	Defs map[string]cue.Value
}

// Compile compiles the embedded schema into a new CUE context. It fails only if the embedded
// schema itself is broken (a build defect, caught by this package's tests).
func Compile() (*Schema, error) {
	// Only syntax and reference errors are checked here: the definitions alone are
	// incomplete on purpose (their exactly-one rules fail until a document fills them in).
	f, err := parser.ParseFile("schema/cue/policy.cue", Source, parser.ParseComments)
	if err != nil {
		return nil, fmt.Errorf("parse embedded CUE schema: %w", err)
	}
	ctx := cuecontext.New()
	v := ctx.BuildFile(f)
	s := &Schema{Context: ctx, Root: v, Defs: map[string]cue.Value{}}
	for kind, def := range Definitions {
		d := v.LookupPath(cue.ParsePath(def))
		if !d.Exists() {
			return nil, fmt.Errorf("embedded CUE schema lacks %s: %w", def, v.Err())
		}
		s.Defs[kind] = d
	}
	return s, nil
}

var (
	once      sync.Once
	shared    *Schema
	sharedErr error
)

// Shared returns a schema compiled once per process. Callers must not use it from several
// goroutines at once (a cue.Context is not safe for concurrent evaluation).
func Shared() (*Schema, error) {
	once.Do(func() { shared, sharedErr = Compile() })
	return shared, sharedErr
}

// placementField guards the schema compiled for CheckPlacementField: a cue.Context serves one
// evaluation at a time, and the CSI controller checks overrides of concurrent CreateVolumes.
var placementField struct {
	sync.Mutex
	schema *Schema
}

// CheckPlacementField judges value (a Go value that encodes to JSON: a string, a []string, a
// map such as {"fsType": "xfs", "mountOptions": [...]}) as the Placement spec field at path
// (YAML names from spec down, such as ["filesystem"]) by the same schema as a Placement
// document, the checks that span the field's members included (the option allow-lists of
// #Filesystem judge fsType, mkfsOptions and mountOptions together). It returns nil when the
// schema accepts it, or an error naming the rule it breaks; an unknown path is an error too.
func CheckPlacementField(path []string, value any) error {
	placementField.Lock()
	defer placementField.Unlock()
	if placementField.schema == nil {
		s, err := Compile()
		if err != nil {
			return err
		}
		placementField.schema = s
	}
	s := placementField.schema
	sels := []cue.Selector{cue.Str("spec").Required()}
	for _, p := range path {
		sels = append(sels, cue.Str(p).Optional())
	}
	field := s.Defs["Placement"].LookupPath(cue.MakePath(sels...))
	if !field.Exists() {
		return fmt.Errorf("the Placement schema has no field spec.%s", strings.Join(path, "."))
	}
	v := field.Unify(s.Context.Encode(value))
	if err := v.Validate(cue.Concrete(true)); err != nil {
		var msgs []string
		for _, e := range errors.Errors(err) {
			format, args := e.Msg()
			msgs = append(msgs, strings.TrimSuffix(fmt.Sprintf(format, args...), ":"))
		}
		return fmt.Errorf("spec.%s: %s", strings.Join(path, "."), strings.Join(msgs, "; "))
	}
	return nil
}
