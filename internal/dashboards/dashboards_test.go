package dashboards

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// committed is where make generate writes the dashboards, relative to this package's folder.
const committed = "../../kustomize/monitoring/dashboards"

// The committed JSON is what this package builds (make verify-generate checks the same in CI).
func TestCommittedJSONIsGenerated(t *testing.T) {
	for _, s := range All() {
		want, err := s.JSON()
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(committed, s.File))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from internal/dashboards: run make generate and commit", s.File)
		}
	}
}

// Panel titles are unique in a dashboard (test/framework/monitoring's expectation table is keyed on
// them), every panel has a query and every dashboard a distinct uid.
func TestSpecs(t *testing.T) {
	uids := map[string]bool{}
	for _, s := range All() {
		if uids[s.UID] {
			t.Errorf("uid %s twice", s.UID)
		}
		uids[s.UID] = true
		titles := map[string]bool{}
		for _, r := range s.Rows {
			for _, p := range r.Panels {
				if titles[p.Title] {
					t.Errorf("%s: panel title %q twice", s.File, p.Title)
				}
				titles[p.Title] = true
				if len(p.Queries) == 0 {
					t.Errorf("%s: panel %q has no query", s.File, p.Title)
				}
			}
		}
	}
}
