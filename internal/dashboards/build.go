package dashboards

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Kind is a Grafana panel type.
type Kind string

// The panel types the dashboards use.
const (
	TimeSeries Kind = "timeseries"
	Stat       Kind = "stat"
	Table      Kind = "table"
	BarGauge   Kind = "bargauge"
)

// Query is one PromQL target of a panel.
type Query struct {
	// Expr is the PromQL expression, with Grafana template variables ($cluster,
	// $pool, $store, $__rate_interval).
	Expr string
	// Legend is the legend format ("{{pool}}"); empty for tables.
	Legend string
}

// Panel is one panel: a title, a type, a size on Grafana's 24-column grid and its queries.
type Panel struct {
	Title, Description string
	Kind               Kind
	// Unit is Grafana's unit id: bytes, percentunit, s, short, reqps, d.
	Unit string
	// W, H are the width (of 24 columns) and height (rows of 30 px).
	W, H    uint32
	Queries []Query
}

// Row is a titled group of panels.
type Row struct {
	Title  string
	Panels []Panel
}

// Variable is a query template variable: label_values(Metric, Label), multi-valued with "All"
// (regex .*), so that every expression can use Label=~"$Name".
type Variable struct {
	Name, Label, Query string
}

// Spec is one dashboard: its file name under kustomize/monitoring/dashboards, uid, title,
// template variables (after the data source variable) and rows.
type Spec struct {
	File, UID, Title, Description string
	Tags                          []string
	Variables                     []Variable
	Rows                          []Row
}

// DatasourceVariable is the name of every dashboard's Prometheus data source variable; panels
// and targets refer to it as ${datasource}.
const DatasourceVariable = "datasource"

func dsRef() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${" + DatasourceVariable + "}")}
}

// Build turns s into a Grafana dashboard model with panel ids numbered from 1 in order.
func (s Spec) Build() (dashboard.Dashboard, error) {
	b := dashboard.NewDashboardBuilder(s.Title).
		Uid(s.UID).
		Description(s.Description).
		Tags(s.Tags).
		Editable().
		Refresh("1m").
		Time("now-6h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder(DatasourceVariable).Label("Data source").Type("prometheus"))
	for _, v := range s.Variables {
		b.WithVariable(dashboard.NewQueryVariableBuilder(v.Name).
			Label(v.Label).
			Datasource(dsRef()).
			Query(dashboard.StringOrMap{String: cog.ToPtr(v.Query)}).
			Definition(v.Query).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).
			IncludeAll(true).
			AllValue(".*"))
	}
	id := uint32(0)
	for _, r := range s.Rows {
		id++
		b.WithRow(dashboard.NewRowBuilder(r.Title).Id(id))
		for _, p := range r.Panels {
			id++
			pb, err := p.builder(id)
			if err != nil {
				return dashboard.Dashboard{}, fmt.Errorf("%s: panel %q: %w", s.File, p.Title, err)
			}
			b.WithPanel(pb)
		}
	}
	d, err := b.Build()
	if err != nil {
		return dashboard.Dashboard{}, fmt.Errorf("%s: %w", s.File, err)
	}
	return d, nil
}

// JSON is the dashboard as Grafana's JSON model, indented, with a final newline: the bytes
// committed under kustomize/monitoring/dashboards.
func (s Spec) JSON() ([]byte, error) {
	d, err := s.Build()
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.File, err)
	}
	return append(out, '\n'), nil
}

func (p Panel) targets() []cog.Builder[variants.Dataquery] {
	var out []cog.Builder[variants.Dataquery]
	for i, q := range p.Queries {
		t := prometheus.NewDataqueryBuilder().
			RefId(string(rune('A' + i))).
			Datasource(dsRef()).
			Expr(q.Expr)
		if q.Legend != "" {
			t.LegendFormat(q.Legend)
		}
		if p.Kind == Table || p.Kind == Stat || p.Kind == BarGauge {
			t.Instant()
			if p.Kind == Table {
				t.Format(prometheus.PromQueryFormatTable)
			}
		} else {
			t.Range()
		}
		out = append(out, t)
	}
	return out
}

func (p Panel) builder(id uint32) (cog.Builder[dashboard.Panel], error) {
	if len(p.Queries) == 0 {
		return nil, fmt.Errorf("no queries")
	}
	w, h := p.W, p.H
	if w == 0 {
		w = 12
	}
	if h == 0 {
		h = 8
	}
	unit := p.Unit
	if unit == "" {
		unit = "short"
	}
	switch p.Kind {
	case TimeSeries:
		return timeseries.NewPanelBuilder().Id(id).Title(p.Title).Description(p.Description).Datasource(dsRef()).
			Span(w).Height(h).Unit(unit).Targets(p.targets()).
			Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeTable).Placement(common.LegendPlacementBottom)), nil
	case Stat:
		return stat.NewPanelBuilder().Id(id).Title(p.Title).Description(p.Description).Datasource(dsRef()).
			Span(w).Height(h).Unit(unit).Targets(p.targets()), nil
	case Table:
		return table.NewPanelBuilder().Id(id).Title(p.Title).Description(p.Description).Datasource(dsRef()).
			Span(w).Height(h).Unit(unit).Targets(p.targets()), nil
	case BarGauge:
		return bargauge.NewPanelBuilder().Id(id).Title(p.Title).Description(p.Description).Datasource(dsRef()).
			Span(w).Height(h).Unit(unit).Targets(p.targets()), nil
	}
	return nil, fmt.Errorf("unknown panel kind %q", p.Kind)
}
