package devenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/plinth-storage/plinth/test/framework/monitoring"
)

// Monitoring files of the checkout that `plinth-dev` runs Prometheus with.
const (
	// ServiceMonitorFile is the shipped ServiceMonitor the scrape configuration is generated from.
	ServiceMonitorFile = "kustomize/monitoring/servicemonitor.yaml"
	// PrometheusRuleFile is the shipped PrometheusRule Prometheus evaluates (every "for"
	// removed, range windows cut to AlertWindow).
	PrometheusRuleFile = "kustomize/monitoring/prometheusrule.yaml"
	// DashboardsDir holds the generated dashboards whose panels the scenario evaluates.
	DashboardsDir = "kustomize/monitoring/dashboards"
	// ClusterLabel is the cluster label of every series (the fleet dashboards' variable).
	ClusterLabel = "plinth-dev"
	// ScrapeInterval is every job's scrape and the rules' evaluation interval.
	ScrapeInterval = 3 * time.Second
	// AlertWindow caps the rules' range windows (monitoring.LiveRulesWindow): an alert made by a
	// fault the scenario injects and undoes (the fencing refusal: an increase over [15m])
	// resolves within it, before dev up hands over; long enough for the alert step to read
	// every alert firing at once.
	AlertWindow = 3 * time.Minute
)

// schedulerComponent is plinth-scheduler's app.kubernetes.io/component label.
const schedulerComponent = "scheduler"

// startPrometheus runs Debian's Prometheus on loopback with a scrape configuration generated
// from the shipped ServiceMonitor (monitoring.KubernetesScrapeConfig: targets discovered through
// the API server, served by a monitoring.Discovery on loopback), the kubelets through the API
// server's node proxy and plinth-scheduler, with the shipped rules; and waits until every
// target is up: the controller, each node's agent and CSI node plugin, the CSI controller,
// plinth-scheduler and each kubelet.
func (e *Env) startPrometheus(ctx context.Context) (string, error) {
	if _, err := os.Stat(monitoring.PrometheusBinary); err != nil {
		return "", fmt.Errorf("%s (apt-get install prometheus): %w", monitoring.PrometheusBinary, err)
	}
	dir := filepath.Join(e.Dir, "prometheus")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	// The admin's client certificate: the API server's node proxy and kube-scheduler's
	// delegated authorisation both accept it (system:masters).
	cfg := e.CP.Admin.Config
	files := map[string][]byte{"ca.crt": cfg.CAData, "admin.crt": cfg.CertData, "admin.key": cfg.KeyData}
	for name, data := range files {
		if len(data) == 0 {
			return "", fmt.Errorf("admin credentials: no %s", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return "", err
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	e.discovery = &http.Server{Handler: monitoring.Discovery{Client: e.CS}, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = e.discovery.Serve(ln) }()
	u, err := url.Parse(e.CP.URL)
	if err != nil {
		return "", err
	}
	rules, err := monitoring.LiveRulesWindow(filepath.Join(e.Root, PrometheusRuleFile), AlertWindow)
	if err != nil {
		return "", err
	}
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, rules, 0o644); err != nil {
		return "", err
	}
	scrape, err := monitoring.KubernetesScrapeConfig(filepath.Join(e.Root, ServiceMonitorFile), monitoring.Cluster{
		Discovery: "http://" + ln.Addr().String(), Refresh: 2 * time.Second, APIServer: u.Host,
		CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "admin.crt"), KeyFile: filepath.Join(dir, "admin.key"),
		SchedulerComponent: schedulerComponent, Labels: map[string]string{"cluster": ClusterLabel},
	}, ScrapeInterval, rulesFile)
	if err != nil {
		return "", err
	}
	prom, err := monitoring.StartPrometheus(ctx, e.startHost, monitoring.PrometheusBinary, dir, scrape)
	if err != nil {
		return "", err
	}
	e.Prom = prom
	sm, err := monitoring.ReadServiceMonitor(filepath.Join(e.Root, ServiceMonitorFile))
	if err != nil {
		return "", err
	}
	n := len(e.Nodes.Nodes)
	// controller + CSI controller (one replica each in the dev overlay), an agent and a CSI
	// node plugin per node; the jobs are the Services' names (the Prometheus Operator's job).
	want := map[string]int{"plinth-controller-metrics": 1, "plinth-csi-controller-metrics": 1, "plinth-agent-metrics": n,
		"plinth-csi-node-metrics": n, monitoring.JobKubelet: n, monitoring.JobScheduler: 1}
	if err := poll(ctx, 2*time.Minute, func() error { return monitoring.TargetsUp(ctx, prom.API, want) }); err != nil {
		return "", fmt.Errorf("Prometheus %s: %w", prom.URL, err)
	}
	total := 0
	for _, c := range want {
		total += c
	}
	return fmt.Sprintf("Prometheus %s (pid %d): %d targets up every %s — job %s from %s (%v), kubelets through the API server's node proxy, plinth-scheduler's /metrics; rules of %s (for: removed, windows cut to %s)",
		prom.URL, prom.Proc.PID(), total, ScrapeInterval, monitoring.ServiceMonitorJob(sm), ServiceMonitorFile, want, PrometheusRuleFile, AlertWindow), nil
}

// stopDiscovery ends the HTTP discovery server.
func (e *Env) stopDiscovery() error {
	if e.discovery == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.discovery.Shutdown(ctx)
	e.discovery = nil
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
