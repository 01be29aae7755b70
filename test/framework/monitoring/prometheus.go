package monitoring

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// Prometheus is a running Prometheus server.
type Prometheus struct {
	// URL is http://127.0.0.1:<port>.
	URL  string
	API  promv1.API
	Proc *controlplane.Process
}

// PrometheusBinary is Debian's Prometheus server (package prometheus, which also has promtool).
const PrometheusBinary = "/usr/bin/prometheus"

// Starter starts a process it then owns (stopped with it): a control plane's StartProcess.
type Starter func(ctx context.Context, spec controlplane.ProcessSpec) (*controlplane.Process, error)

// StartPrometheus starts Prometheus through start on a free loopback port with config (YAML)
// and its data under dir, and waits until /-/ready answers (at most two minutes).
func StartPrometheus(ctx context.Context, start Starter, bin, dir string, config []byte) (*Prometheus, error) {
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, config, 0o644); err != nil {
		return nil, err
	}
	port, err := controlplane.FreePort()
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	p, err := start(ctx, controlplane.ProcessSpec{
		Name: "prometheus", Binary: bin,
		Args: []string{"--config.file=" + cfgPath, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
			fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), "--web.enable-lifecycle", "--log.level=warn"},
		Ready:        controlplane.HTTPReady(url+"/-/ready", nil),
		ReadyTimeout: 2 * time.Minute,
	})
	if err != nil {
		return nil, err
	}
	c, err := api.NewClient(api.Config{Address: url})
	if err != nil {
		return nil, err
	}
	return &Prometheus{URL: url, API: promv1.NewAPI(c), Proc: p}, nil
}

// LiveRules returns the spec of the PrometheusRule in file (YAML) as a Prometheus rule file
// with every "for" removed: a scenario runs minutes, not the 15 to 30 minutes the rules wait.
// The expressions stay the shipped ones; the "for" durations are covered by test/manifests'
// promtool unit tests.
func LiveRules(file string) ([]byte, error) { return LiveRulesWindow(file, 0) }

// rangeSelector matches a range selector's duration in PromQL, such as "[15m]" or "[1h30m]"
// (a subquery's "[1h:5m]" does not match).
var rangeSelector = regexp.MustCompile(`\[([0-9]+(?:ms|[smhdwy])(?:[0-9]+(?:ms|[smhdwy]))*)\]`)

// LiveRulesWindow is LiveRules with every range selector longer than maxWindow cut to
// maxWindow (0 keeps them): a Prometheus that lives for a scenario holds only its minutes, and
// an alert made true by a fault injected and then undone (an increase over [15m] of a counter)
// resolves maxWindow after the undo instead of 15 minutes. Errors: the file cannot be read, is
// no PrometheusRule, or has no groups.
func LiveRulesWindow(file string, maxWindow time.Duration) ([]byte, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var pr unstructured.Unstructured
	if err := yaml.Unmarshal(raw, &pr.Object); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if pr.GetKind() != "PrometheusRule" {
		return nil, fmt.Errorf("%s: kind %q, want PrometheusRule", file, pr.GetKind())
	}
	groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
	if len(groups) == 0 {
		return nil, fmt.Errorf("%s: no spec.groups", file)
	}
	cut := "[" + model.Duration(maxWindow).String() + "]"
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rules {
			rule := r.(map[string]any)
			delete(rule, "for")
			expr, ok := rule["expr"].(string)
			if !ok || maxWindow <= 0 {
				continue
			}
			rule["expr"] = rangeSelector.ReplaceAllStringFunc(expr, func(sel string) string {
				d, err := model.ParseDuration(sel[1 : len(sel)-1])
				if err != nil || time.Duration(d) <= maxWindow {
					return sel
				}
				return cut
			})
		}
	}
	return yaml.Marshal(map[string]any{"groups": groups})
}

// Poll is wait.Poll every 200 ms: f until it returns nil, ctx ends or timeout passes (then f's
// last error is returned).
func Poll(ctx context.Context, timeout time.Duration, f func() error) error {
	return wait.Poll(ctx, timeout, 200*time.Millisecond, f)
}

// TargetsUp returns nil when Prometheus has exactly want active targets per job, all up;
// otherwise an error listing what is missing or down.
func TargetsUp(ctx context.Context, api promv1.API, want map[string]int) error {
	res, err := api.Targets(ctx)
	if err != nil {
		return err
	}
	up := map[string]int{}
	var problems []string
	for _, tg := range res.Active {
		job := string(tg.Labels["job"])
		if tg.Health == promv1.HealthGood {
			up[job]++
		} else {
			problems = append(problems, fmt.Sprintf("%s %s: %s", tg.ScrapeURL, tg.Health, tg.LastError))
		}
	}
	for job, n := range want {
		if up[job] != n {
			problems = append(problems, fmt.Sprintf("job %s: %d of %d targets up", job, up[job], n))
		}
	}
	for job, n := range up {
		if _, ok := want[job]; !ok {
			problems = append(problems, fmt.Sprintf("job %s: %d targets nobody expects", job, n))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// NonEmpty returns nil when the instant query expr has at least one sample now.
func NonEmpty(ctx context.Context, api promv1.API, expr string) error {
	v, _, _, err := api.Query(ctx, expr, time.Now())
	if err != nil {
		return err
	}
	if vec, ok := v.(model.Vector); !ok || len(vec) == 0 {
		return fmt.Errorf("%s: no result yet", expr)
	}
	return nil
}

// Firing returns the number of firing alerts of each name in names, read from
// /api/v1/alerts, and an error naming those with none.
func Firing(ctx context.Context, api promv1.API, names ...string) (map[string]int, error) {
	res, err := api.Alerts(ctx)
	if err != nil {
		return nil, err
	}
	n := map[string]int{}
	for _, a := range res.Alerts {
		if a.State == promv1.AlertStateFiring {
			n[string(a.Labels["alertname"])]++
		}
	}
	var missing []string
	for _, name := range names {
		if n[name] == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return n, fmt.Errorf("not firing: %v (firing: %v)", missing, n)
	}
	return n, nil
}
