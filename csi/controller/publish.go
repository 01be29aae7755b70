package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/internal/failpoint"
	"github.com/plinth-storage/plinth/internal/hostnqn"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func (s *Service) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	switch {
	case id == "":
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	case nodeID == "":
		return nil, volume.Errorf(volume.ErrInvalid, "node id is required")
	case req.GetVolumeCapability() == nil:
		return nil, volume.Errorf(volume.ErrInvalid, "volume capability is required")
	}
	if _, _, err := volume.CheckCapabilities([]*csipb.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, volume.Errorf(volume.ErrInvalid, "%w", err)
	}
	h, err := s.volumes.OpenLive(ctx, id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if !h.Exists() {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s does not exist", id)
	}
	var node corev1.Node
	if err := s.kube.Get(ctx, client.ObjectKey{Name: nodeID}, &node); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, volume.Errorf(volume.ErrNotFound, "node %s does not exist", nodeID)
		}
		return nil, volume.Errorf(volume.ErrUnavailable, "read Node: %v", err)
	}
	if err := s.checkAttachLimit(ctx, &node, id); err != nil {
		return nil, err
	}
	if !isNVMe(h.State) {
		return s.publishLocal(ctx, h, nodeID, req.GetVolumeCapability().GetAccessMode().GetMode(), req.GetReadonly())
	}
	hostNQN := node.Annotations[policyv1.AnnotationHostNQN]
	if hostNQN == "" {
		return nil, volume.Errorf(volume.ErrPrecondition, "node %s has no %s annotation (is the node plugin running?)", nodeID, policyv1.AnnotationHostNQN)
	}
	// The ACL admits by host NQN alone: granting an NQN that another node presents too would
	// admit that node as well. Refused, never granted and never widened to any host.
	others, err := s.nodesPresenting(ctx, nodeID, hostNQN)
	if err != nil {
		return nil, err
	}
	if len(others) > 0 {
		msg := hostnqn.Message(hostNQN, nodeID, others) + fmt.Sprintf("; publication of volume %s refused", id)
		s.warn(&node, hostnqn.ReasonDuplicate, "Publish", msg)
		return nil, volume.Errorf(volume.ErrPrecondition, "%s", msg)
	}
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()
	want := storev1.Publication{NodeName: nodeID, HostNQN: hostNQN, AccessMode: mode.String(), ReadOnly: req.GetReadonly()}
	gen, err := s.updatePublications(ctx, h, func(pubs []storev1.Publication) ([]storev1.Publication, error) {
		for _, p := range pubs {
			if p.NodeName == nodeID {
				if p != want {
					return nil, volume.Errorf(volume.ErrExists, "volume %s is published to node %s with another mode", id, nodeID)
				}
				return pubs, nil
			}
		}
		if len(pubs) > 0 && (singleNode(mode) || pubs[0].AccessMode != csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY.String()) {
			return nil, volume.Errorf(volume.ErrPrecondition, "volume %s is published to node %s and its access mode allows one node", id, pubs[0].NodeName)
		}
		return append(pubs, want), nil
	})
	if err != nil {
		return nil, err
	}
	var done *storev1.VolumeState
	err = h.Wait(ctx, func(vs *storev1.VolumeState) (bool, error) {
		ok, err := volume.ReadyOrFailed(vs)
		if !ok || err != nil {
			return ok, err
		}
		if vs.Status.ObservedPublicationGeneration >= gen && vs.Status.Export != nil {
			done = vs
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return nil, volume.WaitError("publish volume "+id, err)
	}
	pc, err := s.nvmePublishContext(ctx, done)
	if err != nil {
		return nil, err
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

// checkAttachLimit refuses to publish volume id to node when the node is at its limit
// (attachLimitError), counting the VolumeStates read live.
func (s *Service) checkAttachLimit(ctx context.Context, node *corev1.Node, id string) error {
	if _, ok := node.Annotations[policyv1.AnnotationMaxVolumes]; !ok {
		return nil
	}
	var list storev1.VolumeStateList
	if err := s.live.List(ctx, &list); err != nil {
		return volume.Errorf(volume.ErrUnavailable, "list VolumeStates: %v", err)
	}
	return attachLimitError(node, list.Items, id)
}

// attachLimitError is ErrAttachLimit (RESOURCE_EXHAUSTED) when node's
// plinth.dev/max-volumes-per-node (written by its node plugin) is positive and that many
// volumes other than id list the node in spec.publications; nil otherwise. A volume already
// published there passes, so a repeated publish stays idempotent; a value that is not a
// positive decimal sets no limit (the node plugin writes one or nothing). Two concurrent
// publishes to a node one below its limit may both pass: kubelet's CSINode count, which the
// scheduler enforces, is the guard against that.
func attachLimitError(node *corev1.Node, vss []storev1.VolumeState, id string) error {
	limit, err := strconv.ParseInt(node.Annotations[policyv1.AnnotationMaxVolumes], 10, 64)
	if err != nil || limit <= 0 {
		return nil
	}
	var n int64
	for _, vs := range vss {
		if slices.ContainsFunc(vs.Spec.Publications, func(p storev1.Publication) bool { return p.NodeName == node.Name }) {
			if vs.Name == id {
				return nil
			}
			n++
		}
	}
	if n >= limit {
		return volume.Errorf(volume.ErrAttachLimit, "node %s has %d volumes published, its limit (%s %d)", node.Name, n, policyv1.AnnotationMaxVolumes, limit)
	}
	return nil
}

// publishLocal answers ControllerPublishVolume of a local volume: only to the node of its
// store, once the volume is ready, with its device path. The publication (access mode,
// read-only) is recorded in spec.publications, with no host NQN and nothing for the agent to
// export, so that a second publish to the node with another mode or read-only flag is
// ALREADY_EXISTS (PUBLISH_READONLY), as for NVMe-oF volumes.
func (s *Service) publishLocal(ctx context.Context, h *volume.Handle[*storev1.VolumeState], nodeID string, mode csipb.VolumeCapability_AccessMode_Mode, readOnly bool) (*csipb.ControllerPublishVolumeResponse, error) {
	storeNode, err := s.storeNode(ctx, h.State)
	if err != nil {
		return nil, err
	}
	if storeNode != nodeID {
		return nil, volume.Errorf(volume.ErrPrecondition, "local volume %s lives on node %s, not %s", h.ID, storeNode, nodeID)
	}
	if err := h.Wait(ctx, volume.ReadyOrFailed); err != nil {
		return nil, volume.WaitError("publish volume "+h.ID, err)
	}
	if err := h.ReadLive(ctx); err != nil {
		return nil, err
	}
	if !h.Exists() {
		return nil, volume.Errorf(volume.ErrUnavailable, "read VolumeState %s: deleted meanwhile", h.ID)
	}
	want := storev1.Publication{NodeName: nodeID, AccessMode: mode.String(), ReadOnly: readOnly}
	if _, err := s.updatePublications(ctx, h, func(pubs []storev1.Publication) ([]storev1.Publication, error) {
		for _, p := range pubs {
			if p.NodeName == nodeID {
				if p != want {
					return nil, volume.Errorf(volume.ErrExists, "volume %s is published to node %s with another mode or read-only flag", h.ID, nodeID)
				}
				return pubs, nil
			}
		}
		return append(pubs, want), nil
	}); err != nil {
		return nil, err
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: map[string]string{
		volume.ContextKind:       "local",
		volume.PublishDevicePath: h.State.Status.DevicePath,
	}}, nil
}

// nvmePublishContext is the publish context of an NVMe-oF volume vs exported by its agent:
// where the export is, the storage node, and the frozen protocol's timers and authentication.
func (s *Service) nvmePublishContext(ctx context.Context, vs *storev1.VolumeState) (map[string]string, error) {
	pc := map[string]string{
		volume.ContextKind:    "nvmeofTcp",
		volume.PublishNQN:     vs.Status.Export.NQN,
		volume.PublishAddress: vs.Status.Export.Address,
		volume.PublishPort:    strconv.Itoa(int(vs.Status.Export.Port)),
	}
	target, err := s.storeNode(ctx, vs)
	if err != nil {
		return nil, err
	}
	pc[volume.PublishTargetNode] = target
	if t := vs.Spec.Policy.ProtocolSpec.NVMeoFTCP; t != nil {
		if t.CtrlLossTmo != nil {
			pc[volume.PublishCtrlLossTmo] = strconv.Itoa(int(*t.CtrlLossTmo))
		}
		if t.ReconnectDelay > 0 {
			pc[volume.PublishReconnectDelay] = strconv.Itoa(int(t.ReconnectDelay))
		}
		if t.MaxQueueSize > 0 {
			pc[volume.PublishQueueSize] = strconv.Itoa(int(t.MaxQueueSize))
		}
		if t.Auth.Enabled() {
			pc[volume.PublishAuth] = string(t.Auth.Mode)
			if t.Auth.Bidirectional {
				pc[volume.PublishAuthBidirectional] = "true"
			}
		}
	}
	return pc, nil
}

// nodesPresenting returns the Nodes other than nodeID annotated with host NQN nqn (from the
// informer), sorted.
func (s *Service) nodesPresenting(ctx context.Context, nodeID, nqn string) ([]string, error) {
	var nodes corev1.NodeList
	if err := s.kube.List(ctx, &nodes); err != nil {
		return nil, volume.Errorf(volume.ErrUnavailable, "list Nodes: %v", err)
	}
	var others []string
	for _, n := range nodes.Items {
		if n.Name != nodeID && n.Annotations[policyv1.AnnotationHostNQN] == nqn {
			others = append(others, n.Name)
		}
	}
	slices.Sort(others)
	return others, nil
}

// updatePublications applies change to spec.publications of h.State with a resourceVersion
// compare-and-swap (Update fails with Conflict when another writer came first: reread and
// retry), bumping spec.publicationGeneration when the list changed. It returns the generation
// the agent must reach.
func (s *Service) updatePublications(ctx context.Context, h *volume.Handle[*storev1.VolumeState], change func([]storev1.Publication) ([]storev1.Publication, error)) (int64, error) {
	for attempt := 0; ; attempt++ {
		vs := h.State
		pubs, err := change(slices.Clone(vs.Spec.Publications))
		if err != nil {
			return 0, err
		}
		if slices.Equal(pubs, vs.Spec.Publications) {
			return vs.Spec.PublicationGeneration, nil
		}
		vs.Spec.Publications = pubs
		vs.Spec.PublicationGeneration++
		failpoint.Hit(failpoint.CSIPublishBeforeUpdate)
		err = h.Update(ctx) // carries metadata.resourceVersion: the CAS
		if err == nil {
			return vs.Spec.PublicationGeneration, nil
		}
		if !apierrors.IsConflict(err) || attempt >= 10 {
			return 0, volume.Errorf(volume.ErrConflict, "update publications of %s: %v", vs.Name, err)
		}
		if err := h.ReadLive(ctx); err != nil || !h.Exists() {
			return 0, volume.Errorf(volume.ErrConflict, "reread VolumeState %s: %v", vs.Name, cmp.Or(err, errors.New("deleted meanwhile")))
		}
	}
}

func (s *Service) ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) (*csipb.ControllerUnpublishVolumeResponse, error) {
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if !storev1.IsVolumeID(id) {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil
	}
	h, err := s.volumes.OpenLive(ctx, id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if !h.Exists() {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil
	}
	gen, err := s.updatePublications(ctx, h, func(pubs []storev1.Publication) ([]storev1.Publication, error) {
		return slices.DeleteFunc(pubs, func(p storev1.Publication) bool { return nodeID == "" || p.NodeName == nodeID }), nil
	})
	if err != nil {
		return nil, err
	}
	if !isNVMe(h.State) {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil // a local publication has no export to remove
	}
	err = h.Wait(ctx, func(vs *storev1.VolumeState) (bool, error) {
		return vs == nil || vs.Status.ObservedPublicationGeneration >= gen, nil
	})
	if err != nil {
		return nil, volume.WaitError("unpublish volume "+id, err)
	}
	return &csipb.ControllerUnpublishVolumeResponse{}, nil
}
