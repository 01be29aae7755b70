package guestnode

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/hostnqn"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/kernel/guest"
)

// extraTest is a subtest of TestCrossNode kept in its own file: it makes and removes its own
// volumes, so that it runs alone (go test -run 'TestCrossNode/<name>') on the one boot.
type extraTest struct {
	name string
	run  func(t *testing.T, s *suite)
}

// extraTests run after the suite's own subtests, in this order, before DeleteLeavesNothing.
var extraTests = []extraTest{
	{"StalePublicationForOldNodeRefused", testStalePublication},
	{"DuplicateHostNQNRefused", testDuplicateHostNQN},
	{"SnapshotRestoredOnAnotherNode", testSnapshotRestore},
	{"MeasureRandomIOPS", testMeasureRandomIOPS},
}

// Expected: a volume is published to worker A, written and unstaged there, then moved to worker
// B (ControllerUnpublish A, ControllerPublish B: publicationGeneration 1 → 2 → 3) and staged on
// B. A stale writer — an older controller replica that still holds the VolumeState as it was
// when the volume was published to A — writes that spec back (publications [A],
// publicationGeneration 1) with a merge patch without resourceVersion, which the API server
// accepts: only the agent can refuse it. The agent on the storage node refuses it: Fenced=True
// StalePublicationGeneration and Ready=False Fenced on the VolumeState, a Warning event
// StalePublicationGeneration on it, plinth_agent_fencing_rejections_total{reason=
// "StalePublicationGeneration"} one higher. The export's ACL keeps exactly B's host NQN
// (allow_any_host 0): A's NodeStage with the publish context it once had fails (the target
// refuses A's connect) and leaves no controller on the worker; B's data still verifies. A newer
// publication (publications [B], generation 4) is admitted again: Fenced goes away.
func testStalePublication(t *testing.T, s *suite) {
	v := s.createVolume(t, "pvc-crossnode-stale", pool+"-nvme", 64<<20)
	defer s.removeVolume(t, v)
	s.publish(t, v, workerA)
	pcA := v.pc
	s.stage(t, s.nodeA, v)
	sum := s.writeFile(t, v, "data", 4)
	s.unstage(t, s.nodeA, v)
	if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: workerA}); err != nil {
		t.Fatalf("ControllerUnpublish A: %v", err)
	}
	s.publish(t, v, workerB)
	s.stage(t, s.nodeB, v)
	defer func() {
		s.unstage(t, s.nodeB, v)
		if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: workerB}); err != nil {
			t.Errorf("ControllerUnpublish B: %v", err)
		}
	}()
	vs := s.volumeState(t, v.id)
	if vs.Spec.PublicationGeneration != 3 || vs.Status.ObservedPublicationGeneration != 3 {
		t.Fatalf("publicationGeneration %d observed %d after publish A, unpublish A, publish B; want 3 and 3",
			vs.Spec.PublicationGeneration, vs.Status.ObservedPublicationGeneration)
	}
	rejectionsBefore := s.agentCounter(t, `plinth_agent_fencing_rejections_total{reason="StalePublicationGeneration"}`)

	stale := map[string]any{"spec": map[string]any{
		"publications":          []storev1.Publication{{NodeName: workerA, HostNQN: hostNQNA, AccessMode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String()}},
		"publicationGeneration": 1,
	}}
	s.mergePatch(t, v.id, stale)
	controlplane.Eventually(t, 2*time.Minute, 500*time.Millisecond, "the agent refuses the stale publication", func() error {
		vs = s.volumeState(t, v.id)
		c := apimeta.FindStatusCondition(vs.Status.Conditions, storev1.ConditionFenced)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != storev1.ReasonStalePublicationGeneration || c.ObservedGeneration != vs.Generation {
			return fmt.Errorf("Fenced %+v (generation %d)", c, vs.Generation)
		}
		return nil
	})
	if r := apimeta.FindStatusCondition(vs.Status.Conditions, storev1.ConditionReady); r == nil || r.Status != metav1.ConditionFalse || r.Reason != storev1.ReasonFenced {
		t.Errorf("Ready %+v, want False Fenced", r)
	}
	t.Logf("reported: %s", apimeta.FindStatusCondition(vs.Status.Conditions, storev1.ConditionFenced).Message)
	s.waitEvent(t, v.id, storev1.ReasonStalePublicationGeneration, "Warning")
	if after := s.agentCounter(t, `plinth_agent_fencing_rejections_total{reason="StalePublicationGeneration"}`); after != rejectionsBefore+1 {
		t.Errorf("plinth_agent_fencing_rejections_total{reason=StalePublicationGeneration} %v → %v, want +1", rejectionsBefore, after)
	}
	if hosts, anyHost := s.allowedHosts(t, v.nqn); anyHost != "0" || len(hosts) != 1 || hosts[0] != hostNQNB {
		t.Errorf("ACL after the stale publication: allow_any_host=%s hosts %v, want only %s", anyHost, hosts, hostNQNB)
	}
	// A acts on what it was once given: the target must turn its connect away.
	_, err := s.nodeA.NodeStageVolume(t.Context(), &csipb.NodeStageVolumeRequest{VolumeId: v.id, PublishContext: pcA,
		StagingTargetPath: v.staging, VolumeCapability: v.capability, VolumeContext: v.vc})
	if err == nil {
		t.Errorf("worker A staged the volume after the stale publication")
	} else {
		t.Logf("A's NodeStage: %v", err)
	}
	if a := s.controllerAttrs(t, s.worker, v.nqn); len(a) != 0 {
		t.Errorf("worker A holds controllers of %s: %v", v.nqn, a)
	}
	if _, err := s.nodeA.NodeUnstageVolume(t.Context(), &csipb.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging}); err != nil {
		t.Errorf("NodeUnstage on A after the refused stage: %v", err)
	}
	if got := s.readSum(t, s.storage, v, "data"); got != sum {
		t.Errorf("B reads %s, A wrote %s", got, sum)
	}

	// The current controller's next write is newer than anything acted on: admitted.
	s.mergePatch(t, v.id, map[string]any{"spec": map[string]any{
		"publications":          []storev1.Publication{{NodeName: workerB, HostNQN: hostNQNB, AccessMode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String()}},
		"publicationGeneration": 4,
	}})
	controlplane.Eventually(t, 2*time.Minute, 500*time.Millisecond, "a newer publication is admitted", func() error {
		vs = s.volumeState(t, v.id)
		if c := apimeta.FindStatusCondition(vs.Status.Conditions, storev1.ConditionFenced); c != nil {
			return fmt.Errorf("still Fenced: %+v", c)
		}
		if vs.Status.ObservedPublicationGeneration != 4 || !apimeta.IsStatusConditionTrue(vs.Status.Conditions, storev1.ConditionReady) {
			return fmt.Errorf("observedPublicationGeneration %d, conditions %+v", vs.Status.ObservedPublicationGeneration, vs.Status.Conditions)
		}
		return nil
	})
	if hosts, anyHost := s.allowedHosts(t, v.nqn); anyHost != "0" || len(hosts) != 1 || hosts[0] != hostNQNB {
		t.Errorf("ACL after the newer publication: allow_any_host=%s hosts %v, want only %s", anyHost, hosts, hostNQNB)
	}
}

