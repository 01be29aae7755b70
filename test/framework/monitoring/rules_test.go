package monitoring

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// The rules a scenario's Prometheus evaluates: no "for", and with a window cap, range windows
// longer than the cap cut to it (an alert made by an injected fault resolves within the cap
// after the undo), shorter ones and subqueries as shipped.
func TestLiveRulesWindow(t *testing.T) {
	shipped, err := filepath.Abs("../../../kustomize/monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rule.yaml")
	if err := os.WriteFile(file, []byte(`apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: r}
spec:
  groups:
  - name: g
    rules:
    - alert: Counter
      expr: sum by (reason) (increase(x_total[15m])) > 0
      for: 10m
    - alert: Trend
      expr: predict_linear(y[6h], 4 * 86400) < 0 and max_over_time(z[1h30m:1m]) > 0 and rate(w[1m]) > 0
`), 0o600); err != nil {
		t.Fatal(err)
	}
	exprs := func(out []byte) []string {
		var f struct {
			Groups []struct {
				Rules []map[string]any `json:"rules"`
			} `json:"groups"`
		}
		if err := yaml.Unmarshal(out, &f); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range f.Groups[0].Rules {
			if _, ok := r["for"]; ok {
				t.Errorf("rule %v keeps its for", r["alert"])
			}
			got = append(got, r["expr"].(string))
		}
		return got
	}
	out, err := LiveRulesWindow(file, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"sum by (reason) (increase(x_total[3m])) > 0",
		"predict_linear(y[3m], 4 * 86400) < 0 and max_over_time(z[1h30m:1m]) > 0 and rate(w[1m]) > 0"}
	if got := exprs(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("cut to 3m:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	out, err = LiveRules(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := exprs(out); !strings.Contains(got[0], "[15m]") || !strings.Contains(got[1], "[6h]") {
		t.Errorf("LiveRules changed the windows: %v", got)
	}
	if _, err := LiveRulesWindow(shipped, 3*time.Minute); err != nil {
		t.Errorf("the shipped rules: %v", err)
	}
}
