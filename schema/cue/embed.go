// Package cueschema embeds Plinth's CUE schema of the policy API (policy.cue, a CUE module
// rooted here) and compiles it. The definitions #StoragePool, #Protocol and #Placement judge
// single documents, in CI with plain `cue vet` and in Go through schema/vet.
package cueschema

import (
	_ "embed"
	"fmt"
	"sync"

	"cuelang.org/go/cue"
	"cuelang.org/go/cue/cuecontext"
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
	s := &Schema{Context: ctx, Defs: map[string]cue.Value{}}
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
