package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVetPolicyRepository: the policy repository users fork is vetted as Flux syncs it, each
// overlay built on its own: the pools and placements that base/ gives both overlays are no
// duplicates, and both overlays are vetted.
func TestVetPolicyRepository(t *testing.T) {
	code, out, errOut := plinthOutErr(t, "vet", "../../policies")
	if code != exitOK || errOut != "" {
		t.Fatalf("plinth vet policies: exit %d, stderr:\n%s", code, errOut)
	}
	if out != "" {
		t.Errorf("stdout %q, want nothing", out)
	}
	code, out, _ = plinthOutErr(t, "vet", "-o", "json", "../../policies")
	var rep struct {
		Valid bool `json:"valid"`
		Units []struct {
			Path     string            `json:"path"`
			Valid    bool              `json:"valid"`
			Problems []json.RawMessage `json:"problems"`
		} `json:"units"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	var paths []string
	for _, u := range rep.Units {
		paths = append(paths, filepath.ToSlash(u.Path))
	}
	if code != exitOK || !rep.Valid || strings.Join(paths, " ") != "../../policies/clusters/production ../../policies/clusters/staging" {
		t.Errorf("exit %d valid %v units %v, want the two overlays, valid", code, rep.Valid, paths)
	}
}

// TestVetBaseThatReliesOnAnother: a base vetted alone that names a protocol another base
// defines says so at the reference, and names the overlay that vets both.
func TestVetBaseThatReliesOnAnother(t *testing.T) {
	code, _, errOut := plinthOutErr(t, "vet", "../../policies/dev")
	if code != exitInvalid {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitInvalid, errOut)
	}
	var line string
	for _, l := range strings.Split(errOut, "\n") {
		if strings.Contains(l, "relies on another") {
			line = l
		}
	}
	for _, want := range []string{"policies/dev/file-pool.yaml:20:", "Placement/dev-files: spec.protocolRef.name:", `Protocol "local" is not defined in ../../policies/dev`, "plinth vet ", "policies/clusters/staging"} {
		if !strings.Contains(line, want) {
			t.Errorf("no line says the base relies on another with %q; stderr:\n%s", want, errOut)
		}
	}
	if strings.Contains(line, "clusters/production") {
		t.Errorf("names an overlay that does not include the base: %s", line)
	}
}

// TestVetOverlaysReportOnce: a problem in a base two overlays include is printed once, with
// both overlays named.
func TestVetOverlaysReportOnce(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"base/kustomization.yaml": "resources: [pool.yaml]\n",
		"base/pool.yaml": `apiVersion: policy.plinth.dev/v1alpha1
kind: StoragePool
metadata: {name: fast}
spec:
  nodeSelector: {matchLabels: {plinth.dev/storage: nvme}}
  backend: {lvm: {volumeGroup: vg0, devices: [/dev/sdb]}}
  reserv: 1Gi
`,
		"clusters/a/kustomization.yaml": "resources: [../../base]\n",
		"clusters/b/kustomization.yaml": "resources: [../../base]\n",
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	code, _, errOut := plinthOutErr(t, "vet", dir)
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code != exitInvalid || len(lines) != 1 {
		t.Fatalf("exit %d, %d lines, want %d and 1:\n%s", code, len(lines), exitInvalid, errOut)
	}
	for _, want := range []string{"pool.yaml:7:", "reserv", "(overlay " + filepath.Join(dir, "clusters/a") + ", " + filepath.Join(dir, "clusters/b") + ")"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line lacks %q: %s", want, lines[0])
		}
	}
}
