// Package vet loads policy documents (YAML files, folders, kustomize overlays) with their
// positions, judges each policy.plinth.dev document against the embedded CUE schema and the
// whole set against the cross-object rules, and reports every problem as
// PATH:LINE:COL: KIND/NAME: FIELD: MESSAGE.
//
// The CUE schema is compiled once per Vetter; each document is unified with its kind's
// definition; references and uniqueness are checked with maps keyed by name (linear in the
// number of documents), not with CUE comprehensions over the set.
package vet
