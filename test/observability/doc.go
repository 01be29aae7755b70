// Package observability proves Plinth's dashboards and alerts on real data: a real Prometheus
// (Debian's /usr/bin/prometheus, on loopback, in a temporary folder) scrapes a running Plinth
// — the controller, the agent (file backend on loop devices), the CSI controller and node
// plugins run as processes on the real control plane of test/framework/controlplane — with a scrape
// configuration generated from the shipped ServiceMonitor (kustomize/monitoring), and loads the
// shipped PrometheusRule. The test then runs every PromQL target of every dashboard panel
// (template variables substituted as Grafana would) and checks the expectation table, and
// waits for the drift, capacity, failed-volume, fencing, policy, reconcile-error and
// inaccessible-volume alerts to fire after the scenario made them true by hand. Last, it stops
// the agent and waits for PlinthAgentHeartbeatMissing: the wait is the shipped rule's own
// threshold (180 s, read from its expression), so this step costs about three minutes.
//
// The Prometheus side (scrape configuration, rules, panel evaluation and the expectation table,
// the PNG renderer) is test/framework/monitoring, shared with the real-node scenario of
// test/framework/devenv, which adds kubelets (kubelet_volume_stats_*) and plinth-scheduler.
package observability
