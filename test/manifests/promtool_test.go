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

// rulesTestFile is the promtool unit test file of the alerts (rule_files: plinth-rules.yaml).
const rulesTestFile = "testdata/rules_test.yaml"

// TestPromtoolTestRules runs `promtool test rules` on testdata/rules_test.yaml against the
// PrometheusRule's spec, and requires every alert to have a case where it fires and one where
// it stays quiet (an alert_rule_test with empty exp_alerts).
func TestPromtoolTestRules(t *testing.T) {
	tool := promtool(t)
	spec, rules := alertRules(t)
	raw, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		RuleFiles []string `json:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(raw, &tf); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	if len(tf.RuleFiles) != 1 || tf.RuleFiles[0] != "plinth-rules.yaml" {
		t.Fatalf("%s: rule_files %v, want [plinth-rules.yaml]", rulesTestFile, tf.RuleFiles)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	for _, r := range rules {
		name, _ := r["alert"].(string)
		if fires[name] == 0 {
			t.Errorf("%s: no case where alert %s fires", rulesTestFile, name)
		}
		if quiet[name] == 0 {
			t.Errorf("%s: no case where alert %s stays quiet", rulesTestFile, name)
		}
	}
	dir := t.TempDir()
	data, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plinth-rules.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tool, "test", "rules", "rules_test.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Logf("%d alerts, %d firing and %d quiet cases: %s", len(rules), sum(fires), sum(quiet), out)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
