package monitoring

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
)

// Environment names where the panels are evaluated; what the scenario of each guarantees
// differs (Expect).
type Environment int

const (
	// Host is test/observability: Plinth as processes on a control plane without kubelets,
	// one storage node, a Filesystem and a Block volume staged through the CSI sockets.
	Host Environment = iota
	// RealNodes is the real-node scenario of test/framework/devenv (`plinth-dev`, test/e2e): three
	// kubelets, Plinth deployed as pods, a pod writing to its PVC.
	RealNodes
)

func (e Environment) String() string {
	if e == Host {
		return "host"
	}
	return "real nodes"
}

// Expect says whether a panel has data once a scenario ran, and why not when it has none.
type Expect struct {
	Data bool
	Why  string
	// FallbackWhy says, by metric name, why a metric a panel reads behind `X or vector(0)` may
	// have no series in this scenario (the panel then draws the fallback's 0). Every other
	// selector in such an X of a panel with Data must return series: the fallback stands for
	// "none of these counted now", never for a metric that is missing altogether.
	FallbackWhy map[string]string
}

// excused returns why the selector sel may have no series, or "" when it must have some.
func (e Expect) excused(sel string) string {
	for metric, why := range e.FallbackWhy {
		if strings.HasPrefix(sel, metric+"{") {
			return why
		}
	}
	return ""
}

// PanelExpect is one panel's expectation in each Environment.
type PanelExpect struct {
	Host, RealNodes Expect
}

// In returns the expectation in env.
func (p PanelExpect) In(env Environment) Expect {
	if env == Host {
		return p.Host
	}
	return p.RealNodes
}

func has() Expect               { return Expect{Data: true} }
func empty(why string) Expect   { return Expect{Why: why} }
func both(e Expect) PanelExpect { return PanelExpect{Host: e, RealNodes: e} }

const (
	whyThin = "LVM thin pools only; both environments run the file backend (the thin series are proven in the kernel guest's agent suite)"
	whyNVMe = "NVMe-oF needs nvmet and nvme-tcp, which run in the kernel guest; these environments serve local volumes only"
)

// Expectations is every panel of every dashboard, by file and title: data means every target of
// the panel returns at least one series. The panels legitimately empty say why.
var Expectations = map[string]map[string]PanelExpect{
	"capacity.json": {
		"Available by pool":                             both(has()),
		"Provisioned by pool":                           both(has()),
		"Allocatable by pool":                           both(has()),
		"Capacity of each Store":                        both(has()),
		"Provisioned share of the provisionable room":   both(has()),
		"Thin pool data used":                           both(empty(whyThin)),
		"Thin pool metadata used":                       both(empty(whyThin)),
		"Days until full, per Store (linear, last 6 h)": both(has()),
		"Days until full, per pool":                     both(has()),
		"Days until full, per failure domain":           both(has()),
		"Available by failure domain":                   both(has()),
		"Available in 7 days (predict_linear)":          both(has()),
		"Volumes by phase":                              both(has()),
		"Abnormal volumes":                              both(has()),
		"Failed volumes by Store":                       both(has()),
		"Provisioned to Block and Filesystem volumes":   both(has()),
		"Thin pool data allocated":                      both(empty(whyThin)),
		"PVC used / capacity (kubelet)": {
			Host:      empty("kubelet_volume_stats_* come from kubelets; none runs in this harness"),
			RealNodes: has(),
		},
	},
	"fleet-drift.json": {
		"Fleet overview by cluster": both(has()),
		"Drifted objects by kind":   both(has()),
		"Drifted now (api)":         both(has()),
		"Drifted now (kernel)":      both(has()),
		"Policies not Ready":        both(has()),
		"Stalled policies":          both(has()),
		"Policy objects not Ready": {
			Host:      has(),
			RealNodes: empty("an instant query of the objects not Ready now: the scenario's invalid commit was reverted before the panels are read (its Stalled state is asserted in its own step)"),
		},
		"Fencing rejections by reason": both(has()),
		"Reconcile errors by kind":     both(has()),
		"Reconcile duration p50 / p99": both(has()),
		"Agent heartbeat age":          both(has()),
	},
	"provisioning.json": {
		"CreateVolume latency p50 / p90 / p99":              both(has()),
		"PVC → Bound (CreateVolume, successful), p50 / p99": both(has()),
		"CSI calls by method and code":                      both(has()),
		"CSI errors by method and code":                     both(has()),
		"Publish / stage latency p99":                       both(has()),
		"Agent operation latency p99":                       both(has()),
		"Backend commands per second":                       both(empty("the file backend runs no external commands (loop devices through ioctls); lvm and zfs count theirs in the kernel guest")),
		"NVMe-oF hosts per target":                          both(empty(whyNVMe)),
		"NVMe-oF exported volumes per target":               both(empty(whyNVMe)),
	},
}

// PanelReport is what CheckPanels found.
type PanelReport struct {
	Dashboards, Queries int
	// WithData and Empty count panels (not queries) by their expectation.
	WithData, Empty int
	// Fallbacks counts the selectors behind `or vector(0)` checked for series of their own.
	Fallbacks int
	// Variables are the resolved template variables, by dashboard file.
	Variables map[string]map[string]string
}

