package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kubeletVolume is what the kubelet stand-in staged and published.
type kubeletVolume struct {
	id, staging, target string
}

func (e *Env) dialCSI() (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+e.CSISocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// Kubelet stands in for kubelet on the storage node: it waits for the
// VolumeAttachment the attach-detach controller created (and csi-attacher
// attached through ControllerPublish), then calls NodeStageVolume and
// NodePublishVolume on the node plugin's socket, writes a file through the
// mount and reads the volume's stats.
func (e *Env) Kubelet(ctx context.Context, sum *Summary) error {
	return e.step("kubelet stand-in: VolumeAttachment attached, NodeStage + NodePublish on the node plugin's socket", []string{"plinth-csi", "csi-attacher"}, func() (string, error) {
		var pv corev1.PersistentVolume
		var pvc corev1.PersistentVolumeClaim
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: QuickstartPVC}, &pvc); err != nil {
			return "", err
		}
		if err := e.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
			return "", err
		}
		var va *storagev1.VolumeAttachment
		if err := poll(ctx, 2*time.Minute, func() error {
			var list storagev1.VolumeAttachmentList
			if err := e.Client.List(ctx, &list); err != nil {
				return err
			}
			for i := range list.Items {
				v := &list.Items[i]
				if v.Spec.Source.PersistentVolumeName != nil && *v.Spec.Source.PersistentVolumeName == pv.Name && v.Spec.NodeName == StorageNode {
					if !v.Status.Attached {
						return fmt.Errorf("VolumeAttachment %s not attached yet (%+v)", v.Name, v.Status.AttachError)
					}
					va = v
					return nil
				}
			}
			return fmt.Errorf("no VolumeAttachment for %s on %s yet", pv.Name, StorageNode)
		}); err != nil {
			return "", err
		}
		conn, err := e.dialCSI()
		if err != nil {
			return "", err
		}
		defer conn.Close()
		node := csipb.NewNodeClient(conn)
		kv := e.kubeletPaths(pv.Name, pv.Spec.CSI.VolumeHandle)
		if err := os.MkdirAll(filepath.Dir(kv.target), 0o750); err != nil {
			return "", err
		}
		capability := &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := retryAborted(cctx, func() error {
			_, err := node.NodeStageVolume(cctx, &csipb.NodeStageVolumeRequest{
				VolumeId: kv.id, PublishContext: va.Status.AttachmentMetadata, StagingTargetPath: kv.staging,
				VolumeCapability: capability, VolumeContext: pv.Spec.CSI.VolumeAttributes,
			})
			return err
		}); err != nil {
			return "", fmt.Errorf("NodeStageVolume: %w", err)
		}
		if err := retryAborted(cctx, func() error {
			_, err := node.NodePublishVolume(cctx, &csipb.NodePublishVolumeRequest{
				VolumeId: kv.id, PublishContext: va.Status.AttachmentMetadata, StagingTargetPath: kv.staging, TargetPath: kv.target,
				VolumeCapability: capability, VolumeContext: pv.Spec.CSI.VolumeAttributes,
			})
			return err
		}); err != nil {
			return "", fmt.Errorf("NodePublishVolume: %w", err)
		}
		probe := filepath.Join(kv.target, "hello.txt")
		if err := os.WriteFile(probe, []byte("written through the published mount\n"), 0o644); err != nil {
			return "", err
		}
		if _, err := os.ReadFile(probe); err != nil {
			return "", err
		}
		stats, err := node.NodeGetVolumeStats(cctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: kv.id, VolumePath: kv.target})
		if err != nil {
			return "", fmt.Errorf("NodeGetVolumeStats: %w", err)
		}
		var total, used int64
		for _, u := range stats.GetUsage() {
			if u.GetUnit() == csipb.VolumeUsage_BYTES {
				total, used = u.GetTotal(), u.GetUsed()
			}
		}
		return fmt.Sprintf("VolumeAttachment %s attached (devicePath %s)\nstaged at %s, published at %s (%s), wrote %s\nNodeGetVolumeStats: %s total, %s used",
			va.Name, va.Status.AttachmentMetadata["devicePath"], kv.staging, kv.target, pv.Spec.CSI.FSType, probe, bytesStr(total), bytesStr(used)), nil
	})
}

// retryAborted calls f until it returns anything but codes.Aborted (an
// operation on the volume in progress, such as csi-attacher's repeated
// ControllerPublish), as kubelet retries, or ctx ends.
func retryAborted(ctx context.Context, f func() error) error {
	for {
		err := f()
		if status.Code(err) != codes.Aborted {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// kubeletPaths are the paths kubelet would use, under <Dir>/kubelet.
func (e *Env) kubeletPaths(pvName, id string) kubeletVolume {
	base := filepath.Join(e.Dir, "kubelet")
	return kubeletVolume{
		id:      id,
		staging: filepath.Join(base, "plugins", "kubernetes.io", "csi", "csi.plinth.dev", pvName, "globalmount"),
		target:  filepath.Join(base, "pods", QuickstartPod, "volumes", "kubernetes.io~csi", pvName, "mount"),
	}
}

// KubeletRelease unpublishes and unstages the quickstart volume as kubelet
// would when the pod goes away.
func (e *Env) KubeletRelease(ctx context.Context, sum *Summary) error {
	return e.step("kubelet stand-in: NodeUnpublish + NodeUnstage", []string{"plinth-csi"}, func() (string, error) {
		var pvc corev1.PersistentVolumeClaim
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: QuickstartPVC}, &pvc); err != nil {
			return "", err
		}
		kv := e.kubeletPaths(pvc.Spec.VolumeName, sum.VolumeID)
		conn, err := e.dialCSI()
		if err != nil {
			return "", err
		}
		defer conn.Close()
		node := csipb.NewNodeClient(conn)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := retryAborted(cctx, func() error {
			_, err := node.NodeUnpublishVolume(cctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: kv.id, TargetPath: kv.target})
			return err
		}); err != nil {
			return "", fmt.Errorf("NodeUnpublishVolume: %w", err)
		}
		if err := retryAborted(cctx, func() error {
			_, err := node.NodeUnstageVolume(cctx, &csipb.NodeUnstageVolumeRequest{VolumeId: kv.id, StagingTargetPath: kv.staging})
			return err
		}); err != nil {
			return "", fmt.Errorf("NodeUnstageVolume: %w", err)
		}
		return fmt.Sprintf("%s unpublished and unstaged", kv.id), nil
	})
}
