package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// PanelQuery is one PromQL target of a dashboard panel, as the dashboard JSON has it.
type PanelQuery struct {
	// Dashboard is the JSON file name, Panel the panel's title, Type its Grafana type.
	Dashboard, Panel, Type string
	RefID                  string
	Expr                   string
	// Instant is true for targets Grafana runs as instant queries (tables, stats, bar gauges);
	// the others are range queries over the dashboard's time range.
	Instant bool
	// Legend is the target's legend format ("{{pool}}"), Unit the panel's unit ("bytes").
	Legend, Unit string
}

// Variable is a dashboard's query template variable: label_values(Selector, Label).
type Variable struct {
	Dashboard, Name string
	Selector, Label string
	AllValue        string
}

// Dashboard is one dashboard JSON file's queries and variables.
type Dashboard struct {
	File      string
	Variables []Variable
	Queries   []PanelQuery
	// Panels are the titles of the non-row panels, in order.
	Panels []string
}

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// LoadDashboards reads every *.json dashboard in dir.
func LoadDashboards(dir string) ([]Dashboard, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no dashboards in %s", dir)
	}
	var out []Dashboard
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var doc struct {
			Templating struct {
				List []struct {
					Type, Name, Definition, AllValue string
				} `json:"list"`
			} `json:"templating"`
			Panels []json.RawMessage `json:"panels"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		d := Dashboard{File: filepath.Base(f)}
		for _, v := range doc.Templating.List {
			if v.Type != "query" {
				continue
			}
			m := labelValues.FindStringSubmatch(v.Definition)
			if m == nil {
				return nil, fmt.Errorf("%s: variable %s: %q is not label_values(selector, label)", d.File, v.Name, v.Definition)
			}
			d.Variables = append(d.Variables, Variable{Dashboard: d.File, Name: v.Name, Selector: m[1], Label: m[2], AllValue: v.AllValue})
		}
		if err := d.walk(doc.Panels); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (d *Dashboard) walk(panels []json.RawMessage) error {
	for _, raw := range panels {
		var p struct {
			Type, Title string
			Targets     []struct {
				RefID   string `json:"refId"`
				Expr    string `json:"expr"`
				Instant bool   `json:"instant"`
				Legend  string `json:"legendFormat"`
			} `json:"targets"`
			FieldConfig struct {
				Defaults struct {
					Unit string `json:"unit"`
				} `json:"defaults"`
			} `json:"fieldConfig"`
			Panels []json.RawMessage `json:"panels"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return fmt.Errorf("%s: %w", d.File, err)
		}
		if p.Type != "row" {
			d.Panels = append(d.Panels, p.Title)
			for _, t := range p.Targets {
				d.Queries = append(d.Queries, PanelQuery{Dashboard: d.File, Panel: p.Title, Type: p.Type, RefID: t.RefID, Expr: t.Expr, Instant: t.Instant,
					Legend: t.Legend, Unit: p.FieldConfig.Defaults.Unit})
			}
		}
		if err := d.walk(p.Panels); err != nil {
			return err
		}
	}
	return nil
}

var grafanaVar = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// Substitute replaces Grafana's variables in expr: $__rate_interval and $__interval by
// rateInterval, the others from values (a missing one is an error).
func Substitute(expr string, values map[string]string, rateInterval time.Duration) (string, error) {
	var missing []string
	out := grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		name := grafanaVar.FindStringSubmatch(v)[1]
		switch name {
		case "__rate_interval", "__interval", "__range":
			return model.Duration(rateInterval).String()
		}
		val, ok := values[name]
		if !ok {
			missing = append(missing, name)
		}
		return val
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("no value for variables %v in %q", missing, expr)
	}
	return out, nil
}

// Resolve evaluates the dashboard's variables in order against api as Grafana does with every
// value selected: label_values with the earlier variables substituted, then the values joined
// as a regex alternation (values are regex-quoted); a variable without values takes its
// "All" value.
func (d Dashboard) Resolve(ctx context.Context, api promv1.API, start, end time.Time) (map[string]string, error) {
	vals := map[string]string{}
	for _, v := range d.Variables {
		sel, err := Substitute(v.Selector, vals, time.Minute)
		if err != nil {
			return nil, fmt.Errorf("%s: variable %s: %w", d.File, v.Name, err)
		}
		got, _, _, err := api.LabelValues(ctx, v.Label, []string{sel}, start, end)
		if err != nil {
			return nil, fmt.Errorf("%s: variable %s: label_values(%s, %s): %w", d.File, v.Name, sel, v.Label, err)
		}
		var quoted []string
		for _, g := range got {
			if g != "" {
				// Grafana escapes regex characters of multi-value variables with a backslash,
				// itself escaped inside the PromQL string literal ("a\\.b").
				quoted = append(quoted, strings.ReplaceAll(regexp.QuoteMeta(string(g)), `\`, `\\`))
			}
		}
		sort.Strings(quoted)
		switch len(quoted) {
		case 0:
			vals[v.Name] = v.AllValue
		case 1:
			vals[v.Name] = quoted[0]
		default:
			vals[v.Name] = "(" + strings.Join(quoted, "|") + ")"
		}
	}
	return vals, nil
}

// Run runs q (already substituted as expr) as Grafana would: an instant query at end, or a range
// query from start to end every step. It returns the number of series in the result that
// Grafana would draw: a series whose every value is NaN (histogram_quantile of no increase
// in the window) shows as "No data" and is not counted.
func Run(ctx context.Context, api promv1.API, q PanelQuery, expr string, start, end time.Time, step time.Duration) (int, error) {
	var v model.Value
	var err error
	if q.Instant {
		v, _, _, err = api.Query(ctx, expr, end)
	} else {
		// The last evaluation falls on end, as Grafana aligns its steps to "now".
		start = end.Add(-end.Sub(start) / step * step)
		v, _, _, err = api.QueryRange(ctx, expr, promv1.Range{Start: start, End: end, Step: step})
	}
	if err != nil {
		return 0, err
	}
	n := 0
	switch r := v.(type) {
	case model.Vector:
		for _, s := range r {
			if !math.IsNaN(float64(s.Value)) {
				n++
			}
		}
		return n, nil
	case model.Matrix:
		for _, s := range r {
			for _, p := range s.Values {
				if !math.IsNaN(float64(p.Value)) {
					n++
					break
				}
			}
		}
		return n, nil
	case *model.Scalar, *model.String:
		return 1, nil
	}
	return 0, fmt.Errorf("unexpected result type %s", v.Type())
}
