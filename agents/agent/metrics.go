package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/plinth-storage/plinth/agents/fencing"
	"github.com/plinth-storage/plinth/internal/driftmetric"
)

// Metrics of the agent (docs/design.md, "Metrics"); no per-volume labels.
var (
	// StoreCapacityBytes is plinth_store_capacity_bytes{store,pool,type}, type
	// one of total, allocatable, provisioned, available, snapshots (bytes; the
	// Store's status.capacity), and cache_total, cache_free, cache_provisioned for a
	// Store with an LVM cache (status.cache: the fast VG).
	StoreCapacityBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "plinth_store_capacity_bytes",
		Help: "Capacity of a Store in bytes, by type (total, allocatable, provisioned, available, snapshots; cache_total, cache_free, cache_provisioned with an LVM cache).",
	}, []string{"store", "pool", "type"})
	// StoreThinUsedRatio is plinth_store_thin_used_ratio{store,part}, part data
	// or metadata, 0..1.
	StoreThinUsedRatio = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "plinth_store_thin_used_ratio",
		Help: "Used share of a thin pool, 0..1, by part (data, metadata).",
	}, []string{"store", "part"})
	// OperationDuration is plinth_agent_operation_duration_seconds{op}.
	OperationDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "plinth_agent_operation_duration_seconds",
		Help:    "Duration of agent operations (create, expand, delete, export, unexport, refresh, ensure, move-copy) in seconds.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"op"})
	// BackendCommands is plinth_agent_backend_commands_total{backend}: external
	// commands run by a backend (lvm2 commands for lvm).
	BackendCommands = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "plinth_agent_backend_commands_total",
		Help: "External commands run by the storage backends.",
	}, []string{"backend"})
	// FencingRejections is plinth_agent_fencing_rejections_total{reason}.
	FencingRejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "plinth_agent_fencing_rejections_total",
		Help: "Work refused by the fencing marks, by reason.",
	}, []string{"reason"})
	// DriftObjects is plinth_drift_objects{source="kernel",kind}: drifted
	// things the agent sees on its node, by kind (LogicalVolume, Export,
	// VolumeGroup, ThinPool). Defined once for the agent and the controller
	// (internal/driftmetric).
	DriftObjects = driftmetric.Objects
	// StampWrites is plinth_agent_identity_stamp_writes_total: identity stamps written (a
	// new volume, a claim learnt, a resize, a new Store object); 0 on a pass where every
	// stamp is current.
	StampWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "plinth_agent_identity_stamp_writes_total",
		Help: "Identity stamps written onto backend volumes.",
	})
	// MoveBytes is plinth_volume_move_bytes_total: bytes the agent copied for moves
	// (spec.move) and verified on the target; a copy retried counts again only once verified.
	MoveBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "plinth_volume_move_bytes_total",
		Help: "Bytes copied and verified for volume moves.",
	})
)

func init() {
	metrics.Registry.MustRegister(StoreCapacityBytes, StoreThinUsedRatio, OperationDuration,
		BackendCommands, FencingRejections, DriftObjects, StampWrites, MoveBytes)
	// Every reason starts at 0: a series born at 1 has no increase() over its first sample,
	// so the first rejection after a start would never reach the PlinthFencingRejections alert.
	for _, r := range []string{fencing.ReasonStaleGeneration, fencing.ReasonStalePublicationGeneration,
		fencing.ReasonRetiredLifecycle, fencing.ReasonLifecycleConflict, fencing.ReasonCorruptMark} {
		FencingRejections.WithLabelValues(r)
	}
}
