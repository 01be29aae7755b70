package dashboards

import "strings"

// sel returns a selector body: the cluster filter plus the given matchers.
func sel(matchers ...string) string {
	return strings.Join(append([]string{`cluster=~"$cluster"`}, matchers...), ", ")
}

// capacity is plinth_store_capacity_bytes of one type, filtered by the dashboard's variables.
func capacity(typ string) string {
	return `plinth_store_capacity_bytes{` + sel(`type="`+typ+`"`, `pool=~"$pool"`, `store=~"$store"`) + `}`
}

// storeZone joins a Store's failure domain (plinth_store_info's zone, the node's
// topology.kubernetes.io/zone) onto a series that has a store label.
const storeZone = ` * on (cluster, store) group_left (zone) max by (cluster, store, zone) (plinth_store_info{` + `cluster=~"$cluster"` + `})`

// daysUntilFull divides the available bytes of a group by the rate at which the group's
// available bytes shrink (deriv per Store over 6 h, summed): days until 0 at that rate; a
// group that does not shrink shows the clamp (about 10^13 days, "never").
func daysUntilFull(by, join string) string {
	avail := `sum by (` + by + `) (` + capacity("available") + join + `)`
	rate := `sum by (` + by + `) (deriv(` + capacity("available") + `[6h])` + join + `)`
	return avail + ` / clamp_min(-(` + rate + `), 1e-9) / 86400`
}

// All returns every dashboard, in file name order.
func All() []Spec {
	return []Spec{Capacity(), FleetDrift(), Provisioning()}
}

var clusterVar = Variable{Name: "cluster", Label: "cluster", Query: `label_values(plinth_store_capacity_bytes, cluster)`}

