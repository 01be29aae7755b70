package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/stage"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// ReasonMountDead is the VolumeHealth reason of a mount whose probe returns EIO, ENOTCONN,
// ESTALE or similar (the backing path died under the mount).
const ReasonMountDead = "MountDead"

// ReasonDeviceGone is the VolumeHealth reason of a staged volume whose block device vanished.
const ReasonDeviceGone = "DeviceGone"

// NodeGetVolumeHealth reports INACCESSIBLE when the staging or publish mount is dead or the
// staged device is gone; no entries mean healthy (CSI v1.13 NodeGetVolumeHealth, which
// replaced the VolumeCondition of NodeGetVolumeStats).
func (s *Service) NodeGetVolumeHealth(ctx context.Context, req *csipb.NodeGetVolumeHealthRequest) (*csipb.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	rec, err := s.stages.Load(id)
	if err != nil && !errors.Is(err, stage.ErrNotFound) {
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}
	staged := err == nil
	if !staged && req.GetVolumePublishPath() == "" && req.GetStagingTargetPath() == "" {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s is not staged on this node", id)
	}
	var r *stage.Record
	if staged {
		r = &rec
	}
	h := &csipb.VolumeHealth{VolumeId: id, HealthStatuses: s.volumeHealth(r, req.GetStagingTargetPath(), req.GetVolumePublishPath())}
	return &csipb.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// NodeGetStorageHealth reports the storage this node reaches through its staged volumes
// (stage records), checked now as NodeGetVolumeHealth checks one: for each reason found
// (DeviceGone: an NVMe-oF namespace or local device vanished; MountDead), one
// STORAGE_DEGRADED entry naming how many and which volumes; no entries when every staged
// volume is accessible or none is staged. A stage record that cannot be read is INTERNAL.
func (s *Service) NodeGetStorageHealth(context.Context, *csipb.NodeGetStorageHealthRequest) (*csipb.NodeGetStorageHealthResponse, error) {
	recs, err := s.stages.List()
	if err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "stage records: %v", err)
	}
	byReason := map[string][]string{}
	var reasons []string
	for i := range recs {
		rec := &recs[i]
		problems := s.volumeHealth(rec, append([]string{rec.StagingPath}, rec.Targets...)...)
		if len(problems) == 0 {
			continue
		}
		r := problems[0].GetReason()
		if byReason[r] == nil {
			reasons = append(reasons, r)
		}
		byReason[r] = append(byReason[r], rec.VolumeID)
	}
	slices.Sort(reasons)
	resp := &csipb.NodeGetStorageHealthResponse{}
	for _, r := range reasons {
		ids := byReason[r]
		slices.Sort(ids)
		resp.BackendHealth = append(resp.BackendHealth, &csipb.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status: csipb.StorageHealthErrorType_STORAGE_DEGRADED, Reason: r,
			Message: fmt.Sprintf("%d staged volume(s) on node %s inaccessible: %s", len(ids), s.nodeName, strings.Join(ids, ", ")),
		})
	}
	return resp, nil
}

// The node plugin watches the volumes it staged, so that a failure nobody asks about is still
// reported: an NVMe-oF link cut for longer than ctrlLossTmo makes the kernel remove the
// controller, the device vanishes and every I/O fails with EIO while the pod keeps its mount.
// NodeGetVolumeHealth answers kubelet when it asks; the monitor reports each failure once,
// when it starts, as a Warning event on the VolumeState (reason DeviceGone or MountDead) and in
// the metrics below; the gauge goes back to 0 once it is healthy again (after unstage + stage).

// The node plugin reads the VolumeState of a failed volume for its event.
//
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumestates,verbs=get

// DefaultVolumeHealthInterval is the period of the node plugin's check of its staged volumes.
const DefaultVolumeHealthInterval = 30 * time.Second

// Metrics are the node plugin's volume health series; no per-volume label.
type Metrics struct {
	// Inaccessible is plinth_csi_node_volumes_inaccessible{reason}: staged volumes of this
	// node that are inaccessible now, by reason (DeviceGone, MountDead).
	Inaccessible *prometheus.GaugeVec
	// Failures is plinth_csi_node_volume_failures_total{reason}: staged volumes that became
	// inaccessible, counted once per failure.
	Failures *prometheus.CounterVec
}

