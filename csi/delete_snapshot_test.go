package csi_test

import (
	"context"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// DeleteSnapshot of a snapshot whose agent has not reported for an hour is UNAVAILABLE at once
// (the snapshotter retries), like DeleteVolume, with the VolumeSnapshotState kept, marked for
// deletion and its finalizer held for the agent.
func TestDeleteSnapshotAgentGone(t *testing.T) {
	cp := sharedControlPlane(t)
	c := kubeClient(t, cp.Admin.Config)
	e := setup(t, c, "snapgone", map[string]int64{"snapgone-silent": 100 * gib})
	ctrl := csipb.NewControllerClient(startDriver(t, csi.Options{Mode: csi.ModeController, Config: cp.Admin.Config, WaitTimeout: time.Hour}))
	ctx := context.Background()
	st := e.storeFor["snapgone-silent"]
	var store storev1.Store
	if err := c.Get(ctx, client.ObjectKey{Name: st}, &store); err != nil {
		t.Fatal(err)
	}
	old := metav1.NewTime(time.Now().Add(-time.Hour))
	store.Status.LastHeartbeatTime = &old
	if err := c.Status().Update(ctx, &store); err != nil {
		t.Fatal(err)
	}
	id := storev1.SnapshotID("snapgone")
	ss := &storev1.VolumeSnapshotState{ObjectMeta: metav1.ObjectMeta{Name: id, Finalizers: []string{fakeFinalizer}},
		Spec: storev1.VolumeSnapshotStateSpec{CSIName: "snapgone", SourceVolume: storev1.VolumeID("snapgone-source"), StoreName: st, Pool: "snapgone"}}
	create(t, c, ss)
	t.Cleanup(func() {
		var got storev1.VolumeSnapshotState
		if c.Get(context.Background(), client.ObjectKey{Name: id}, &got) == nil {
			got.Finalizers = nil
			c.Update(context.Background(), &got) //nolint:errcheck // best effort
		}
	})
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err := ctrl.DeleteSnapshot(callCtx, &csipb.DeleteSnapshotRequest{SnapshotId: id})
	wantCode(t, "DeleteSnapshot with the agent gone", err, codes.Unavailable)
	var got storev1.VolumeSnapshotState
	if err := c.Get(ctx, client.ObjectKey{Name: id}, &got); err != nil || got.DeletionTimestamp == nil {
		t.Errorf("VolumeSnapshotState after DeleteSnapshot: deletion %v, %v; want kept, marked for deletion", got.DeletionTimestamp, err)
	}
}
