package vet

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/test/prereq"
)

const testdata = "../cue/testdata"

func vetPaths(t testing.TB, paths ...string) (*Policies, []Problem) {
	t.Helper()
	set, err := Load(paths...)
	if err != nil {
		t.Fatalf("Load(%v): %v", paths, err)
	}
	v, err := NewVetter()
	if err != nil {
		t.Fatalf("NewVetter: %v", err)
	}
	return v.Vet(set)
}

// TestInvalidFixtures vets every file under testdata/invalid and compares the problems with
// the exact lines of its .expect file (paths relative to the fixture folder).
func TestInvalidFixtures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testdata, "invalid", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			want, err := os.ReadFile(strings.TrimSuffix(f, ".yaml") + ".expect")
			if err != nil {
				t.Fatalf("every invalid fixture needs an .expect file: %v", err)
			}
			_, problems := vetPaths(t, f)
			if len(problems) == 0 {
				t.Fatalf("%s: no problem found, want:\n%s", f, want)
			}
			var got []string
			for _, p := range problems {
				got = append(got, strings.ReplaceAll(p.String(), filepath.Join(testdata, "invalid")+"/", ""))
			}
			if g, w := strings.Join(got, "\n"), strings.TrimSpace(string(want)); g != w {
				t.Errorf("problems differ\n got:\n%s\nwant:\n%s", g, w)
			}
		})
	}
}

func TestValidSets(t *testing.T) {
	for _, p := range []string{
		filepath.Join(testdata, "valid"),
		"../../examples/quickstart",
		"../../policies/clusters/staging",
		"../../policies/clusters/production",
	} {
		t.Run(p, func(t *testing.T) {
			pol, problems := vetPaths(t, p)
			for _, pr := range problems {
				t.Errorf("unexpected problem: %s", pr)
			}
			if len(pol.Pools) == 0 || len(pol.Placements) == 0 || len(pol.Protocols) == 0 {
				t.Errorf("decoded %d pools, %d protocols, %d placements; want each ≥ 1", len(pol.Pools), len(pol.Protocols), len(pol.Placements))
			}
		})
	}
}

// TestDefaults checks that the schema's defaults reach the decoded objects.
func TestDefaults(t *testing.T) {
	pol, problems := vetPaths(t, filepath.Join(testdata, "valid"))
	if len(problems) > 0 {
		t.Fatalf("problems: %v", problems)
	}
	pl := pol.Placements[0]
	if pl.Spec.Strategy != "Binpack" || pl.Spec.StorageClass.ReclaimPolicy != "Delete" ||
		pl.Spec.StorageClass.Replacement != "Never" {
		t.Errorf("placement defaults not filled: %+v", pl.Spec)
	}
	if p := pol.Pools[0]; p.Spec.DriftPolicy != "Report" || p.Spec.Backend.LVM.ThinPool.SizePercent != 90 {
		t.Errorf("pool defaults not filled: %+v", p.Spec)
	}
	for _, pr := range pol.Protocols {
		if n := pr.Spec.NVMeoFTCP; n != nil && (n.Port != 4420 || n.ACL == nil || !*n.ACL) {
			t.Errorf("protocol defaults not filled: %+v", n)
		}
	}
	if len(pol.Others) != 1 || pol.Others[0].Kind != "ConfigMap" {
		t.Errorf("other kinds must pass through: %+v", pol.Others)
	}
}

// TestKustomizePositions checks that a problem in a document built by kustomize points at
// the source file and line, not at kustomize's output.
func TestKustomizePositions(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("base/kustomization.yaml", "resources: [pool.yaml]\n")
	write("base/pool.yaml", "# a comment\napiVersion: policy.plinth.dev/v1alpha1\nkind: StoragePool\nmetadata:\n  name: p\nspec:\n  backend:\n    lvm: {volumeGroup: -bad}\n")
	write("overlay/kustomization.yaml", "resources: [../base]\npatches:\n- target: {kind: StoragePool}\n  patch: |\n    - {op: add, path: /spec/reserve, value: 1Gi}\n")
	_, problems := vetPaths(t, filepath.Join(dir, "overlay"))
	if len(problems) != 1 {
		t.Fatalf("want 1 problem, got %v", problems)
	}
	p := problems[0]
	if !strings.HasSuffix(p.File, filepath.Join("base", "pool.yaml")) || p.Line != 8 || p.Field != "spec.backend.lvm.volumeGroup" {
		t.Errorf("problem not located in the source: %s", p)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing path must be an error")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte("resources: [nope.yaml]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "kustomize build") {
		t.Errorf("a broken kustomization must be an error naming kustomize, got %v", err)
	}
}