// Capacity is the capacity dashboard: pools, Stores, failure domains, volumes and PVCs.
func Capacity() Spec {
	return Spec{
		File: "capacity.json", UID: "plinth-capacity", Title: "Plinth / Capacity", Tags: []string{"plinth", "storage"},
		Description: "Capacity of Plinth's pools and Stores (available = (physical − reserve) × overcommit − provisioned, the one figure every part of Plinth uses), when they fill up, volumes by phase and mode, and PVC use as kubelet reports it.",
		Variables: []Variable{
			clusterVar,
			{Name: "pool", Label: "pool", Query: `label_values(plinth_store_capacity_bytes{cluster=~"$cluster"}, pool)`},
			{Name: "store", Label: "store", Query: `label_values(plinth_store_capacity_bytes{cluster=~"$cluster", pool=~"$pool"}, store)`},
		},
		Rows: []Row{
			{Title: "Pools", Panels: []Panel{
				{Title: "Available by pool", Kind: BarGauge, Unit: "bytes", W: 8,
					Description: "Bytes new volumes may still take (the number CreateVolume and the scheduler use).",
					Queries:     []Query{{Expr: `sum by (cluster, pool) (` + capacity("available") + `)`, Legend: "{{cluster}} {{pool}}"}}},
				{Title: "Provisioned by pool", Kind: BarGauge, Unit: "bytes", W: 8,
					Queries: []Query{{Expr: `sum by (cluster, pool) (` + capacity("provisioned") + `)`, Legend: "{{cluster}} {{pool}}"}}},
				{Title: "Allocatable by pool", Kind: BarGauge, Unit: "bytes", W: 8,
					Description: "Physical capacity minus the pool's reserve.",
					Queries:     []Query{{Expr: `sum by (cluster, pool) (` + capacity("allocatable") + `)`, Legend: "{{cluster}} {{pool}}"}}},
				{Title: "Capacity of each Store", Kind: Table, Unit: "bytes", W: 24,
					Queries: []Query{{Expr: `max by (cluster, pool, store, type) (plinth_store_capacity_bytes{` + sel(`pool=~"$pool"`, `store=~"$store"`) + `})`}}},
				{Title: "Provisioned share of the provisionable room", Kind: TimeSeries, Unit: "percentunit",
					Queries: []Query{{Expr: `max by (cluster, pool, store) (` + capacity("provisioned") + `) / (max by (cluster, pool, store) (` + capacity("provisioned") + `) + max by (cluster, pool, store) (` + capacity("available") + `))`, Legend: "{{cluster}} {{store}}"}}},
				{Title: "Thin pool data used", Kind: TimeSeries, Unit: "percentunit", W: 6,
					Description: "LVM thin pools only: a full thin pool fails the writes of every volume in it.",
					Queries:     []Query{{Expr: `max by (cluster, store) (plinth_store_thin_used_ratio{` + sel(`part="data"`, `store=~"$store"`) + `})`, Legend: "{{cluster}} {{store}}"}}},
				{Title: "Thin pool metadata used", Kind: TimeSeries, Unit: "percentunit", W: 6,
					Queries: []Query{{Expr: `max by (cluster, store) (plinth_store_thin_used_ratio{` + sel(`part="metadata"`, `store=~"$store"`) + `})`, Legend: "{{cluster}} {{store}}"}}},
			}},
			{Title: "When pools fill up", Panels: []Panel{
				{Title: "Days until full, per Store (linear, last 6 h)", Kind: Table, Unit: "d", W: 8,
					Queries: []Query{{Expr: daysUntilFull("cluster, pool, store", "")}}},
				{Title: "Days until full, per pool", Kind: Table, Unit: "d", W: 8,
					Queries: []Query{{Expr: daysUntilFull("cluster, pool", "")}}},
				{Title: "Days until full, per failure domain", Kind: Table, Unit: "d", W: 8,
					Description: "Failure domain: the zone (topology.kubernetes.io/zone) of each Store's node, from plinth_store_info.",
					Queries:     []Query{{Expr: daysUntilFull("cluster, zone", storeZone)}}},
				{Title: "Available by failure domain", Kind: TimeSeries, Unit: "bytes",
					Queries: []Query{{Expr: `sum by (cluster, zone) (` + capacity("available") + storeZone + `)`, Legend: "{{cluster}} {{zone}}"}}},
				{Title: "Available in 7 days (predict_linear)", Kind: TimeSeries, Unit: "bytes",
					Description: "predict_linear over each Store's raw samples of the last 6 h (no subquery: it works from the second scrape on).",
					Queries:     []Query{{Expr: `max by (cluster, pool, store) (predict_linear(` + capacity("available") + `[6h], 7 * 86400))`, Legend: "{{cluster}} {{store}}"}}},
			}},
			{Title: "Volumes", Panels: []Panel{
				{Title: "Volumes by phase", Kind: TimeSeries, W: 8,
					Queries: []Query{{Expr: `sum by (cluster, pool, phase) (plinth_volumes{` + sel(`pool=~"$pool"`, `store=~"$store"`) + `})`, Legend: "{{cluster}} {{pool}} {{phase}}"}}},
				{Title: "Abnormal volumes", Kind: Stat, W: 4,
					Description: "Plinth volumes in phase Failed (the agent could not create or grow them: no room, backend error) plus staged volumes the node plugins find inaccessible now (device gone, mount dead: their health round, the answer kubelet puts in the pod's status.volumeHealth).",
					Queries:     []Query{{Expr: `(sum(plinth_volumes{` + sel(`phase="Failed"`, `pool=~"$pool"`, `store=~"$store"`) + `}) or vector(0)) + sum(plinth_csi_node_volumes_inaccessible{cluster=~"$cluster"})`}}},
				{Title: "Failed volumes by Store", Kind: Table, W: 12,
					Queries: []Query{{Expr: `sum by (cluster, pool, store) (plinth_volumes{` + sel(`phase="Failed"`, `pool=~"$pool"`, `store=~"$store"`) + `}) > 0`}}},
				{Title: "Provisioned to Block and Filesystem volumes", Kind: TimeSeries, Unit: "bytes",
					Description: "Sizes of Plinth's volumes by volume mode: kubelet reports no use for Block PVCs, Plinth reports what each mode holds per Store (no per-volume series).",
					Queries:     []Query{{Expr: `sum by (cluster, pool, store, mode) (plinth_volume_size_bytes{` + sel(`pool=~"$pool"`, `store=~"$store"`) + `})`, Legend: "{{cluster}} {{store}} {{mode}}"}}},
				{Title: "Thin pool data allocated", Kind: TimeSeries, Unit: "bytes",
					Description: "Bytes thin volumes really hold in the pool (data used × pool size), against what they were promised (provisioned).",
					Queries: []Query{
						{Expr: `max by (cluster, pool, store) (` + capacity("total") + `) * on (cluster, store) group_left max by (cluster, store) (plinth_store_thin_used_ratio{` + sel(`part="data"`, `store=~"$store"`) + `})`, Legend: "{{cluster}} {{store}} allocated"},
						{Expr: `max by (cluster, pool, store) (` + capacity("provisioned") + `) and on (cluster, store) max by (cluster, store) (plinth_store_thin_used_ratio{` + sel(`part="data"`, `store=~"$store"`) + `})`, Legend: "{{cluster}} {{store}} provisioned"},
					}},
			}},
			{Title: "PVCs (kubelet)", Panels: []Panel{
				{Title: "PVC used / capacity (kubelet)", Kind: Table, Unit: "percentunit", W: 24,
					Description: "Filesystem PVCs as kubelet measures them (kubelet_volume_stats_*, one series per PVC already). Block PVCs have no filesystem: see \"Provisioned to Block and Filesystem volumes\".",
					Queries: []Query{
						{Expr: `max by (cluster, namespace, persistentvolumeclaim) (kubelet_volume_stats_used_bytes{cluster=~"$cluster"}) / max by (cluster, namespace, persistentvolumeclaim) (kubelet_volume_stats_capacity_bytes{cluster=~"$cluster"} > 0)`},
						{Expr: `max by (cluster, namespace, persistentvolumeclaim) (kubelet_volume_stats_capacity_bytes{cluster=~"$cluster"})`},
					}},
			}},
		},
	}
}

