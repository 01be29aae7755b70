// Package controller is the CSI Controller service of csi.plinth.dev: it talks only to the API
// server — it writes VolumeState and VolumeSnapshotState objects through the volume layer
// (csi/internal/volume) and waits, on the layer's informer subscription, until the node agent
// has filled in their status. One file per concern: create.go (CreateVolume, store choice),
// spread.go (spreadAcross of NVMe-oF volumes),
// source.go (restores and clones), delete.go, publish.go, expand.go, list.go (validate, list,
// capacity), health.go (controller volume health), snapshot.go, overrides.go (PVC overrides),
// sizes.go (capacity rounding), modify.go (ControllerModifyVolume: VolumeAttributesClass tiers).
package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The controller service's API access (kustomize/rbac/csi_controller.yaml grants this and what
// the sidecars need): VolumeStates created by CreateVolume, updated by the publication and
// expansion compare-and-swap, deleted by DeleteVolume, watched by the volume layer; the
// informers the driver starts on Stores, the policy kinds and Nodes; Nodes read by
// ControllerPublishVolume.
//
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumestates;volumesnapshotstates,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=stores,verbs=get;list;watch
// +kubebuilder:rbac:groups=policy.plinth.dev,resources=storagepools;protocols;placements,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Config is what the controller service works with; the driver builds it once its API
// clients and informers run.
type Config struct {
	// Kube reads through the informer cache and writes to the API server.
	Kube client.Client
	// Live reads the API server directly, where freshness matters.
	Live client.Reader
	// Volumes and Snapshots are the volume layer's access to VolumeStates and
	// VolumeSnapshotStates (sharing one set of locks).
	Volumes   *volume.Kind[*storev1.VolumeState]
	Snapshots *volume.Kind[*storev1.VolumeSnapshotState]
	// Events records the Warning events; nil drops them.
	Events events.EventRecorder
	// Log receives what the service reports besides its answers.
	Log logr.Logger
}

// Service is the CSI Controller service. It reads and writes only API objects. Its errors are
// the volume layer's (package csi/internal/volume); the driver gives them their gRPC codes.
type Service struct {
	csipb.UnimplementedControllerServer
	kube      client.Client
	live      client.Reader
	volumes   *volume.Kind[*storev1.VolumeState]
	snapshots *volume.Kind[*storev1.VolumeSnapshotState]
	events    events.EventRecorder
	log       logr.Logger
	// spreadLocks serialises the creates of one workload's spread volumes (spread.go).
	spreadLocks workloadLocks
	// keys remembers the volumes whose key rotation is done (rotate.go).
	keys settledKeys
}

// New returns the controller service of cfg.
func New(cfg Config) *Service {
	return &Service{kube: cfg.Kube, live: cfg.Live, volumes: cfg.Volumes, snapshots: cfg.Snapshots, events: cfg.Events, log: cfg.Log}
}

// warn records a Warning event on obj (an object of the driver's scheme) with reason and the
// action the service was taking; dropped without a recorder.
func (s *Service) warn(obj runtime.Object, reason, action, msg string) {
	if s.events != nil {
		s.events.Eventf(obj, nil, "Warning", reason, action, "%s", msg)
	}
}