// TestCueCLI runs the plain `cue vet` command README gives for a policy repository's CI, with
// the pinned cue binary (PLINTH_CUE, set by make test-unit).
func TestCueCLI(t *testing.T) {
	cue := prereq.Env(t, "PLINTH_CUE", "the pinned cue binary; make test-unit and make test-integration set it")
	run := func(def string, files ...string) error {
		args := append([]string{"vet", "-c", "-d", def, "../cue/policy.cue"}, files...)
		out, err := exec.Command(cue, args...).CombinedOutput()
		if err != nil {
			t.Logf("cue %s: %s", strings.Join(args, " "), out)
		}
		return err
	}
	if err := run("#StoragePool", "../../examples/quickstart/pool.yaml", "../../policies/dev/file-pool.yaml"); err == nil {
		t.Error("file-pool.yaml holds a Placement too: cue vet -d #StoragePool must reject it")
	}
	if err := run("#StoragePool", "../../examples/quickstart/pool.yaml", "../../policies/base/pools.yaml"); err != nil {
		t.Errorf("cue vet rejected valid pools: %v", err)
	}
	if err := run("#Protocol", "../../policies/base/protocols.yaml"); err != nil {
		t.Errorf("cue vet rejected valid protocols: %v", err)
	}
	if err := run("#Placement", "../../policies/base/placements.yaml"); err != nil {
		t.Errorf("cue vet rejected valid placements: %v", err)
	}
	for _, bad := range []string{"backend-two.yaml", "vg-reserved.yaml", "overcommit-file.yaml", "unknown-field.yaml"} {
		if err := run("#StoragePool", filepath.Join(testdata, "invalid", bad)); err == nil {
			t.Errorf("cue vet accepted invalid/%s", bad)
		}
	}
}

func FuzzLoadAndVet(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join(testdata, "*", "*.yaml"))
	for _, s := range seeds {
		if b, err := os.ReadFile(s); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("apiVersion: policy.plinth.dev/v1alpha1\nkind: Placement\nmetadata: {name: 7}\nspec: [1]\n"))
	v, err := NewVetter()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		set := LoadBytes("fuzz.yaml", data)
		_, problems := v.Vet(set)
		for _, p := range problems {
			if p.Message == "" || p.File != "fuzz.yaml" {
				t.Errorf("problem without message or file: %+v", p)
			}
		}
	})
}

// TestDecodeMatchesCUE decodes every valid document both ways — the fast path Vet uses
// (YAML text plus Go defaults) and the CUE value unified with the schema — and requires the
// same object, so Go and CUE defaults cannot drift apart.
func TestDecodeMatchesCUE(t *testing.T) {
	v, err := NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(testdata, "valid"), "../../policies/clusters/staging", "../../policies/clusters/production", "../../examples/quickstart"} {
		set, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		pol, problems := v.Vet(set)
		if len(problems) > 0 {
			t.Fatalf("%s: %v", p, problems)
		}
		var fast []any
		for i := range pol.Pools {
			fast = append(fast, &pol.Pools[i])
		}
		for i := range pol.Protocols {
			fast = append(fast, &pol.Protocols[i])
		}
		for i := range pol.Placements {
			fast = append(fast, &pol.Placements[i])
		}
		var slow []any
		for _, d := range set.Documents {
			if !d.IsPolicy() {
				continue
			}
			u := v.schema.Defs[d.Kind].Unify(v.schema.Context.BuildExpr(d.Expr))
			obj := newPolicyObject(d.Kind)
			if err := u.Decode(obj); err != nil {
				t.Fatal(err)
			}
			slow = append(slow, obj)
		}
		// Vet returns pools, then protocols, then placements; order the CUE side the same way.
		order := map[string]int{"StoragePool": 0, "Protocol": 1, "Placement": 2}
		sort.SliceStable(slow, func(i, j int) bool {
			return order[kindOf(slow[i])] < order[kindOf(slow[j])]
		})
		if len(fast) != len(slow) {
			t.Fatalf("%s: %d vs %d objects", p, len(fast), len(slow))
		}
		for i := range fast {
			// Filesystem is optional in CUE, so its defaults apply only where it is written;
			// Go fills them always. Apply the Go defaults to the CUE side too: what remains
			// must be equal, which proves every CUE default is also a Go default.
			slow[i].(defaulter).Default()
			if !reflect.DeepEqual(fast[i], slow[i]) {
				t.Errorf("%s: decoded objects differ:\n fast %+v\n  cue %+v", p, fast[i], slow[i])
			}
		}
	}
}

func kindOf(o any) string {
	switch o.(type) {
	case *policyv1.StoragePool:
		return "StoragePool"
	case *policyv1.Protocol:
		return "Protocol"
	}
	return "Placement"
}