// NewMetrics returns the volume health series, every reason at 0.
func NewMetrics() Metrics {
	m := Metrics{
		Inaccessible: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plinth_csi_node_volumes_inaccessible",
			Help: "Staged volumes of this node that are inaccessible now (device gone, mount dead), by reason.",
		}, []string{"reason"}),
		Failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plinth_csi_node_volume_failures_total",
			Help: "Staged volumes of this node that became inaccessible (device gone, mount dead), by reason.",
		}, []string{"reason"}),
	}
	// every reason exists from the start at 0, so that increase() sees the first failure
	for _, r := range []string{ReasonDeviceGone, ReasonMountDead} {
		m.Inaccessible.WithLabelValues(r)
		m.Failures.WithLabelValues(r)
	}
	return m
}

// volumeHealth checks a staged volume: its recorded device exists (a record with no device yet,
// a stage in progress, has none to check), and the mounts at the given paths (empty ones
// skipped) are not dead (EIO, ENOTCONN, ESTALE). It returns the problems found, none when
// healthy.
func (s *Service) volumeHealth(rec *stage.Record, paths ...string) []*csipb.VolumeHealth_VolumeHealthEntry {
	var out []*csipb.VolumeHealth_VolumeHealthEntry
	add := func(reason, msg string) {
		out = append(out, &csipb.VolumeHealth_VolumeHealthEntry{Status: csipb.VolumeHealthErrorType_INACCESSIBLE, Reason: reason, Message: msg})
	}
	// A record without a device is a stage in progress: NodeStageVolume saves it before the
	// NVMe-oF connect (so that a crash meanwhile still lets unstage disconnect) and fills the
	// device in once the namespace appears. Nothing is missing yet.
	if rec != nil && rec.Device != "" {
		if _, err := os.Stat(rec.Device); err != nil {
			add(ReasonDeviceGone, fmt.Sprintf("device %s: %v", rec.Device, err))
		}
	}
	for _, p := range paths {
		if p == "" {
			continue
		}
		if err := s.mounter.Probe(p); err != nil && mount.IsCorrupted(err) {
			add(ReasonMountDead, fmt.Sprintf("%s: %v", p, err))
			break
		}
	}
	return out
}

// volumeMonitor remembers, per staged volume, the reason it was last reported inaccessible.
type volumeMonitor struct {
	mu       sync.Mutex
	reported map[string]string // volume id → reason, "" when healthy
}

// CheckVolumes checks every staged volume once (stage records), sets the gauge, and reports each
// volume that became inaccessible (counter, Warning event, log) once per failure.
func (s *Service) CheckVolumes(ctx context.Context) {
	recs, err := s.stages.List()
	if err != nil {
		s.log.Error(err, "volume health: read stage records")
		return
	}
	s.monitor.mu.Lock()
	defer s.monitor.mu.Unlock()
	if s.monitor.reported == nil {
		s.monitor.reported = map[string]string{}
	}
	counts := map[string]float64{ReasonDeviceGone: 0, ReasonMountDead: 0}
	seen := map[string]bool{}
	for i := range recs {
		rec := &recs[i]
		seen[rec.VolumeID] = true
		problems := s.volumeHealth(rec, append([]string{rec.StagingPath}, rec.Targets...)...)
		reason, msg := "", ""
		if len(problems) > 0 {
			reason, msg = problems[0].GetReason(), problems[0].GetMessage()
			counts[reason]++
		}
		prev := s.monitor.reported[rec.VolumeID]
		s.monitor.reported[rec.VolumeID] = reason
		if reason != "" && reason != prev {
			s.metrics.Failures.WithLabelValues(reason).Inc()
			s.log.Error(errors.New(msg), "staged volume inaccessible", "volume", rec.VolumeID, "reason", reason, "node", s.nodeName)
			s.volumeEvent(ctx, rec.VolumeID, "Warning", reason, fmt.Sprintf("volume staged on node %s at %s is inaccessible: %s; "+
				"unstage and stage it again once the target is reachable (see docs/operations.md)", s.nodeName, rec.StagingPath, msg))
		}
	}
	for id := range s.monitor.reported {
		if !seen[id] {
			delete(s.monitor.reported, id)
		}
	}
	for r, n := range counts {
		s.metrics.Inaccessible.WithLabelValues(r).Set(n)
	}
}

// volumeEvent records an event on the VolumeState of volume id (read for its UID, so that
// kubectl describe lists it); dropped when there is no API access or no such VolumeState.
func (s *Service) volumeEvent(ctx context.Context, id, typ, reason, msg string) {
	if s.events == nil || s.kube == nil {
		return
	}
	vs := &storev1.VolumeState{}
	if err := s.kube.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil {
		if !apierrors.IsNotFound(err) {
			s.log.Error(err, "volume health: read VolumeState for the event", "volume", id)
		}
		return
	}
	s.events.Eventf(vs, nil, typ, reason, "VolumeHealth", "%s", msg)
}
