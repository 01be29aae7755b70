package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// plinth runs the command line as main does and returns the exit status and stdout.
func plinth(t *testing.T, args ...string) (int, string) {
	t.Helper()
	code, out, _ := plinthOutErr(t, args...)
	return code, out
}

// TestDiffOffline checks the exit statuses and formats of plinth diff --against (the live
// mode is proven in controllers/diff against the real API server).
func TestDiffOffline(t *testing.T) {
	const td = "../../controllers/diff/testdata/"
	nodes := td + "nodes.yaml"
	for _, tc := range []struct {
		args []string
		exit int
		want string
	}{
		{[]string{td + "live/base", "--against", td + "live/base", "--nodes", nodes}, 0, "0 policy objects changed"},
		{[]string{td + "live/narrow", "--against", td + "live/base", "--nodes", nodes}, 1, "- Store/fast.node-a prune"},
		{[]string{td + "live/filesystem", "--against", td + "live/base", "--nodes", nodes, "-o", "markdown"}, 1, "<!-- plinth-diff -->"},
		{[]string{td + "invalid", "--against", td + "live/base", "--nodes", nodes}, 2, "invalid/pool.yaml:"},
		{[]string{td + "live/base", "--against", td + "live/base"}, 2, ""}, // --against needs --nodes
		{[]string{td + "live/base", "--against", td + "live/base", "--nodes", nodes, "-o", "yaml"}, 2, ""},
		{[]string{td + "live/base", "--nodes", nodes}, 2, ""}, // --nodes is offline only
		{[]string{td + "live/base", "--against", td + "live/base", "--nodes", nodes, "--move-rate", "fast"}, 2, ""},
		{[]string{td + "live/base", "--against", td + "live/base", "--nodes", nodes, "--move-rate", "0"}, 2, ""},
		{[]string{td + "live/base", "--against", td + "live/base", "--nodes", nodes, "--move-rate", "1Gi"}, 0, "0 policy objects changed"},
	} {
		code, out := plinth(t, append([]string{"diff"}, tc.args...)...)
		if code != tc.exit || !strings.Contains(out, tc.want) {
			t.Errorf("plinth diff %s: exit %d, want %d; output lacks %q?\n%s", strings.Join(tc.args, " "), code, tc.exit, tc.want, out)
		}
	}
	code, out := plinth(t, "diff", td+"live/removed", "--against", td+"live/base", "--nodes", nodes, "-o", "json")
	var rep struct {
		Mode   string `json:"mode"`
		Counts struct {
			Prune int `json:"prune"`
		} `json:"counts"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 1 || rep.Mode != "offline" || rep.Counts.Prune != 2 { // the StorageClass and the tier of Placement scratch
		t.Errorf("-o json: exit %d, %+v, %v\n%s", code, rep, err, out)
	}
}
