package csi_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/internal/failpoint"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// fresh returns prefix with a number unique in this process: the shared control plane keeps
// the objects of an earlier run (go test -count N).
func fresh(prefix string) string {
	freshN.Lock()
	defer freshN.Unlock()
	freshN.n++
	return fmt.Sprintf("%s%d", prefix, freshN.n)
}

var freshN struct {
	sync.Mutex
	n int
}

// barrier returns a failpoint function that holds the first n callers until
// all n arrived, then lets every caller through: n publishers that read the
// same VolumeState all reach the compare-and-swap with the same
// resourceVersion, whatever the scheduling.
func barrier(n int) (fn func(), hits func() int) {
	var mu sync.Mutex
	count := 0
	all := make(chan struct{})
	return func() {
			mu.Lock()
			count++
			c := count
			if c == n {
				close(all)
			}
			mu.Unlock()
			if c <= n {
				<-all
			}
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return count
		}
}

func nvmeVolume(t *testing.T, e *env, name string) string {
	t.Helper()
	resp, err := e.ctrl.CreateVolume(t.Context(), &csipb.CreateVolumeRequest{Name: name, VolumeCapabilities: mountCap(rwo), Parameters: e.nvme})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId()
}

// Two controller replicas (an old and a new leader overlapping, or two
// provisioner sidecars) publish one RWO volume to two nodes at the same time:
// both read the VolumeState without publications and reach the
// compare-and-swap together. Exactly one wins; the other's update conflicts,
// it rereads, sees the winner and answers FAILED_PRECONDITION.
func TestPublishRaceRWOTwoNodes(t *testing.T) {
	pool := fresh("race")
	e := controllerEnv(t, pool, map[string]int64{pool + "-a": 10 * gib, pool + "-b": 10 * gib})
	cp := sharedControlPlane(t)
	second := csipb.NewControllerClient(startDriver(t, csi.Options{Mode: csi.ModeController, Config: cp.Admin.Config}))
	ctx := t.Context()
	id := nvmeVolume(t, e, pool)

	fn, hits := barrier(2)
	defer failpoint.Enable(failpoint.CSIPublishBeforeUpdate, fn)()
	nodes := []string{pool + "-a", pool + "-b"}
	clients := []csipb.ControllerClient{e.ctrl, second}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = clients[i].ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
				VolumeId: id, NodeId: nodes[i], VolumeCapability: mountCap(rwo)[0]})
		}()
	}
	wg.Wait()
	won, refused, winner := 0, 0, ""
	for i, err := range errs {
		switch status.Code(err) {
		case codes.OK:
			won++
			winner = nodes[i]
		case codes.FailedPrecondition:
			refused++
		default:
			t.Errorf("publish to %s: %v", nodes[i], err)
		}
	}
	if won != 1 || refused != 1 {
		t.Fatalf("%d publications won, %d refused with FAILED_PRECONDITION (errors %v); want 1 and 1", won, refused, errs)
	}
	if n := hits(); n != 2 {
		t.Errorf("%d compare-and-swap attempts, want 2 (the loser rereads and stops before writing)", n)
	}
	vs := &storev1.VolumeState{}
	if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil {
		t.Fatal(err)
	}
	if len(vs.Spec.Publications) != 1 || vs.Spec.Publications[0].NodeName != winner || vs.Spec.PublicationGeneration != 1 {
		t.Errorf("publications %+v generation %d; want only %s at generation 1", vs.Spec.Publications, vs.Spec.PublicationGeneration, winner)
	}
}

// A writer slips in between ControllerPublish's read and its write, at the
// named point: once with a change that does not touch publications (the
// publish retries on the newer version and wins), once publishing the volume
// to another node (the publish rereads and answers FAILED_PRECONDITION).
func TestPublishConflictInjected(t *testing.T) {
	pool := fresh("cas")
	a, b := pool+"-a", pool+"-b"
	e := controllerEnv(t, pool, map[string]int64{a: 10 * gib, b: 10 * gib})
	ctx := t.Context()
	pub := func(id, node string) error {
		_, err := e.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: mountCap(rwo)[0]})
		return err
	}
	// other writes on the real API server, from another client
	interfere := func(id string, mutate func(*storev1.VolumeState)) (fn func(), hits func() int) {
		var mu sync.Mutex
		n := 0
		return func() {
				mu.Lock()
				n++
				first := n == 1
				mu.Unlock()
				if !first {
					return
				}
				vs := &storev1.VolumeState{}
				if err := e.c.Get(context.Background(), client.ObjectKey{Name: id}, vs); err != nil {
					t.Error(err)
					return
				}
				mutate(vs)
				if err := e.c.Update(context.Background(), vs); err != nil {
					t.Errorf("interfering update: %v", err)
				}
			}, func() int {
				mu.Lock()
				defer mu.Unlock()
				return n
			}
	}

	t.Run("UnrelatedChangeRetried", func(t *testing.T) {
		id := nvmeVolume(t, e, pool+"-retry")
		fn, hits := interfere(id, func(vs *storev1.VolumeState) {
			if vs.Annotations == nil {
				vs.Annotations = map[string]string{}
			}
			vs.Annotations["test.plinth.dev/touched"] = "yes"
		})
		disable := failpoint.Enable(failpoint.CSIPublishBeforeUpdate, fn)
		err := pub(id, a)
		disable()
		if err != nil {
			t.Fatalf("publish after a conflicting unrelated write: %v", err)
		}
		if n := hits(); n != 2 {
			t.Errorf("%d compare-and-swap attempts, want 2 (one conflict, one retry)", n)
		}
		vs := &storev1.VolumeState{}
		if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil {
			t.Fatal(err)
		}
		if len(vs.Spec.Publications) != 1 || vs.Spec.Publications[0].NodeName != a || vs.Spec.PublicationGeneration != 1 ||
			vs.Annotations["test.plinth.dev/touched"] != "yes" {
			t.Errorf("publications %+v generation %d annotations %v", vs.Spec.Publications, vs.Spec.PublicationGeneration, vs.Annotations)
		}
	})

	t.Run("OtherNodeWins", func(t *testing.T) {
		id := nvmeVolume(t, e, pool+"-lose")
		fn, hits := interfere(id, func(vs *storev1.VolumeState) {
			vs.Spec.Publications = []storev1.Publication{{NodeName: b, HostNQN: "nqn.2014-08.org.nvmexpress:uuid:" + b, AccessMode: rwo.String()}}
			vs.Spec.PublicationGeneration++
		})
		disable := failpoint.Enable(failpoint.CSIPublishBeforeUpdate, fn)
		err := pub(id, a)
		disable()
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("publish to %s after %s won: %v, want FAILED_PRECONDITION", a, b, err)
		}
		if n := hits(); n != 1 {
			t.Errorf("%d compare-and-swap attempts, want 1 (the reread sees %s and stops)", n, b)
		}
		vs := &storev1.VolumeState{}
		if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil {
			t.Fatal(err)
		}
		if len(vs.Spec.Publications) != 1 || vs.Spec.Publications[0].NodeName != b || vs.Spec.PublicationGeneration != 1 {
			t.Errorf("publications %+v generation %d; want only %s at 1", vs.Spec.Publications, vs.Spec.PublicationGeneration, b)
		}
	})
}
