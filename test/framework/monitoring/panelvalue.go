package monitoring

import (
	"context"
	"fmt"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// PanelValue runs, now, the single query of the panel titled title in the dashboard file of
// dir as Grafana runs a stat panel: its variables resolved over [start, now] (Dashboard.Resolve)
// and substituted. It returns the one sample's value. Errors: no such dashboard or panel, a
// panel of more than one query, a query error, or a result that is not exactly one sample.
func PanelValue(ctx context.Context, api promv1.API, dir, file, title string, start time.Time) (float64, error) {
	ds, err := LoadDashboards(dir)
	if err != nil {
		return 0, err
	}
	for _, d := range ds {
		if d.File != file {
			continue
		}
		now := time.Now()
		vals, err := d.Resolve(ctx, api, start, now)
		if err != nil {
			return 0, err
		}
		var qs []PanelQuery
		for _, q := range d.Queries {
			if q.Panel == title {
				qs = append(qs, q)
			}
		}
		if len(qs) != 1 {
			return 0, fmt.Errorf("%s: panel %q has %d queries, want 1", file, title, len(qs))
		}
		expr, err := Substitute(qs[0].Expr, vals, time.Minute)
		if err != nil {
			return 0, err
		}
		v, _, _, err := api.Query(ctx, expr, now)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", expr, err)
		}
		vec, ok := v.(model.Vector)
		if !ok || len(vec) != 1 {
			return 0, fmt.Errorf("%s / %s: %v, want one sample\n%s", file, title, v, expr)
		}
		return float64(vec[0].Value), nil
	}
	return 0, fmt.Errorf("no dashboard %s in %s", file, dir)
}
