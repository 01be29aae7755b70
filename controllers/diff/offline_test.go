package diff_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/controllers/diff"
	"github.com/plinth-storage/plinth/controllers/render"
)

// TestOffline compares the trees of testdata/live against testdata/live/base for the node
// inventory testdata/nodes.yaml, without a cluster: the same report minus live usage.
func TestOffline(t *testing.T) {
	nodes, err := render.LoadNodes("testdata/nodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"testdata/live/base"}
	cases := []struct {
		tree    string
		exit    int
		objects []string
		check   func(t *testing.T, r *diff.Report)
	}{
		{tree: "base", exit: diff.ExitNoChange},
		{tree: "reserve", exit: diff.ExitChanges, objects: []string{"change Store/fast.node-a", "change Store/fast.node-b"}},
		{tree: "narrow", exit: diff.ExitChanges, objects: []string{"prune Agent/node-a", "prune Store/fast.node-a"},
			check: func(t *testing.T, r *diff.Report) {
				if len(r.Storage.StoresRemoved) != 1 || r.Storage.StoresRemoved[0].Drains {
					t.Errorf("stores removed %+v (offline: drain unknown, reported as removal)", r.Storage.StoresRemoved)
				}
			}},
		{tree: "filesystem", exit: diff.ExitChanges, objects: []string{"replace StorageClass/plinth-fast"},
			check: func(t *testing.T, r *diff.Report) {
				cl := r.Storage.Classes[0]
				if cl.AllowedKnown || cl.Replacement != "IfUnused" || len(cl.Claims) != 0 {
					t.Errorf("IfUnused offline must be unknown, without claims: %+v", cl)
				}
			}},
		{tree: "replace", exit: diff.ExitChanges, objects: []string{"replace StorageClass/plinth-fast"}},
		// spreadAcross is a StorageClass parameter: setting it replaces the class.
		{tree: "spread", exit: diff.ExitChanges, objects: []string{"replace StorageClass/plinth-fast"},
			check: func(t *testing.T, r *diff.Report) {
				if o := r.Objects[0]; len(o.Fields) != 1 || o.Fields[0] != "parameters.plinth.dev/spread-across" ||
					!strings.Contains(o.Reason, "topology.kubernetes.io/zone") {
					t.Errorf("replacement fields %v, reason %q", o.Fields, o.Reason)
				}
			}},
		{tree: "removed", exit: diff.ExitChanges, objects: []string{"prune StorageClass/plinth-scratch", "prune VolumeAttributesClass/scratch-gold"},
			check: func(t *testing.T, r *diff.Report) {
				if len(r.Policy) != 1 || r.Policy[0].Action != "delete" || r.Policy[0].File != "testdata/live/base/placements.yaml" || r.Policy[0].Line == 0 {
					t.Errorf("a deleted policy object is located in the old tree: %+v", r.Policy)
				}
			}},
		{tree: "protocol", exit: diff.ExitChanges, objects: []string{"change Agent/node-c"}},
		{tree: "overcommit", exit: diff.ExitChanges, objects: []string{"change Store/thin.node-c"}},
	}
	for _, tc := range cases {
		t.Run(tc.tree, func(t *testing.T) {
			r, err := diff.Offline([]string{"testdata/live/" + tc.tree}, base, nodes)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.ExitCode(); got != tc.exit {
				t.Errorf("exit %d, want %d", got, tc.exit)
			}
			var objs []string
			for _, o := range r.Objects {
				objs = append(objs, o.Action+" "+o.Kind+"/"+o.Name)
			}
			if strings.Join(objs, "\n") != strings.Join(tc.objects, "\n") {
				t.Errorf("objects:\n%s\nwant:\n%s", strings.Join(objs, "\n"), strings.Join(tc.objects, "\n"))
			}
			if len(r.Violations) != 0 || len(r.Storage.Pools) != 0 {
				t.Errorf("offline needs no live usage: violations %v, pools %v", r.Violations, r.Storage.Pools)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
			if tc.tree == "narrow" || tc.tree == "filesystem" {
				golden(t, r, "offline-"+tc.tree)
			}
		})
	}
}

// TestOfflineInvalid: a tree that does not vet is a report with its problems (exit 2), for
// either side.
func TestOfflineInvalid(t *testing.T) {
	nodes, err := render.LoadNodes("testdata/nodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][2]string{{"testdata/invalid", "testdata/live/base"}, {"testdata/live/base", "testdata/invalid"}} {
		r, err := diff.Offline([]string{args[0]}, []string{args[1]}, nodes)
		if err != nil {
			t.Fatal(err)
		}
		if r.ExitCode() != diff.ExitErrors || len(r.Problems) == 0 || !strings.HasPrefix(r.Problems[0].File, "testdata/invalid") {
			t.Errorf("%v: exit %d, problems %v", args, r.ExitCode(), r.Problems)
		}
		var b bytes.Buffer
		if err := diff.Write(&b, r, diff.FormatText); err != nil || !strings.Contains(b.String(), "testdata/invalid/pool.yaml:") {
			t.Errorf("text output lacks the problem position: %v\n%s", err, b.String())
		}
	}
}

// TestOfflineRefusesMisspelledPlacementFields: a proposed tree whose Placements misspell
// fields is a report of problems (exit 2), each at its file:line:col, not a clean diff.
func TestOfflineRefusesMisspelledPlacementFields(t *testing.T) {
	nodes, err := render.LoadNodes("testdata/nodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r, err := diff.Offline([]string{"testdata/live/base"}, []string{"testdata/typo"}, nodes)
	if err != nil {
		t.Fatal(err)
	}
	checkTypoProblems(t, r)
}

// checkTypoProblems wants the report of testdata/typo: exit 2 and one problem per misspelled
// field, positioned in testdata/typo/placements.yaml, in the text output too.
func checkTypoProblems(t *testing.T, r *diff.Report) {
	t.Helper()
	if got := r.ExitCode(); got != diff.ExitErrors {
		t.Errorf("exit %d, want %d (errors)", got, diff.ExitErrors)
	}
	want := []string{
		"testdata/typo/placements.yaml:14:19: Placement/fast: spec.storageClass.reclaimPolcy: field not allowed",
		"testdata/typo/placements.yaml:15:26: Placement/fast: spec.storageClass.allowVolumeExpanson: field not allowed",
		"testdata/typo/placements.yaml:16:16: Placement/fast: spec.storageClass.isdefault: field not allowed",
		"testdata/typo/placements.yaml:18:13: Placement/fast: spec.filesystem.fstype: field not allowed",
		"testdata/typo/placements.yaml:30:12: Placement/scratch: spec.stratgy: field not allowed",
		"testdata/typo/placements.yaml:31:18: Placement/scratch: spec.spreadAccross: field not allowed",
	}
	var got []string
	for _, p := range r.Problems {
		got = append(got, p.String())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var b bytes.Buffer
	if err := diff.Write(&b, r, diff.FormatText); err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if pos, _, _ := strings.Cut(w, ": "); !strings.Contains(b.String(), pos) {
			t.Errorf("text output lacks %s:\n%s", pos, b.String())
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 512: "512B", 1024: "1Ki", 1536: "1.5Ki", 40 << 30: "40Gi", -(2 << 20): "-2Mi", 3 << 40: "3Ti"} {
		if got := diff.FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestOfflineEncryptionDropped: encryption added to a Placement replaces its class (the key
// Secret becomes a node-stage secret parameter) and is no violation; removed, it is the
// EncryptionDropped violation at spec.encryption of the proposed tree's Placement.
func TestOfflineEncryptionDropped(t *testing.T) {
	nodes, err := render.LoadNodes("testdata/nodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	add, err := diff.Offline([]string{"testdata/live/encrypted"}, []string{"testdata/live/base"}, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if len(add.Violations) != 0 || len(add.Objects) != 1 || add.Objects[0].Action != diff.ActionReplace ||
		!slices.Contains(add.Objects[0].Fields, "parameters.csi.storage.k8s.io/node-stage-secret-name") {
		t.Errorf("encryption added: violations %v, objects %+v", add.Violations, add.Objects)
	}
	drop, err := diff.Offline([]string{"testdata/live/base"}, []string{"testdata/live/encrypted"}, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if len(drop.Violations) != 1 {
		t.Fatalf("encryption dropped: violations %v", drop.Violations)
	}
	v := drop.Violations[0]
	if v.Rule != diff.RuleEncryptionDropped || v.Object != "Placement/fast" || v.Field != "spec.encryption" || !strings.Contains(v.Message, "drops encryption") {
		t.Errorf("violation %+v", v)
	}
	if drop.ExitCode() != diff.ExitViolations {
		t.Errorf("exit %d, want %d", drop.ExitCode(), diff.ExitViolations)
	}
}
