package csi_test

import (
	"context"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// DeleteVolume of a volume whose agent cannot answer is answered at once, not after the whole
// wait timeout (the driver waits up to an hour here, so a wait would end in DEADLINE_EXCEEDED
// from the call's own 2-minute deadline):
//   - its Store's heartbeat is an hour old (the agent is silent, the node may come back):
//     UNAVAILABLE, the provisioner retries with backoff; the VolumeState stays marked for
//     deletion, the agent's finalizer held, for the agent to finish when it reports again;
//   - its Node was deleted (the volume left with the node): the agent's finalizer is released,
//     the VolumeState goes, DeleteVolume is OK.
func TestDeleteVolumeAgentGone(t *testing.T) {
	cp := sharedControlPlane(t)
	c := kubeClient(t, cp.Admin.Config)
	e := setup(t, c, "gone", map[string]int64{"gone-silent": 100 * gib, "gone-deleted": 100 * gib})
	ctrl := csipb.NewControllerClient(startDriver(t, csi.Options{Mode: csi.ModeController, Config: cp.Admin.Config, WaitTimeout: time.Hour}))
	ctx := context.Background()

	old := metav1.NewTime(time.Now().Add(-time.Hour))
	for node, st := range e.storeFor {
		var store storev1.Store
		if err := c.Get(ctx, client.ObjectKey{Name: st}, &store); err != nil {
			t.Fatal(err)
		}
		store.Status.LastHeartbeatTime = &old
		if node == "gone-deleted" {
			now := metav1.Now()
			store.Status.LastHeartbeatTime = &now // a fresh heartbeat: the deleted Node alone decides
		}
		if err := c.Status().Update(ctx, &store); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gone-deleted"}}); err != nil {
		t.Fatal(err)
	}
	for node, st := range e.storeFor {
		id := storev1.VolumeID("gone-" + node)
		vs := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{fakeIgnore: "true"}, Finalizers: []string{storev1.FinalizerVolume}},
			Spec: storev1.VolumeStateSpec{CSIName: "gone-" + node, StoreName: st, CapacityBytes: mib, VolumeMode: "Filesystem",
				Policy: storev1.FrozenPolicy{Backend: policyv1.Backend{File: &policyv1.FileBackend{Directory: "/x"}}, ProtocolSpec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}}}
		create(t, c, vs)
		t.Cleanup(func() {
			var got storev1.VolumeState
			if c.Get(context.Background(), client.ObjectKey{Name: id}, &got) == nil {
				got.Finalizers = nil
				c.Update(context.Background(), &got) //nolint:errcheck // best effort
			}
		})
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		_, err := ctrl.DeleteVolume(callCtx, &csipb.DeleteVolumeRequest{VolumeId: id})
		cancel()
		var got storev1.VolumeState
		if node == "gone-deleted" {
			if err != nil {
				t.Errorf("DeleteVolume with the Node of %s deleted: %v, want OK", node, err)
			}
			if err := c.Get(ctx, client.ObjectKey{Name: id}, &got); !apierrors.IsNotFound(err) {
				t.Errorf("VolumeState of deleted node %s after DeleteVolume: %v, finalizers %v; want gone", node, err, got.Finalizers)
			}
			continue
		}
		wantCode(t, "DeleteVolume with the agent of "+node+" silent", err, codes.Unavailable)
		if err := c.Get(ctx, client.ObjectKey{Name: id}, &got); err != nil || got.DeletionTimestamp == nil || len(got.Finalizers) != 1 {
			t.Errorf("VolumeState of %s after DeleteVolume: deletion %v, finalizers %v, %v; want kept, marked for deletion", node, got.DeletionTimestamp, got.Finalizers, err)
		}
		// the provisioner's retry gets the same answer, and nothing else changes
		callCtx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		_, err = ctrl.DeleteVolume(callCtx, &csipb.DeleteVolumeRequest{VolumeId: id})
		cancel()
		wantCode(t, "DeleteVolume retried with the agent of "+node+" silent", err, codes.Unavailable)
	}
}
