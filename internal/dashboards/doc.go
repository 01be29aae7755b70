// Package dashboards is Plinth's Grafana dashboards as typed Go, built with the Grafana
// Foundation SDK (github.com/grafana/grafana-foundation-sdk/go, Apache-2.0). `make generate`
// runs hack/dashboards, which writes All() as JSON into kustomize/monitoring/dashboards (the
// committed files the monitoring kustomization ships as ConfigMaps); `make verify-generate`
// fails when they differ from what this package builds.
//
// Every expression filters on cluster=~"$cluster" and keeps the cluster label in its
// aggregations, so one Grafana over a fleet's Prometheus (Thanos, Mimir, or federation, where
// each cluster's Prometheus sets external_labels: {cluster: <name>}) shows every cluster or one;
// with a single Prometheus and no cluster label the variable's "All" (.*) matches the empty label.
//
// Metrics per volume are not exported (cardinality): volume counts and bytes come by
// (pool, store, mode, phase), a set bounded by the Stores, not by the volumes. Per-PVC figures
// come from kubelet (kubelet_volume_stats_*), which Prometheus already scrapes per PVC.
package dashboards