func (r PanelReport) String() string {
	return fmt.Sprintf("%d dashboards, %d queries: %d panels with data, %d legitimately empty; %d selectors behind `or vector(0)` with series", r.Dashboards, r.Queries, r.WithData, r.Empty, r.Fallbacks)
}

// CheckPanels runs every PromQL target of every dashboard in dir against api as Grafana would
// (variables resolved over [start, end] and substituted, $__rate_interval as rateInterval;
// range queries every step) and compares each with Expectations in env. It returns one error
// per mismatch: a dashboard or panel missing from the table (or the reverse), a query error,
// no data where the scenario guarantees some, data where the table says empty.
func CheckPanels(ctx context.Context, api promv1.API, dir string, env Environment, start, end time.Time, rateInterval, step time.Duration) (PanelReport, []Dashboard, error) {
	rep := PanelReport{Variables: map[string]map[string]string{}}
	ds, err := LoadDashboards(dir)
	if err != nil {
		return rep, nil, err
	}
	rep.Dashboards = len(ds)
	var errs []error
	for _, d := range ds {
		exp, ok := Expectations[d.File]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: no expectation table", d.File))
			continue
		}
		for _, title := range d.Panels {
			if _, ok := exp[title]; !ok {
				errs = append(errs, fmt.Errorf("%s: panel %q has no expectation", d.File, title))
			}
		}
		for title := range exp {
			if !containsString(d.Panels, title) {
				errs = append(errs, fmt.Errorf("%s: expectation for panel %q, which the dashboard does not have", d.File, title))
			}
		}
		vals, err := d.Resolve(ctx, api, start, end)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Variables[d.File] = vals
		seen := map[string]bool{}
		for _, q := range d.Queries {
			rep.Queries++
			e := exp[q.Panel].In(env)
			expr, err := Substitute(q.Expr, vals, rateInterval)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s / %s / %s: %w", d.File, q.Panel, q.RefID, err))
				continue
			}
			n, err := Run(ctx, api, q, expr, start, end, step)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("%s / %s / %s: query error: %w\n%s", d.File, q.Panel, q.RefID, err, expr))
			case n == 0 && e.Data:
				errs = append(errs, fmt.Errorf("%s / %s / %s: no data, the %s scenario guarantees some\n%s", d.File, q.Panel, q.RefID, env, expr))
			case n > 0 && !e.Data:
				errs = append(errs, fmt.Errorf("%s / %s / %s: %d series where the table says empty on %s (%s): update the table\n%s", d.File, q.Panel, q.RefID, n, env, e.Why, expr))
			}
			if e.Data {
				for _, operand := range FallbackOperands(expr) {
					for _, sel := range Selectors(operand) {
						if e.excused(sel) != "" {
							continue
						}
						rep.Fallbacks++
						n, err := Run(ctx, api, q, sel, start, end, step)
						switch {
						case err != nil:
							errs = append(errs, fmt.Errorf("%s / %s / %s: query error in a selector behind `or vector(0)`: %w\n%s", d.File, q.Panel, q.RefID, err, sel))
						case n == 0:
							errs = append(errs, fmt.Errorf("%s / %s / %s: no series of %s on %s: the panel's `or vector(0)` draws 0 for a metric that is missing", d.File, q.Panel, q.RefID, sel, env))
						}
					}
				}
			}
			if !seen[q.Panel] {
				seen[q.Panel] = true
				if e.Data {
					rep.WithData++
				} else {
					rep.Empty++
				}
			}
		}
	}
	return rep, ds, errors.Join(errs...)
}

func containsString(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// fallback is the PromQL idiom that makes a panel draw 0 instead of "No data".
const fallback = " or vector(0)"

// FallbackOperands returns the left operand X of every `X or vector(0)` in expr, in order: the
// text back to the unmatched "(" that opens the operand's group, or to the start of expr. It
// reads the text as written by internal/dashboards (one space each side of `or`), not PromQL in
// general.
func FallbackOperands(expr string) []string {
	var out []string
	for i := 0; ; {
		j := strings.Index(expr[i:], fallback)
		if j < 0 {
			return out
		}
		end := i + j
		start, depth := 0, 0
		for k := end - 1; k >= 0; k-- {
			if expr[k] == ')' {
				depth++
			} else if expr[k] == '(' {
				if depth == 0 {
					start = k + 1
					break
				}
				depth--
			}
		}
		out = append(out, strings.TrimSpace(expr[start:end]))
		i = end + len(fallback)
	}
}

// selectorRe matches a PromQL instant-vector selector with label matchers as internal/dashboards
// writes them: a metric name directly followed by {...} (no nested braces in label values).
var selectorRe = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\{[^{}]*\}`)

// clusterRe matches the cluster matcher every dashboard query carries.
var clusterRe = regexp.MustCompile(`cluster=~?"[^"]*"`)

// Selectors returns, for each selector (metric{matchers}) in expr in order, the metric's name
// with only the cluster matcher kept: whether the metric is exported at all, since other
// labels may legitimately have no series now (a Stalled condition exists only while an object
// is stalled).
func Selectors(expr string) []string {
	var out []string
	for _, sel := range selectorRe.FindAllString(expr, -1) {
		name := sel[:strings.IndexByte(sel, '{')]
		out = append(out, name+"{"+clusterRe.FindString(sel)+"}")
	}
	return out
}
