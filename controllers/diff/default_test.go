package diff_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/controllers/diff"
	"github.com/plinth-storage/plinth/controllers/render"
)

// tree writes testdata/live/base with edit applied to placements.yaml into a temporary
// folder and returns it.
func tree(t *testing.T, edit func(string) string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"pools.yaml", "protocols.yaml", "placements.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata/live/base", f))
		must(t, err)
		s := string(b)
		if f == "placements.yaml" {
			s = edit(s)
		}
		must(t, os.WriteFile(filepath.Join(dir, f), []byte(s), 0o600))
	}
	return dir
}

// TestOfflineDefaultClassAndForbiddenReplacement: a replacement the Placement forbids is a
// violation at the field that asks for it (exit 3); replacing or removing the cluster's default
// StorageClass is called out.
func TestOfflineDefaultClassAndForbiddenReplacement(t *testing.T) {
	nodes, err := render.LoadNodes("testdata/nodes.yaml")
	must(t, err)
	asDefault := func(s string) string {
		return strings.Replace(s, "    name: plinth-fast\n", "    name: plinth-fast\n    isDefault: true\n", 1)
	}
	policy := func(p string) func(string) string {
		return func(s string) string { return strings.Replace(s, "replacement: IfUnused", "replacement: "+p, 1) }
	}
	xfsToExt4 := func(s string) string { return strings.Replace(s, "fsType: xfs", "fsType: ext4", 1) }

	t.Run("forbidden", func(t *testing.T) {
		old := tree(t, policy("Never"))
		head := tree(t, func(s string) string { return xfsToExt4(policy("Never")(s)) })
		r, err := diff.Offline([]string{head}, []string{old}, nodes)
		must(t, err)
		if r.ExitCode() != diff.ExitViolations || len(r.Violations) != 1 {
			t.Fatalf("exit %d, violations %+v", r.ExitCode(), r.Violations)
		}
		v := r.Violations[0]
		if v.Rule != diff.RuleReplacementNotAllowed || v.Object != "Placement/fast" || v.Field != "spec.filesystem.fsType" ||
			v.File != filepath.Join(head, "placements.yaml") || v.Line != 13 {
			t.Errorf("violation %+v, want it at the fsType line", v)
		}
	})
	t.Run("stalled already", func(t *testing.T) {
		// The same tree on both sides: the class was kept before, this change causes nothing.
		same := tree(t, func(s string) string { return xfsToExt4(policy("Never")(s)) })
		r, err := diff.Offline([]string{same}, []string{same}, nodes)
		must(t, err)
		if len(r.Violations) != 0 {
			t.Errorf("violations %+v for a change that changes nothing", r.Violations)
		}
	})
	t.Run("default replaced", func(t *testing.T) {
		old := tree(t, func(s string) string { return asDefault(policy("Always")(s)) })
		head := tree(t, func(s string) string { return xfsToExt4(asDefault(policy("Always")(s))) })
		r, err := diff.Offline([]string{head}, []string{old}, nodes)
		must(t, err)
		if len(r.Storage.Classes) != 1 || !r.Storage.Classes[0].Default || !strings.Contains(r.Storage.Classes[0].Outcome, "default StorageClass") {
			t.Errorf("classes %+v: the default class's replacement is not called out", r.Storage.Classes)
		}
	})
	t.Run("default removed", func(t *testing.T) {
		old := tree(t, asDefault)
		head := tree(t, func(s string) string {
			i := strings.Index(s, "---\n")
			return s[i+4:] // without the first Placement (fast)
		})
		r, err := diff.Offline([]string{head}, []string{old}, nodes)
		must(t, err)
		found := false
		for _, ci := range r.Storage.Classes {
			if ci.Name == "plinth-fast" {
				found = ci.Default && strings.Contains(ci.Outcome, "default StorageClass")
			}
		}
		if !found {
			t.Errorf("classes %+v: the default class's removal is not called out", r.Storage.Classes)
		}
	})
}
