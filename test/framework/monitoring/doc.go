// Package monitoring proves Plinth's dashboards and alerts against a real Prometheus (Debian's
// /usr/bin/prometheus): it generates scrape configurations from the shipped ServiceMonitor —
// static targets for processes on a control plane without kubelets (ScrapeConfig,
// test/observability), or Kubernetes service discovery through the API server for a cluster
// with real nodes (KubernetesScrapeConfig, test/framework/devenv) — starts Prometheus on loopback with
// the shipped rules (LiveRules), and evaluates every dashboard panel's PromQL with its template
// variables substituted against the per-panel expectation table (CheckPanels, Expectations),
// and reads firing alerts (Firing). Both environments use this package, so the table and the
// query semantics are one.
package monitoring
