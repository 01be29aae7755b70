package manifests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/moveexec"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The move executor runs under the CSI controller's ServiceAccount and roles as shipped
// (kustomize/rbac): its caches sync, it elects a leader with a Lease in plinth-system, switches
// a verified copy and writes the Evacuating condition of an evacuating pool. A grant missing
// from the role would stall a cache (and stop the CSI controller's process with it).
func testMoveExecutorUnderItsRBAC(t *testing.T, c *cluster) {
	ctx := t.Context()
	for _, o := range allBuilds(t)["rbac"] {
		if err := c.apply(t, ctx, o, false); err != nil {
			t.Fatalf("apply %s: %v", ID(o), err)
		}
	}
	admin, err := client.New(c.cfg, client.Options{Scheme: moveexec.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	file := policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth"}}
	pool := &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: "mv-slow"}, Spec: policyv1.StoragePoolSpec{Backend: file}}
	objs := []client.Object{pool}
	for _, name := range []string{"mv-slow.a", "mv-fast.a"} {
		p := "mv-slow"
		if name == "mv-fast.a" {
			p = "mv-fast"
		}
		objs = append(objs, &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: storev1.StoreSpec{Pool: p, NodeName: "a", Backend: file, DriftPolicy: policyv1.DriftPolicyReport, Evacuate: name == "mv-slow.a"}})
	}
	vs := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: "mv-v1"}, Spec: storev1.VolumeStateSpec{
		CSIName: "mv-v1", StoreName: "mv-slow.a", CapacityBytes: 1 << 20, VolumeMode: "Block",
		Policy: storev1.FrozenPolicy{Placement: "p", Pool: "mv-slow", Protocol: "local", Backend: file,
			ProtocolSpec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}}}
	objs = append(objs, vs)
	for _, o := range objs {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
	}
	t.Cleanup(func() {
		for _, o := range objs {
			_ = admin.Delete(context.Background(), o)
		}
	})
	vs.Spec.Move = &storev1.VolumeMove{ID: "m1", SourceStore: "mv-slow.a", TargetStore: "mv-fast.a"}
	if err := admin.Update(ctx, vs); err != nil {
		t.Fatal(err)
	}
	vs.Status.Move = &storev1.MoveStatus{ID: "m1", Phase: storev1.MoveCopied, SourceStore: "mv-slow.a", TargetStore: "mv-fast.a",
		BytesTotal: 1 << 20, BytesCopied: 1 << 20, Checksum: "sha256:00"}
	if err := admin.Status().Update(ctx, vs); err != nil {
		t.Fatal(err)
	}

	as := rest.CopyConfig(c.cfg)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":plinth-csi-controller"}
	mgr, err := moveexec.NewManager(moveexec.ManagerOptions{Config: as, LeaderElection: true, LeaderElectionNamespace: namespace,
		Log: testr.New(t), SkipNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("move executor: %v", err)
		}
	})
	waitFor(t, 2*time.Minute, "switched and Evacuating written under plinth-csi-controller's RBAC", func() error {
		select {
		case err := <-done:
			t.Fatalf("move executor stopped: %v", err)
		default:
		}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
			return err
		}
		if vs.Spec.StoreName != "mv-fast.a" {
			return fmt.Errorf("storeName %s", vs.Spec.StoreName)
		}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return err
		}
		for _, cond := range pool.Status.Conditions {
			if cond.Type == moveexec.EvacuatingCondition && cond.Reason == moveexec.ReasonMovesInProgress {
				return nil
			}
		}
		return fmt.Errorf("pool conditions %+v", pool.Status.Conditions)
	})
	if _, err := c.kube.CoordinationV1().Leases(namespace).Get(ctx, moveexec.LeaderElectionID, metav1.GetOptions{}); err != nil {
		t.Errorf("leader election Lease: %v", err)
	}
}