// Expected: a third node plugin, node worker-c in the worker guest, starts with worker A's host
// NQN (a cloned machine image): its registration is rejected — Node worker-c gets neither the
// plinth.dev/host-nqn annotation nor the initiator label, and a Warning event DuplicateHostNQN
// on Node worker-c names worker-a and worker-c. With worker-c's Node annotated with that NQN
// anyway (as a plugin without this check would have left it), ControllerPublish of a volume to
// worker-a and to worker-c both answer FAILED_PRECONDITION naming both nodes, with a Warning
// event on the Node; the VolumeState's publications stay empty (publicationGeneration 0) and
// the export admits no host: allowed_hosts empty, allow_any_host 0 — never any host. Once the
// duplicate is gone, publish to worker-a succeeds and the ACL holds A's NQN alone.
func testDuplicateHostNQN(t *testing.T, s *suite) {
	const workerC = "worker-c"
	create(t, s.c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: workerC}})
	defer s.c.Delete(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: workerC}}) //nolint:errcheck
	s.worker.sh(t, time.Minute, fmt.Sprintf("(/tmp/plinth csi --mode node --endpoint tcp://127.0.0.1:50053 --node-name %s --kubeconfig %s/kubeconfig "+
		"--state-dir /tmp/csi-%s --host-nqn-file /etc/nvme/hostnqn --registration-dir= --health-address= -v 2 >/tmp/csi-%s.log 2>&1 & echo $! > /tmp/csi-%s.pid)",
		workerC, guest.SharePath, workerC, workerC, workerC))
	defer s.worker.try(time.Minute, fmt.Sprintf("kill $(cat /tmp/csi-%s.pid)", workerC)) //nolint:errcheck
	ev := s.waitEvent(t, workerC, hostnqn.ReasonDuplicate, "Warning")
	if !strings.Contains(ev, workerA) || !strings.Contains(ev, workerC) || !strings.Contains(ev, hostNQNA) {
		t.Errorf("event %q does not name %s, %s and the NQN", ev, workerA, workerC)
	}
	var n corev1.Node
	if err := s.c.Get(t.Context(), client.ObjectKey{Name: workerC}, &n); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations[policyv1.AnnotationHostNQN]; ok || n.Labels[policyv1.LabelNVMeInitiator] != "" {
		t.Errorf("node %s registered despite the duplicate: labels %v annotations %v", workerC, n.Labels, n.Annotations)
	}

	// The annotation anyway: the controller must not grant the NQN to either node.
	s.annotateHostNQN(t, workerC, hostNQNA)
	v := s.createVolume(t, "pvc-crossnode-dupnqn", pool+"-nvme", 16<<20)
	defer s.removeVolume(t, v)
	exp := s.volumeState(t, v.id).Status.Export
	if exp == nil {
		t.Fatalf("volume %s has no export after CreateVolume", v.id)
	}
	v.nqn = exp.NQN
	for _, node := range []string{workerA, workerC} {
		_, err := s.ctrl.ControllerPublishVolume(t.Context(), &csipb.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: node, VolumeCapability: v.capability})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), workerA) || !strings.Contains(err.Error(), workerC) {
			t.Errorf("publish to %s with the NQN presented twice: %v, want FAILED_PRECONDITION naming both nodes", node, err)
		}
	}
	s.waitEvent(t, workerA, hostnqn.ReasonDuplicate, "Warning")
	if vs := s.volumeState(t, v.id); len(vs.Spec.Publications) != 0 || vs.Spec.PublicationGeneration != 0 {
		t.Errorf("publications %+v generation %d after the refusals, want none", vs.Spec.Publications, vs.Spec.PublicationGeneration)
	}
	if hosts, anyHost := s.allowedHosts(t, v.nqn); anyHost != "0" || len(hosts) != 0 {
		t.Errorf("ACL with the NQN presented twice: allow_any_host=%s hosts %v, want 0 and none", anyHost, hosts)
	}

	s.annotateHostNQN(t, workerC, "")
	controlplane.Eventually(t, time.Minute, 500*time.Millisecond, "publish to worker-a once the duplicate is gone", func() error {
		pub, err := s.ctrl.ControllerPublishVolume(t.Context(), &csipb.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: workerA, VolumeCapability: v.capability})
		if err != nil {
			return err
		}
		v.pc = pub.GetPublishContext()
		return nil
	})
	if hosts, anyHost := s.allowedHosts(t, v.nqn); anyHost != "0" || len(hosts) != 1 || hosts[0] != hostNQNA {
		t.Errorf("ACL after publishing to A: allow_any_host=%s hosts %v, want only %s", anyHost, hosts, hostNQNA)
	}
	if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: workerA}); err != nil {
		t.Errorf("ControllerUnpublish A: %v", err)
	}
}

