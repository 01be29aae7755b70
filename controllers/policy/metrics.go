package policy

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/plinth-storage/plinth/internal/driftmetric"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// KindPolicySet is the kind label of metrics about a reconcile of the whole policy set.
const KindPolicySet = "PolicySet"

// Metrics of the policy controller (docs/design.md, "Metrics"), registered with
// controller-runtime's registry, served on the manager's metrics endpoint.
var (
	// ReconcileDuration is the duration of one reconcile of the policy set in seconds.
	ReconcileDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "plinth_policy_reconcile_duration_seconds",
		Help:    "Duration of a reconcile of the policy set, in seconds.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"kind"})
	// ReconcileErrors counts failed reconciles (kind PolicySet) and policy objects found
	// invalid (kind StoragePool, Protocol or Placement).
	ReconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "plinth_policy_reconcile_errors_total",
		Help: "Reconciles of the policy set that failed, and invalid policy objects seen, by kind.",
	}, []string{"kind"})
	// DriftObjects is the number of rendered objects that differ from policy, by source
	// ("api" here; the agents export "kernel") and kind of the drifted object.
	// Defined once for the controller and the agent (internal/driftmetric).
	DriftObjects = driftmetric.Objects
	// AppliedObjects is the number of objects in the inventory, by kind.
	AppliedObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "plinth_applied_objects",
		Help: "Objects Plinth applied and keeps (the inventory), by kind.",
	}, []string{"kind"})
	// PolicyCondition is 1 for the current status of each condition of each policy object and
	// 0 for its two other statuses (True, False, Unknown), as kube-state-metrics exports conditions.
	PolicyCondition = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "plinth_policy_condition",
		Help: "Conditions of policy objects: 1 for the current status of each type, 0 for the two other statuses (True, False, Unknown).",
	}, []string{"kind", "name", "type", "status"})
)

var registerOnce sync.Once

// RegisterMetrics registers the metrics with controller-runtime's registry once. A collector
// another package of the same binary registered first under the same name, labels and help
// (the agent's plinth_drift_objects{source="kernel"}) is adopted, not an error.
func RegisterMetrics() error {
	var err error
	registerOnce.Do(func() {
		for _, c := range []prometheus.Collector{ReconcileDuration, ReconcileErrors, AppliedObjects, PolicyCondition} {
			if e := metrics.Registry.Register(c); e != nil {
				err = errors.Join(err, e)
			}
		}
		// Every kind starts at 0: a counter series born at 1 has no increase() over its first
		// sample, so the first error after a start would be invisible to rate() and the alert.
		for _, k := range []string{KindPolicySet, "StoragePool", "Protocol", "Placement"} {
			ReconcileErrors.WithLabelValues(k)
		}
		if e := metrics.Registry.Register(DriftObjects); e != nil {
			var dup prometheus.AlreadyRegisteredError
			if !errors.As(e, &dup) {
				err = errors.Join(err, e)
			} else if g, ok := dup.ExistingCollector.(*prometheus.GaugeVec); ok {
				DriftObjects = g
			}
		}
	})
	return err
}

// HeartbeatCollector exports plinth_agent_heartbeat_age_seconds{node}: seconds since each
// Agent's status.lastHeartbeatTime, computed at scrape time from the informer cache. Agents
// that never reported are left out.
type HeartbeatCollector struct {
	Reader client.Reader
	Now    func() time.Time
}

var heartbeatDesc = prometheus.NewDesc("plinth_agent_heartbeat_age_seconds",
	"Seconds since the agent of a node last refreshed its Agent status.", []string{"node"}, nil)

// Describe implements prometheus.Collector.
func (c *HeartbeatCollector) Describe(ch chan<- *prometheus.Desc) { ch <- heartbeatDesc }

// Collect implements prometheus.Collector.
func (c *HeartbeatCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var agents storev1.AgentList
	if err := c.Reader.List(ctx, &agents); err != nil {
		ch <- prometheus.NewInvalidMetric(heartbeatDesc, err)
		return
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	for _, a := range agents.Items {
		if a.Status.LastHeartbeatTime == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(heartbeatDesc, prometheus.GaugeValue,
			now().Sub(a.Status.LastHeartbeatTime.Time).Seconds(), a.Spec.NodeName)
	}
}
