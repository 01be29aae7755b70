// Package node is the CSI Node service of csi.plinth.dev: it connects NVMe-oF/TCP subsystems
// or uses local devices, formats blank devices, mounts, and keeps atomic stage records so
// unstage works after restarts (package csi/stage). stage.go (stage, unstage), publish.go,
// stats.go (stats, expand), health.go (volume health and its monitor), auth.go (DH-HMAC-CHAP
// keys), rotate.go (key rotation), qos.go (I/O limits of VolumeAttributesClass tiers); node.go
// registers the node's host NQN.
package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/crypt"
	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/nvme"
	"github.com/plinth-storage/plinth/csi/stage"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	"github.com/plinth-storage/plinth/internal/hostnqn"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// Config is what the node service works with.
type Config struct {
	// NodeName is this node's Node name (node id and topology value).
	NodeName string
	// HostNQNFile is the node's host NQN file, read by Init.
	HostNQNFile string
	// MaxVolumes is the most volumes that may be published to this node at once (NodeGetInfo
	// max_volumes_per_node; Init writes it on the Node for ControllerPublishVolume); 0: no limit.
	MaxVolumes int64
	// Stages holds the node stage records.
	Stages stage.Dir
	// Mounter and Initiator are the node's kernel access.
	Mounter   *mount.Mounter
	Initiator *nvme.Initiator
	// Kube and Live reach the API server; nil without an API config (Init then labels nothing).
	Kube client.Client
	Live client.Reader
	// Keys gives this node's DH-HMAC-CHAP keys toward a storage node; nil: none.
	Keys hostkeys.Source
	// Events records the Warning events; nil drops them.
	Events events.EventRecorder
	// Metrics are the volume health series (NewMetrics), registered by the caller.
	Metrics Metrics
	// Locks serialise the operations per volume.
	Locks *volume.Locks
	// Log receives what the service reports besides its answers.
	Log logr.Logger
}

// Service is the CSI Node service. Its errors are the volume layer's (package
// csi/internal/volume); the driver gives them their gRPC codes.
type Service struct {
	csipb.UnimplementedNodeServer
	nodeName    string
	hostNQNFile string
	maxVolumes  int64
	hostNQN     string // read by Init
	stages      stage.Dir
	mounter     *mount.Mounter
	initiator   *nvme.Initiator
	crypt       crypt.LUKS // cryptsetup from PATH
	kube        client.Client
	live        client.Reader
	keys        hostkeys.Source
	events      events.EventRecorder
	metrics     Metrics
	monitor     volumeMonitor
	locks       *volume.Locks
	log         logr.Logger
	freeze      freezer // the group snapshots' consumer freezes (freeze.go)
	limits      *Limits // qos.go; nil until NewLimits
}

// New returns the node service of cfg; Init prepares it before it serves.
func New(cfg Config) *Service {
	return &Service{nodeName: cfg.NodeName, hostNQNFile: cfg.HostNQNFile, maxVolumes: cfg.MaxVolumes, stages: cfg.Stages, mounter: cfg.Mounter, initiator: cfg.Initiator,
		kube: cfg.Kube, live: cfg.Live, keys: cfg.Keys, events: cfg.Events, metrics: cfg.Metrics, locks: cfg.Locks, log: cfg.Log,
		freeze: freezer{holds: map[string]*hold{}, groups: map[string]string{}, kick: make(chan string, 64)}}
}

// warn records a Warning event on obj (an object of the driver's scheme) with reason and the
// action the service was taking; dropped without a recorder.
func (s *Service) warn(obj runtime.Object, reason, action, msg string) {
	if s.events != nil {
		s.events.Eventf(obj, nil, "Warning", reason, action, "%s", msg)
	}
}

// The node service's API access (kustomize/rbac/csi_node.yaml): the merge patch of its own
// Node in Init, after reading the Nodes for another one presenting the same host NQN.
//
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;patch