// volumeState reads the VolumeState of id.
func (s *suite) volumeState(t testing.TB, id string) *storev1.VolumeState {
	t.Helper()
	vs := &storev1.VolumeState{}
	if err := s.c.Get(t.Context(), client.ObjectKey{Name: id}, vs); err != nil {
		t.Fatalf("VolumeState %s: %v", id, err)
	}
	return vs
}

// mergePatch applies a JSON merge patch to the VolumeState's spec, without resourceVersion.
func (s *suite) mergePatch(t testing.TB, id string, patch map[string]any) {
	t.Helper()
	b, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	vs := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: id}}
	if err := s.c.Patch(t.Context(), vs, client.RawPatch(types.MergePatchType, b)); err != nil {
		t.Fatalf("merge patch of VolumeState %s: %v", id, err)
	}
}

// annotateHostNQN sets (or with "" removes) a Node's plinth.dev/host-nqn, standing in for a
// node plugin that registered without the duplicate check.
func (s *suite) annotateHostNQN(t testing.TB, node, nqn string) {
	t.Helper()
	var val any = nqn
	if nqn == "" {
		val = nil
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{policyv1.AnnotationHostNQN: val}}})
	if err := s.c.Patch(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, b)); err != nil {
		t.Fatalf("annotate Node %s: %v", node, err)
	}
}