// FleetDrift is the fleet dashboard: every cluster's drift, policy health, fencing and agents.
func FleetDrift() Spec {
	return Spec{
		File: "fleet-drift.json", UID: "plinth-fleet-drift", Title: "Plinth / Fleet drift", Tags: []string{"plinth", "storage"},
		Description: "Drift between Git, the API objects and the kernel, policy health, fencing and agent heartbeats, per cluster of the fleet.",
		Variables:   []Variable{clusterVar},
		Rows: []Row{
			{Title: "Fleet", Panels: []Panel{
				{Title: "Fleet overview by cluster", Kind: Table, W: 24,
					Description: "One row per cluster (Prometheus external label cluster): Stores, bytes available, drifted objects.",
					Queries: []Query{
						{Expr: `count by (cluster) (max by (cluster, store) (plinth_store_capacity_bytes{cluster=~"$cluster"}))`},
						{Expr: `sum by (cluster) (plinth_store_capacity_bytes{cluster=~"$cluster", type="available"})`},
						{Expr: `sum by (cluster) (plinth_drift_objects{cluster=~"$cluster"})`},
					}},
				{Title: "Drifted objects by kind", Kind: TimeSeries, W: 24,
					Queries: []Query{{Expr: `sum by (cluster, source, kind) (plinth_drift_objects{cluster=~"$cluster"})`, Legend: "{{cluster}} {{source}} {{kind}}"}}},
				{Title: "Drifted now (api)", Kind: Stat, W: 6, H: 4,
					Queries: []Query{{Expr: `sum(max by (cluster, kind) (plinth_drift_objects{cluster=~"$cluster", source="api"})) or vector(0)`}}},
				{Title: "Drifted now (kernel)", Kind: Stat, W: 6, H: 4,
					Queries: []Query{{Expr: `sum(plinth_drift_objects{cluster=~"$cluster", source="kernel"}) or vector(0)`}}},
				{Title: "Policies not Ready", Kind: Stat, W: 6, H: 4,
					Queries: []Query{{Expr: `count(max by (cluster, kind, name) (plinth_policy_condition{cluster=~"$cluster", type="Ready", status!="True"}) == 1) or vector(0)`}}},
				{Title: "Stalled policies", Kind: Stat, W: 6, H: 4,
					Queries: []Query{{Expr: `count(max by (cluster, kind, name) (plinth_policy_condition{cluster=~"$cluster", type="Stalled", status="True"}) == 1) or vector(0)`}}},
			}},
			{Title: "Policies and agents", Panels: []Panel{
				{Title: "Policy objects not Ready", Kind: Table,
					Queries: []Query{{Expr: `max by (cluster, kind, name, status) (plinth_policy_condition{cluster=~"$cluster", type="Ready", status!="True"}) == 1`}}},
				{Title: "Fencing rejections by reason", Kind: TimeSeries,
					Queries: []Query{{Expr: `sum by (cluster, reason) (increase(plinth_agent_fencing_rejections_total{cluster=~"$cluster"}[$__rate_interval]))`, Legend: "{{cluster}} {{reason}}"}}},
				{Title: "Reconcile errors by kind", Kind: TimeSeries,
					Queries: []Query{{Expr: `sum by (cluster, kind) (increase(plinth_policy_reconcile_errors_total{cluster=~"$cluster"}[$__rate_interval]))`, Legend: "{{cluster}} {{kind}}"}}},
				{Title: "Reconcile duration p50 / p99", Kind: TimeSeries, Unit: "s",
					Queries: []Query{
						{Expr: `histogram_quantile(0.5, sum by (cluster, le) (rate(plinth_policy_reconcile_duration_seconds_bucket{cluster=~"$cluster"}[$__rate_interval])))`, Legend: "{{cluster}} p50"},
						{Expr: `histogram_quantile(0.99, sum by (cluster, le) (rate(plinth_policy_reconcile_duration_seconds_bucket{cluster=~"$cluster"}[$__rate_interval])))`, Legend: "{{cluster}} p99"},
					}},
				{Title: "Agent heartbeat age", Kind: TimeSeries, Unit: "s", W: 24,
					Queries: []Query{{Expr: `max by (cluster, node) (plinth_agent_heartbeat_age_seconds{cluster=~"$cluster"})`, Legend: "{{cluster}} {{node}}"}}},
			}},
		},
	}
}

