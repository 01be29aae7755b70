package vet

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// Unit is one policy set vetted on its own: a kustomization built as Flux builds it (an
// overlay such as clusters/production of a policy repository), or the plain files and folders
// given together.
type Unit struct {
	// Path is the kustomization folder as given or found, "" for the plain files and folders.
	Path string
	// Set holds the unit's documents.
	Set *Set
}

// LoadUnits reads files and folders as Load does, but a folder that holds several
// kustomizations (a policy repository: base/, dev/, clusters/<name>/) is split the way Flux
// syncs it: every kustomization that no other kustomization in the folder includes (an
// overlay) is built and returned as its own Unit, and the bases the overlays include are
// vetted only through them, never side by side (the same pool in two overlays is no
// duplicate). A kustomization folder given by name is always its own Unit. The plain files
// and the plain folders' *.yaml files form one more Unit (Path ""), read together as Load
// reads them. Errors are Load's: I/O and kustomize failures.
func LoadUnits(paths ...string) ([]Unit, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("no path given")
	}
	var units []Unit
	loose := &Set{}
	hasLoose := false
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			if err := loose.loadFile(p); err != nil {
				return nil, err
			}
			hasLoose = true
			continue
		}
		if kustomizationFile(p) != "" {
			u, err := loadUnit(p)
			if err != nil {
				return nil, err
			}
			units = append(units, u)
			continue
		}
		kdirs, files, err := walkPolicyDir(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if err := loose.loadFile(f); err != nil {
				return nil, err
			}
			hasLoose = true
		}
		for _, d := range overlays(kdirs) {
			u, err := loadUnit(d)
			if err != nil {
				return nil, err
			}
			units = append(units, u)
		}
	}
	if hasLoose {
		units = append([]Unit{{Set: loose}}, units...)
	}
	return units, nil
}

// OneSet returns an error when one of paths is a folder, itself no kustomization, that holds
// several overlays (a policy repository): Load would read them as one set, the same pools and
// placements once per overlay. The error names the overlays, to render or diff one of them.
// I/O errors are left to Load.
func OneSet(paths ...string) error {
	for _, p := range paths {
		if st, err := os.Stat(p); err != nil || !st.IsDir() || kustomizationFile(p) != "" {
			continue
		}
		kdirs, _, err := walkPolicyDir(p)
		if err != nil {
			continue
		}
		if ov := overlays(kdirs); len(ov) > 1 {
			return fmt.Errorf("%s holds %d overlays (%s), each a policy set of its own: name one of them (plinth vet %s vets each)", p, len(ov), strings.Join(ov, ", "), p)
		}
	}
	return nil
}

func loadUnit(dir string) (Unit, error) {
	s := &Set{}
	if err := s.loadKustomization(dir); err != nil {
		return Unit{}, err
	}
	return Unit{Path: dir, Set: s}, nil
}

// walkPolicyDir lists, below dir, the folders that hold a kustomization (not looking inside
// them: kustomize reads those) and the *.yaml and *.yml files outside them, each sorted;
// hidden folders are skipped.
func walkPolicyDir(dir string) (kdirs, files []string, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			if kustomizationFile(path) != "" {
				kdirs = append(kdirs, path)
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(path); ext == ".yaml" || ext == ".yml" {
			files = append(files, path)
		}
		return nil
	})
	sort.Strings(kdirs)
	sort.Strings(files)
	return kdirs, files, err
}

// kustomizationRefs returns the absolute paths of the local folders a kustomization in dir
// names under resources, bases and components (files and remote URLs left out); nil when the
// kustomization cannot be read (kustomize reports that when it builds it).
func kustomizationRefs(dir string) []string {
	name := kustomizationFile(dir)
	if name == "" {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil
	}
	var k struct {
		Resources  []string `json:"resources"`
		Bases      []string `json:"bases"`
		Components []string `json:"components"`
	}
	if yaml.Unmarshal(data, &k) != nil {
		return nil
	}
	var out []string
	for _, r := range append(append(k.Resources, k.Bases...), k.Components...) {
		if strings.Contains(r, "://") || strings.HasPrefix(r, "git@") {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(r))
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			if abs, err := filepath.Abs(p); err == nil {
				out = append(out, abs)
			}
		}
	}
	return out
}