// waitEvent waits for an event of type typ and reason about the object named name (cluster-scoped
// objects' events live in the default namespace) and returns its message.
func (s *suite) waitEvent(t testing.TB, name, reason, typ string) string {
	t.Helper()
	var msg string
	controlplane.Eventually(t, 2*time.Minute, 500*time.Millisecond, fmt.Sprintf("event %s %s about %s", typ, reason, name), func() error {
		var list corev1.EventList
		if err := s.c.List(t.Context(), &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return err
		}
		var seen []string
		for _, e := range list.Items {
			if e.InvolvedObject.Name != name {
				continue
			}
			seen = append(seen, e.Type+" "+e.Reason)
			if e.Reason == reason && e.Type == typ {
				msg = e.Message
				return nil
			}
		}
		return fmt.Errorf("events about %s: %v", name, seen)
	})
	t.Logf("event %s %s about %s: %s", typ, reason, name, msg)
	return msg
}

// metric reads one sample (the exact series name with labels, as /metrics prints it) from the
// /metrics of a process in guest g at addr; 0 when the series is absent.
func metric(t testing.TB, g *vm, addr, series string) float64 {
	t.Helper()
	out := g.sh(t, time.Minute, fmt.Sprintf("wget -q -O - http://%s/metrics", addr))
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", series, line, err)
			}
			return f
		}
	}
	return 0
}

// agentCounter reads a series of the storage node's agent.
func (s *suite) agentCounter(t testing.TB, series string) float64 {
	t.Helper()
	return metric(t, s.storage, agentMetricsAddr, series)
}

// removeVolume deletes a volume made by an extra test (DeleteVolume waits for the agent).
func (s *suite) removeVolume(t testing.TB, v *volume) {
	t.Helper()
	if _, err := s.ctrl.DeleteVolume(t.Context(), &csipb.DeleteVolumeRequest{VolumeId: v.id}); err != nil {
		t.Errorf("DeleteVolume %s: %v", v.id, err)
	}
}

// Metrics of the guests' processes, read with wget inside the guest.
const agentMetricsAddr = "127.0.0.1:8080"

// nodeMetricsAddr is where the node plugin serving CSI on port serves /metrics.
func nodeMetricsAddr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port+1000) }
