// Package panelplot draws a dashboard's main panels from Prometheus range queries into a PNG with
// gonum/plot: a small stand-in for Grafana's own rendering (not available here), for the
// pictures in docs/dashboards. Apart from test/framework/monitoring so that the plinth binary does not
// link a plotting library.
package panelplot

import (
	"context"
	"fmt"
	"image/color"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/plinth-storage/plinth/test/framework/monitoring"
)

// MainPanels are the panels of each dashboard that RenderPNG draws (time series only), in a
// 2 × 2 grid.
var MainPanels = map[string][]string{
	"capacity.json":     {"Provisioned share of the provisionable room", "Available by failure domain", "Volumes by phase", "Provisioned to Block and Filesystem volumes"},
	"fleet-drift.json":  {"Drifted objects by kind", "Fencing rejections by reason", "Reconcile duration p50 / p99", "Agent heartbeat age"},
	"provisioning.json": {"CSI calls by method and code", "CreateVolume latency p50 / p90 / p99", "Publish / stage latency p99", "Agent operation latency p99"},
}

var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// RenderPNG draws d's MainPanels from Prometheus range queries over [start, end] (variables
// as vals, $__rate_interval as rateInterval) into file: a small stand-in for Grafana's own
// rendering, for the documentation. Legends follow the targets' legend formats; bytes are
// shown in MiB.
func RenderPNG(ctx context.Context, api promv1.API, d monitoring.Dashboard, vals map[string]string, start, end time.Time, step, rateInterval time.Duration, file string) error {
	titles := MainPanels[d.File]
	if len(titles) == 0 {
		return fmt.Errorf("%s: no main panels named", d.File)
	}
	var plots [][]*plot.Plot
	row := []*plot.Plot{}
	for _, title := range titles {
		p := plot.New()
		p.Title.Text = title
		p.X.Tick.Marker = plot.TimeTicks{Format: "15:04:05"}
		p.Legend.Top = true
		p.Legend.TextStyle.Font.Size = vg.Points(7)
		var lines []any
		n := 0
		for _, q := range d.Queries {
			if q.Panel != title {
				continue
			}
			if q.Instant {
				return fmt.Errorf("%s: panel %q is not a time series", d.File, title)
			}
			expr, err := monitoring.Substitute(q.Expr, vals, rateInterval)
			if err != nil {
				return err
			}
			s := end.Add(-end.Sub(start) / step * step)
			v, _, _, err := api.QueryRange(ctx, expr, promv1.Range{Start: s, End: end, Step: step})
			if err != nil {
				return fmt.Errorf("%s / %s: %w", d.File, title, err)
			}
			m, _ := v.(model.Matrix)
			sort.Slice(m, func(i, j int) bool { return m[i].Metric.String() < m[j].Metric.String() })
			scale, unit := 1.0, q.Unit
			if unit == "bytes" {
				scale, unit = 1.0/(1<<20), "MiB"
			}
			p.Y.Label.Text = unit
			for _, ser := range m {
				var xys plotter.XYs
				for _, sp := range ser.Values {
					f := float64(sp.Value)
					if f != f { // NaN: no data at that step (histogram_quantile of no calls)
						continue
					}
					xys = append(xys, plotter.XY{X: float64(sp.Timestamp.Unix()), Y: f * scale})
				}
				if len(xys) == 0 {
					continue
				}
				name := legendLabel.ReplaceAllStringFunc(q.Legend, func(s string) string {
					return string(ser.Metric[model.LabelName(legendLabel.FindStringSubmatch(s)[1])])
				})
				lines = append(lines, strings.TrimSpace(strings.TrimPrefix(name, string(ser.Metric["cluster"]))), xys)
				n++
			}
		}
		if n > 0 {
			if err := plotutil.AddLines(p, lines...); err != nil {
				return err
			}
		} else {
			p.Title.Text += " (no data)"
		}
		p.Add(plotter.NewGrid())
		p.BackgroundColor = color.White
		row = append(row, p)
		if len(row) == 2 {
			plots = append(plots, row)
			row = []*plot.Plot{}
		}
	}
	if len(row) > 0 {
		for len(row) < 2 {
			row = append(row, nil)
		}
		plots = append(plots, row)
	}
	img := vgimg.New(vg.Points(1100), vg.Points(float64(330*len(plots))))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	tiles := draw.Tiles{Rows: len(plots), Cols: 2, PadX: vg.Points(12), PadY: vg.Points(12), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	canvases := plot.Align(plots, tiles, dc)
	for j := range plots {
		for i := range plots[j] {
			if plots[j][i] != nil {
				plots[j][i].Draw(canvases[j][i])
			}
		}
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
