package csi_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// A volume takes the tier its Placement declares, at creation (mutable_parameters) and by
// ControllerModifyVolume; the VolumeState records the tier in force with a rising generation.
// A class of another Placement, one the Placement no longer lists, or one whose parameters
// differ from the Placement's tier is INVALID_ARGUMENT naming the class and the Placement. A
// modification waits for the nodes that stage the volume (status.appliedAttributes); a node
// that cannot apply the limits fails it with FAILED_PRECONDITION and its reason, and the
// tier in force before is restored.
func TestModifyVolumeTiers(t *testing.T) {
	e := controllerEnv(t, "qos", map[string]int64{"qos-node": 10 * gib})
	ctx := t.Context()
	n := func(v int64) *int64 { return &v }
	gold := policyv1.AttributesClassTemplate{Name: "qos-gold", Limits: policyv1.IOLimits{WriteBytesPerSecond: n(64 << 20)}}
	silver := policyv1.AttributesClassTemplate{Name: "qos-silver", Limits: policyv1.IOLimits{WriteBytesPerSecond: n(8 << 20), WriteIOPS: n(500)}}
	var pl policyv1.Placement
	if err := e.c.Get(ctx, client.ObjectKey{Name: "qos-local"}, &pl); err != nil {
		t.Fatal(err)
	}
	pl.Spec.AttributesClasses = []policyv1.AttributesClassTemplate{gold, silver}
	if err := e.c.Update(ctx, &pl); err != nil {
		t.Fatal(err)
	}
	goldParams := policyv1.AttributesClassParameters("qos-local", &gold)
	silverParams := policyv1.AttributesClassParameters("qos-local", &silver)
	otherParams := policyv1.AttributesClassParameters("qos-nvme", &policyv1.AttributesClassTemplate{Name: "qos-nvme-gold", Limits: gold.Limits})

	resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "qos-a", CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local, MutableParameters: goldParams})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	state := func() *storev1.VolumeState {
		t.Helper()
		vs := &storev1.VolumeState{}
		if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil {
			t.Fatal(err)
		}
		return vs
	}
	tier := func(want string, gen int64, limits policyv1.IOLimits) {
		t.Helper()
		a := state().Spec.Attributes
		if a == nil || a.Class != want || a.Generation != gen || !a.Limits.Equal(&limits) {
			t.Fatalf("spec.attributes %+v, want %s at generation %d", a, want, gen)
		}
	}
	tier("qos-gold", 1, gold.Limits)

	refused := func(what string, err error, words ...string) {
		t.Helper()
		wantCode(t, what, err, codes.InvalidArgument)
		for _, w := range words {
			if !strings.Contains(status.Convert(err).Message(), w) {
				t.Errorf("%s: message %q does not name %q", what, status.Convert(err).Message(), w)
			}
		}
	}
	_, err = e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "qos-b", CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local, MutableParameters: otherParams})
	refused("create with another Placement's class", err, `"qos-nvme-gold"`, `"qos-local"`)
	_, err = e.ctrl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: otherParams})
	refused("modify to another Placement's class", err, `"qos-nvme-gold"`, `"qos-local"`)
	edited := policyv1.AttributesClassParameters("qos-local", &policyv1.AttributesClassTemplate{Name: "qos-silver", Limits: gold.Limits})
	_, err = e.ctrl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: edited})
	refused("class differing from the Placement's tier", err, `"qos-silver"`, `"qos-local"`)
	unknownKey := policyv1.AttributesClassParameters("qos-local", &silver)
	unknownKey["plinth.dev/compression"] = "lz4"
	_, err = e.ctrl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: unknownKey})
	refused("a parameter Plinth does not implement", err, "plinth.dev/compression")
	tier("qos-gold", 1, gold.Limits)

	// No node stages the volume: the tier is recorded and in force at the next stage. A
	// status write lands between the controller's read and its update (as the agent's does
	// after each spec change): the compare-and-swap conflicts once, the controller rereads
	// and the modification succeeds.
	var mu sync.Mutex
	hits, concurrent := 0, error(nil)
	disable := failpoint.Enable(failpoint.CSIModifyBeforeUpdate, func() {
		mu.Lock()
		defer mu.Unlock()
		if hits++; hits > 1 {
			return
		}
		vs := &storev1.VolumeState{}
		if concurrent = e.c.Get(ctx, client.ObjectKey{Name: id}, vs); concurrent != nil {
			return
		}
		meta.SetStatusCondition(&vs.Status.Conditions, metav1.Condition{Type: "ConcurrentWrite", Status: metav1.ConditionTrue, Reason: "Test", Message: "a status write between read and update"})
		concurrent = e.c.Status().Update(ctx, vs)
	})
	_, err = e.ctrl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: silverParams})
	disable()
	if err != nil {
		t.Fatalf("modify with a status write between read and update: %v", err)
	}
	mu.Lock()
	if concurrent != nil || hits != 2 {
		t.Fatalf("the concurrent status write: %v; the update was tried %d times, want 2 (a conflict, then the retry)", concurrent, hits)
	}
	mu.Unlock()
	tier("qos-silver", 2, silver.Limits)
	if _, err := e.ctrl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: silverParams}); err != nil {
		t.Fatalf("same tier again: %v", err)
	}
	tier("qos-silver", 2, silver.Limits)

	// A node stages the volume: the modification returns once it reports the new generation.
	// (the agent writes the same status: a conflict is retried on the object as it is now, as
	// the node plugin does)
	node := func(gen int64, msg string) {
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			vs := state()
			vs.Status.AppliedAttributes = []storev1.AppliedAttributes{{NodeName: "qos-node", Generation: gen, Message: msg}}
			return e.c.Status().Update(ctx, vs)
		}); err != nil {
			t.Fatal(err)
		}
	}
	node(2, "")
	modify := func(params map[string]string, gen int64, msg string) error {
		errc := make(chan error, 1)
		go func() {
			_, err := e.ctrl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: params})
			errc <- err
		}()
		// stands in for the node plugin (csi/node/qos.go): it reports once it sees the generation
		if err := wait.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
			if a := state().Spec.Attributes; a == nil || a.Generation < gen {
				return fmt.Errorf("generation %d not written yet", gen)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errc:
			t.Fatalf("modify returned before the node reported: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		node(gen, msg)
		return <-errc
	}
	if err := modify(goldParams, 3, ""); err != nil {
		t.Fatal(err)
	}
	tier("qos-gold", 3, gold.Limits)

	err = modify(silverParams, 4, "pod 1234: pod cgroup not found")
	wantCode(t, "node cannot apply", err, codes.FailedPrecondition)
	if m := status.Convert(err).Message(); !strings.Contains(m, "qos-node") || !strings.Contains(m, "pod cgroup not found") || !strings.Contains(m, `"qos-silver"`) {
		t.Errorf("message %q does not name the node, the class and the reason", m)
	}
	tier("qos-gold", 5, gold.Limits) // the tier in force before, for the nodes to restore

	// A volume created without a tier, published to the node and staged there. Its publication
	// is recorded (without a host NQN: no ACL, only the access mode for the read-only check);
	// the node plugin's entry at generation 0 is what tells the controller that the node applies
	// limits to it, and a first tier waits for it.
	plain, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "qos-plain", CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local})
	if err != nil {
		t.Fatal(err)
	}
	id = plain.GetVolume().GetVolumeId()
	if _, err := e.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "qos-node", VolumeCapability: mountCap(rwo)[0]}); err != nil {
		t.Fatal(err)
	}
	if a := state(); a.Spec.Attributes != nil || len(a.Spec.Publications) != 1 || a.Spec.Publications[0].NodeName != "qos-node" || a.Spec.Publications[0].HostNQN != "" {
		t.Fatalf("a local volume without a tier: spec.attributes %+v, spec.publications %+v", a.Spec.Attributes, a.Spec.Publications)
	}
	node(0, "")
	if err := modify(goldParams, 1, ""); err != nil {
		t.Fatal(err)
	}
	tier("qos-gold", 1, gold.Limits)

	// The Placement drops a tier: a claim asking for it is refused.
	pl = policyv1.Placement{}
	if err := e.c.Get(ctx, client.ObjectKey{Name: "qos-local"}, &pl); err != nil {
		t.Fatal(err)
	}
	pl.Spec.AttributesClasses = []policyv1.AttributesClassTemplate{gold}
	if err := e.c.Update(ctx, &pl); err != nil {
		t.Fatal(err)
	}
	// at once: the controller reads the Placement from the API server, so no cache lag lets
	// the dropped tier through (it would be recorded and the call would wait for the nodes)
	_, err = e.ctrl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: silverParams})
	refused("modify to a dropped tier", err, `"qos-silver"`, "do not list it")
	tier("qos-gold", 1, gold.Limits)
}
