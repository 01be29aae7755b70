package prereq

import (
	"strings"
	"testing"
)

// recorder is a testing.TB that records Fatalf and Skipf instead of stopping.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Fatalf(format string, a ...any) { r.fatal = format }
func (r *recorder) Skipf(format string, a ...any)  { r.skip = format }

func TestMissingFailsInCI(t *testing.T) {
	for _, tc := range []struct {
		ci, integration string
		fatal           bool
	}{{"", "", false}, {"true", "", true}, {"", "1", true}, {"false", "0", false}} {
		t.Setenv(EnvCI, tc.ci)
		t.Setenv(EnvIntegration, tc.integration)
		r := &recorder{TB: t}
		Missing(r, "command %s", "losetup")
		if got := r.fatal != ""; got != tc.fatal || (r.skip != "") == tc.fatal {
			t.Errorf("CI=%q PLINTH_INTEGRATION=%q: fatal %q, skip %q; want fatal=%v", tc.ci, tc.integration, r.fatal, r.skip, tc.fatal)
		}
		if msg := r.fatal + r.skip; !strings.Contains(msg, "missing prerequisite") {
			t.Errorf("message %q does not say a prerequisite is missing", msg)
		}
	}
}

func TestCommands(t *testing.T) {
	t.Setenv(EnvCI, "true")
	r := &recorder{TB: t}
	if p := Commands(r, "sh"); len(p) != 1 || r.fatal != "" {
		t.Errorf("Commands(sh) = %q, fatal %q", p, r.fatal)
	}
	if Commands(r, "plinth-no-such-command"); r.fatal == "" {
		t.Error("a missing command did not fail under CI=true")
	}
}