// Init removes stage record temp files a crash left, reads the host NQN and, with an API config, labels the Node
// plinth.dev/nvme-initiator=true when nvme-tcp is usable and annotates it with
// plinth.dev/host-nqn (docs/design.md, "Names and keys": ControllerPublish reads the host NQN
// there).
func (s *Service) Init(ctx context.Context) error {
	// Before any Save of this process: temp files of records a crash left half-written.
	removed, err := s.stages.CleanTemp()
	if err != nil {
		return fmt.Errorf("clean stage records: %w", err)
	}
	if len(removed) > 0 {
		s.log.Info("removed stage record temp files left by a crash", "folder", s.stages.Path, "files", removed)
	}
	nqn, err := nvme.HostNQN(s.hostNQNFile)
	if err != nil {
		return fmt.Errorf("read host NQN: %w", err)
	}
	s.hostNQN = nqn
	if s.kube == nil {
		return nil
	}
	if err := s.annotateMaxVolumes(ctx); err != nil {
		return err
	}
	meta := map[string]any{}
	if s.initiator.Usable() && nqn != "" {
		meta["labels"] = map[string]string{policyv1.LabelNVMeInitiator: "true"}
	}
	if nqn != "" {
		meta["annotations"] = map[string]string{policyv1.AnnotationHostNQN: nqn}
		rejected, err := s.duplicateHostNQN(ctx, nqn)
		if err != nil {
			return err
		}
		if rejected {
			// not registered: no annotation (ControllerPublish grants nothing to this node)
			// and no initiator label (the scheduler places no NVMe-oF volume here)
			meta = map[string]any{
				"labels":      map[string]any{policyv1.LabelNVMeInitiator: nil},
				"annotations": map[string]any{policyv1.AnnotationHostNQN: nil},
			}
		}
	}
	if len(meta) == 0 {
		s.log.Info("no NVMe host NQN: this node cannot consume NVMe-oF volumes", "file", s.hostNQNFile)
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": meta})
	n := &corev1.Node{}
	n.Name = s.nodeName
	if err := s.kube.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("label and annotate Node %s: %w", s.nodeName, err)
	}
	if _, rejected := meta["annotations"].(map[string]any); !rejected {
		s.log.Info("node registered for NVMe-oF", "node", s.nodeName, "hostNQN", nqn, "initiator", meta["labels"] != nil)
	}
	return nil
}

// duplicateHostNQN applies the rule of internal/hostnqn to this node's host NQN and the other
// Nodes' plinth.dev/host-nqn annotations: when another Node presents nqn and registered it first,
// this node's registration is rejected, reported as a Warning event on its Node naming both
// nodes and in the log.
func (s *Service) duplicateHostNQN(ctx context.Context, nqn string) (bool, error) {
	var nodes corev1.NodeList
	if err := s.kube.List(ctx, &nodes); err != nil {
		return false, fmt.Errorf("list Nodes for host NQN %s: %w", nqn, err)
	}
	var self *corev1.Node
	var others []string
	for i, n := range nodes.Items {
		switch {
		case n.Name == s.nodeName:
			self = &nodes.Items[i]
		case n.Annotations[policyv1.AnnotationHostNQN] == nqn:
			others = append(others, n.Name)
		}
	}
	holds := self != nil && self.Annotations[policyv1.AnnotationHostNQN] == nqn
	if !hostnqn.Rejected(s.nodeName, holds, others) {
		return false, nil
	}
	msg := hostnqn.Message(nqn, s.nodeName, others) + "; this node's registration is rejected: it is granted no NVMe-oF volume until its host NQN is its own"
	s.log.Error(nil, "host NQN registration rejected", "node", s.nodeName, "hostNQN", nqn, "alsoPresentedBy", others)
	if self != nil {
		s.warn(self, hostnqn.ReasonDuplicate, "Register", msg)
	}
	return true, nil
}

// annotateMaxVolumes writes this node's limit (Config.MaxVolumes) on its Node as
// plinth.dev/max-volumes-per-node, where ControllerPublishVolume reads it, or removes the
// annotation when there is no limit.
func (s *Service) annotateMaxVolumes(ctx context.Context) error {
	var v any // nil removes the annotation
	if s.maxVolumes > 0 {
		v = strconv.FormatInt(s.maxVolumes, 10)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{policyv1.AnnotationMaxVolumes: v}}})
	n := &corev1.Node{}
	n.Name = s.nodeName
	if err := s.kube.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotate Node %s with its volume limit: %w", s.nodeName, err)
	}
	return nil
}

// NodeGetInfo answers the node id, its topology and max_volumes_per_node (Config.MaxVolumes, 0
// when unlimited), which kubelet copies to the CSINode for the scheduler.
func (s *Service) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{
		NodeId:             s.nodeName,
		MaxVolumesPerNode:  s.maxVolumes,
		AccessibleTopology: &csipb.Topology{Segments: map[string]string{policyv1.TopologyKeyNode: s.nodeName}},
	}, nil
}

func (s *Service) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, c := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csipb.NodeServiceCapability_RPC_GET_STORAGE_HEALTH, // health.go
		csipb.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{Rpc: &csipb.NodeServiceCapability_RPC{Type: c}}})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func jsonList(s string) []string {
	var out []string
	if s != "" {
		_ = json.Unmarshal([]byte(s), &out)
	}
	return out
}