// overlays returns the kustomization folders among kdirs that no other one among them
// includes; all of them when every one is included by another (a cycle kustomize refuses).
func overlays(kdirs []string) []string {
	included := map[string]bool{}
	for _, d := range kdirs {
		for _, r := range kustomizationRefs(d) {
			included[r] = true
		}
	}
	var out []string
	for _, d := range kdirs {
		if abs, err := filepath.Abs(d); err != nil || !included[abs] {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return kdirs
	}
	return out
}

// maxSearchUp bounds how many folders above a base IncludedBy looks for overlays.
const maxSearchUp = 3

// IncludedBy returns the overlays that include the kustomization folder dir, directly or
// through other bases, found in the folders above it: up to maxSearchUp levels, and no higher
// than the first one that holds .git (the repository's root). Paths are as displayPath gives
// them, sorted; nil when none is found.
func IncludedBy(dir string) []string {
	target, err := filepath.Abs(dir)
	if err != nil {
		return nil
	}
	top := target
	for i := 0; i < maxSearchUp; i++ {
		if _, err := os.Stat(filepath.Join(top, ".git")); err == nil {
			break
		}
		up := filepath.Dir(top)
		if up == top {
			break
		}
		top = up
	}
	kdirs, err := allKustomizations(top)
	if err != nil {
		return nil
	}
	refs := map[string][]string{}
	for _, d := range kdirs {
		refs[d] = kustomizationRefs(d)
	}
	var includes func(d string, seen map[string]bool) bool
	includes = func(d string, seen map[string]bool) bool {
		if seen[d] {
			return false
		}
		seen[d] = true
		for _, r := range refs[d] {
			if r == target || includes(r, seen) {
				return true
			}
		}
		return false
	}
	var out []string
	for _, d := range overlays(kdirs) {
		if d != target && includes(d, map[string]bool{}) {
			out = append(out, displayPath(d))
		}
	}
	sort.Strings(out)
	return out
}

// allKustomizations lists the absolute paths of every folder below top (top included) that
// holds a kustomization, nested ones too; hidden folders are skipped.
func allKustomizations(top string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != top && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if kustomizationFile(path) != "" {
			out = append(out, path)
		}
		return nil
	})
	return out, err
}

// Reliance returns, for a kustomization Unit whose Placements name a StoragePool or Protocol
// it does not define, one problem per such reference (at the reference) saying that the folder
// relies on another base and which overlays vet it whole (IncludedBy); nil for a Unit that
// defines everything it names, or that is no kustomization. vet reports the missing object
// itself; this says why it is missing.
func Reliance(u Unit) []Problem {
	if u.Path == "" {
		return nil
	}
	defined := map[string]bool{}
	type ref struct {
		d          *Document
		kind, name string
		field      []string
	}
	var refs []ref
	for _, d := range u.Set.Documents {
		if !d.IsPolicy() {
			continue
		}
		switch d.Kind {
		case "StoragePool", "Protocol":
			defined[d.Kind+"/"+d.Name] = true
		case "Placement":
			var pl struct {
				Spec struct {
					PoolRef     struct{ Name string } `json:"poolRef"`
					ProtocolRef struct{ Name string } `json:"protocolRef"`
				} `json:"spec"`
			}
			if yaml.Unmarshal(d.YAML, &pl) != nil {
				continue
			}
			if n := pl.Spec.PoolRef.Name; n != "" {
				refs = append(refs, ref{d, "StoragePool", n, []string{"spec", "poolRef", "name"}})
			}
			if n := pl.Spec.ProtocolRef.Name; n != "" {
				refs = append(refs, ref{d, "Protocol", n, []string{"spec", "protocolRef", "name"}})
			}
		}
	}
	var out []Problem
	var by []string
	searched := false
	for _, r := range refs {
		if defined[r.kind+"/"+r.name] {
			continue
		}
		if !searched {
			by, searched = IncludedBy(u.Path), true
		}
		msg := fmt.Sprintf("%s %q is not defined in %s: it is a base that relies on another; ", r.kind, r.name, u.Path)
		if len(by) > 0 {
			msg += "vet the overlay that includes both, as Flux builds it: plinth vet " + strings.Join(by, " ")
		} else {
			msg += "vet an overlay that includes both (a kustomization listing both folders under resources)"
		}
		p := Problem{File: r.d.File, Line: r.d.Line, Column: r.d.Column, Kind: r.d.Kind, Name: r.d.Name, Field: strings.Join(r.field, "."), Message: msg}
		src := r.d // a kustomize-built document has its position in its source file
		if src.source != nil {
			src = src.source
		}
		if expr := src.syntax(); expr != nil {
			if l, c, ok := fieldPos(expr, r.field); ok {
				p.Line, p.Column = l, c
			}
		}
		out = append(out, p)
	}
	return out
}
