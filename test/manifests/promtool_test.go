package manifests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/plinth-storage/plinth/test/prereq"
	"sigs.k8s.io/yaml"
)

// promtool finds promtool (Debian's prometheus package ships it): $PROMTOOL, else $PATH. When
// it is missing the test skips, or fails under PLINTH_INTEGRATION=1 (CI installs it).
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	return prereq.Commands(t, "promtool")[0]
}

func checkRules(t *testing.T, tool, name string, groups any) {
	t.Helper()
	data, err := yaml.Marshal(groups)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tool, "check", "rules", f).CombinedOutput()
	if err != nil {
		t.Errorf("promtool check rules %s: %v\n%s\n--- %s:\n%s", name, err, out, name, data)
	}
	t.Logf("%s", out)
}

// The PrometheusRule's spec is a Prometheus rules file: promtool check rules on it.
func TestPromtoolCheckRules(t *testing.T) {
	tool := promtool(t)
	spec, _ := alertRules(t)
	checkRules(t, tool, "plinth-rules.yaml", spec)
}

var grafanaVar = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// Every dashboard expression parses as PromQL: each becomes a recording rule that promtool
// checks, with Grafana's variables replaced ($__rate_interval and $__interval by a duration,
// the others by a regex that matches anything).
func TestPromtoolDashboardExpressions(t *testing.T) {
	tool := promtool(t)
	var rules []map[string]string
	n := 0
	for _, e := range allExprs(t) {
		if e.where[:6] == "alert " {
			continue
		}
		if matched, _ := regexp.MatchString(`^label_values\(`, e.expr); matched {
			continue // a Grafana template function, not PromQL
		}
		expr := grafanaVar.ReplaceAllStringFunc(e.expr, func(v string) string {
			switch grafanaVar.FindStringSubmatch(v)[1] {
			case "__rate_interval", "__interval", "__range":
				return "5m"
			default:
				return ".*"
			}
		})
		n++
		rules = append(rules, map[string]string{"record": fmt.Sprintf("plinth:dashboard_check:%d", n), "expr": expr})
	}
	if n == 0 {
		t.Fatal("no dashboard expressions")
	}
	checkRules(t, tool, "dashboards.yaml", map[string]any{"groups": []any{map[string]any{"name": "dashboards", "rules": rules}}})
}