// csiRate is the per-second rate of CSI calls matching the given matchers.
func csiQuantile(q, by string, matchers ...string) string {
	return `histogram_quantile(` + q + `, sum by (` + by + `) (rate(plinth_csi_operation_duration_seconds_bucket{` + sel(matchers...) + `}[$__rate_interval])))`
}

// Provisioning is the provisioning dashboard: CSI and agent latencies, errors, NVMe-oF.
func Provisioning() Spec {
	return Spec{
		File: "provisioning.json", UID: "plinth-provisioning", Title: "Plinth / Provisioning", Tags: []string{"plinth", "storage"},
		Description: "CSI calls (latency, errors), agent operations and backend commands, NVMe-oF publications.",
		Variables:   []Variable{clusterVar},
		Rows: []Row{
			{Title: "CSI", Panels: []Panel{
				{Title: "CreateVolume latency p50 / p90 / p99", Kind: TimeSeries, Unit: "s",
					Queries: []Query{
						{Expr: csiQuantile("0.5", "cluster, le", `method="CreateVolume"`), Legend: "{{cluster}} p50"},
						{Expr: csiQuantile("0.9", "cluster, le", `method="CreateVolume"`), Legend: "{{cluster}} p90"},
						{Expr: csiQuantile("0.99", "cluster, le", `method="CreateVolume"`), Legend: "{{cluster}} p99"},
					}},
				{Title: "PVC → Bound (CreateVolume, successful), p50 / p99", Kind: TimeSeries, Unit: "s",
					Queries: []Query{
						{Expr: csiQuantile("0.5", "cluster, le", `method="CreateVolume"`, `code="OK"`), Legend: "{{cluster}} p50"},
						{Expr: csiQuantile("0.99", "cluster, le", `method="CreateVolume"`, `code="OK"`), Legend: "{{cluster}} p99"},
					}},
				{Title: "CSI calls by method and code", Kind: TimeSeries, Unit: "reqps",
					Queries: []Query{{Expr: `sum by (cluster, method, code) (rate(plinth_csi_operation_duration_seconds_count{cluster=~"$cluster"}[$__rate_interval]))`, Legend: "{{cluster}} {{method}} {{code}}"}}},
				{Title: "CSI errors by method and code", Kind: TimeSeries, Unit: "reqps",
					Queries: []Query{{Expr: `sum by (cluster, method, code) (rate(plinth_csi_operation_duration_seconds_count{` + sel(`code!="OK"`) + `}[$__rate_interval]))`, Legend: "{{cluster}} {{method}} {{code}}"}}},
				{Title: "Publish / stage latency p99", Kind: TimeSeries, Unit: "s",
					Queries: []Query{{Expr: csiQuantile("0.99", "cluster, le, method", `method=~"ControllerPublishVolume|NodeStageVolume|NodePublishVolume|ControllerExpandVolume|DeleteVolume"`), Legend: "{{cluster}} {{method}}"}}},
			}},
			{Title: "Agents", Panels: []Panel{
				{Title: "Agent operation latency p99", Kind: TimeSeries, Unit: "s",
					Queries: []Query{{Expr: `histogram_quantile(0.99, sum by (cluster, le, op) (rate(plinth_agent_operation_duration_seconds_bucket{cluster=~"$cluster"}[$__rate_interval])))`, Legend: "{{cluster}} {{op}}"}}},
				{Title: "Backend commands per second", Kind: TimeSeries, Unit: "reqps",
					Queries: []Query{{Expr: `sum by (cluster, backend) (rate(plinth_agent_backend_commands_total{cluster=~"$cluster"}[$__rate_interval]))`, Legend: "{{cluster}} {{backend}}"}}},
			}},
			{Title: "NVMe-oF", Panels: []Panel{
				{Title: "NVMe-oF hosts per target", Kind: Table,
					Description: "Volumes each storage node (target) exports to each host node: the publications of NVMe-oF VolumeStates, which the agent turns into the nvmet subsystem's allowed hosts.",
					Queries:     []Query{{Expr: `sum by (cluster, target_node, host_node) (plinth_nvmeof_publications{cluster=~"$cluster"})`}}},
				{Title: "NVMe-oF exported volumes per target", Kind: TimeSeries,
					Queries: []Query{{Expr: `sum by (cluster, target_node) (plinth_nvmeof_publications{cluster=~"$cluster"})`, Legend: "{{cluster}} {{target_node}}"}}},
			}},
		},
	}
}