func (s *Service) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	var caps []*csipb.ControllerServiceCapability
	for _, c := range []csipb.ControllerServiceCapability_RPC_Type{
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csipb.ControllerServiceCapability_RPC_PUBLISH_READONLY, // publish.go
		csipb.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csipb.ControllerServiceCapability_RPC_GET_CAPACITY,
		csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csipb.ControllerServiceCapability_RPC_MODIFY_VOLUME,
		csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		// snapshot.go
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csipb.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csipb.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csipb.ControllerServiceCapability_RPC_CLONE_VOLUME,
		// health.go
		csipb.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csipb.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	} {
		caps = append(caps, &csipb.ControllerServiceCapability{Type: &csipb.ControllerServiceCapability_Rpc{Rpc: &csipb.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func singleNode(m csipb.VolumeCapability_AccessMode_Mode) bool {
	return m != csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

func isNVMe(vs *storev1.VolumeState) bool { return vs.Spec.Policy.ProtocolSpec.NVMeoFTCP != nil }

func protocolKind(p policyv1.ProtocolSpec) string {
	if p.NVMeoFTCP != nil {
		return "nvmeofTcp"
	}
	return "local"
}

func (s *Service) storeNode(ctx context.Context, vs *storev1.VolumeState) (string, error) {
	var st storev1.Store
	if err := s.kube.Get(ctx, client.ObjectKey{Name: vs.Spec.StoreName}, &st); err != nil {
		return "", volume.Errorf(volume.ErrInternal, "Store %q of volume %s: %v", vs.Spec.StoreName, vs.Name, err)
	}
	return st.Spec.NodeName, nil
}

func topologyNodes(ts []*csipb.Topology) []string {
	var out []string
	for _, t := range ts {
		if n, ok := t.GetSegments()[policyv1.TopologyKeyNode]; ok {
			out = append(out, n)
		}
	}
	return out
}

// csiVolume is the CSI view of a VolumeState: its real size, contexts and accessible topology
// (local: the store's node; NVMe-oF: the nodes labelled as initiators).
func (s *Service) csiVolume(ctx context.Context, vs *storev1.VolumeState) (*csipb.Volume, error) {
	fs := vs.Spec.Policy.Filesystem
	mkfs, _ := json.Marshal(fs.MkfsOptions)
	mnt, _ := json.Marshal(fs.MountOptions)
	v := &csipb.Volume{
		VolumeId:      vs.Name,
		CapacityBytes: max(vs.Status.ActualBytes, vs.Spec.CapacityBytes),
		VolumeContext: map[string]string{
			volume.ContextKind:         protocolKind(vs.Spec.Policy.ProtocolSpec),
			volume.ContextFSType:       fs.FSType,
			volume.ContextMkfsOptions:  string(mkfs),
			volume.ContextMountOptions: string(mnt),
		},
	}
	if e := vs.Spec.Policy.Encryption; e != nil {
		encryptionContext(v.VolumeContext, e)
		if o := vs.Spec.KeyOrigin; o != nil && len(o.HeaderLabels) > 0 {
			v.VolumeContext[volume.ContextHeaderLabels] = strings.Join(o.HeaderLabels, ",")
		}
		v.CapacityBytes = usableBytes(vs, v.CapacityBytes)
	}
	if cs := vs.Spec.ContentSource; cs != nil { // CSI: a volume made from a source says so
		if cs.Snapshot != "" {
			v.ContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: cs.Snapshot}}}
		} else {
			v.ContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: cs.Volume}}}
		}
	}
	if isNVMe(vs) {
		var nodes corev1.NodeList
		if err := s.kube.List(ctx, &nodes, client.MatchingLabels{policyv1.LabelNVMeInitiator: "true"}); err != nil {
			return nil, volume.Errorf(volume.ErrUnavailable, "list initiator Nodes: %v", err)
		}
		for _, n := range nodes.Items {
			v.AccessibleTopology = append(v.AccessibleTopology, &csipb.Topology{Segments: map[string]string{policyv1.TopologyKeyNode: n.Name}})
		}
		return v, nil
	}
	node, err := s.storeNode(ctx, vs)
	if err != nil {
		return nil, err
	}
	v.AccessibleTopology = []*csipb.Topology{{Segments: map[string]string{policyv1.TopologyKeyNode: node}}}
	return v, nil
}

// agentSilentAfter is how old a Store's heartbeat may be before its agent counts as gone: four
// of the agent's default 30 s refreshes (agents/agent DefaultRefreshInterval).
const agentSilentAfter = 2 * time.Minute

// storeAgentAbsent says why the agent of a Store cannot answer now: the Node of the Store no
// longer exists (nodeGone), or the Store's heartbeat is older than agentSilentAfter. "" means it
// may answer, also when that cannot be told (no Store, no heartbeat yet): then callers wait as
// before. Store and Node are read directly: an informer a moment behind would see a deleted
// Node still there.
func (s *Service) storeAgentAbsent(ctx context.Context, store string) (why string, nodeGone bool) {
	if store == "" {
		return "", false
	}
	var st storev1.Store
	if err := s.live.Get(ctx, client.ObjectKey{Name: store}, &st); err != nil {
		return "", false
	}
	var n corev1.Node
	if err := s.live.Get(ctx, client.ObjectKey{Name: st.Spec.NodeName}, &n); apierrors.IsNotFound(err) {
		return fmt.Sprintf("node %s of store %s no longer exists", st.Spec.NodeName, st.Name), true
	}
	if hb := st.Status.LastHeartbeatTime; hb != nil && time.Since(hb.Time) > agentSilentAfter {
		return fmt.Sprintf("the agent of node %s has not reported since %s", st.Spec.NodeName, hb.UTC().Format(time.RFC3339)), false
	}
	return "", false
}
