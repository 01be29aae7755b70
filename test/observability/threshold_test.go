package observability

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The heartbeat alert's wait is read from the shipped rule, so the live test waits what users
// wait; a rule without a trailing "> <seconds>" is an error, not a zero wait.
func TestAlertThresholdReadFromShippedRule(t *testing.T) {
	got, err := alertThreshold(prometheusRule, heartbeatAlert)
	if err != nil {
		t.Fatal(err)
	}
	if got != 180*time.Second {
		t.Errorf("%s threshold %s, want 180s (the shipped rule's)", heartbeatAlert, got)
	}
	dir := t.TempDir()
	for name, body := range map[string]string{
		"no such alert": "spec: {groups: [{rules: [{alert: Other, expr: up > 1}]}]}",
		"no threshold":  "spec: {groups: [{rules: [{alert: " + heartbeatAlert + ", expr: absent(up)}]}]}",
	} {
		f := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yaml")
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if d, err := alertThreshold(f, heartbeatAlert); err == nil {
			t.Errorf("%s: threshold %s, want an error", name, d)
		}
	}
}
