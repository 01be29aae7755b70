package csi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/stage"
	"github.com/plinth-storage/plinth/internal/hostnqn"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// setHostNQN annotates a Node with a host NQN ("" removes it), as a node plugin registers it.
func setHostNQN(t *testing.T, c client.Client, node, nqn string) {
	t.Helper()
	var val any = nqn
	if nqn == "" {
		val = nil
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{policyv1.AnnotationHostNQN: val}}})
	if err := c.Patch(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, b)); err != nil {
		t.Fatal(err)
	}
}

// eventAbout waits for an event with reason about the object named name and returns its note.
func eventAbout(t *testing.T, c client.Client, name, reason string) string {
	t.Helper()
	var msg string
	controlplane.Eventually(t, 30*time.Second, 100*time.Millisecond, "event "+reason+" about "+name, func() error {
		var list corev1.EventList
		if err := c.List(t.Context(), &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Name == name && e.Reason == reason && e.Type == corev1.EventTypeWarning {
				msg = e.Message
				return nil
			}
		}
		return errors.New("none yet")
	})
	return msg
}

// Two nodes present one host NQN (cloned machine images share /etc/nvme/hostnqn): the export's
// ACL admits by host NQN alone, so granting it to either would admit both. ControllerPublish to
// either node answers FAILED_PRECONDITION naming both, writes no publication (the agent never
// changes the ACL, which never falls back to allowing any host), and records a Warning event
// DuplicateHostNQN on the Node. Once the duplicate is gone the publication goes through.
func TestPublishRefusesDuplicateHostNQN(t *testing.T) {
	pool := fresh("dupnqn")
	a, b := pool+"-a", pool+"-b"
	e := controllerEnv(t, pool, map[string]int64{a: 10 * gib, b: 10 * gib})
	id := nvmeVolume(t, e, pool)
	nqnA := "nqn.2014-08.org.nvmexpress:uuid:" + a
	setHostNQN(t, e.c, b, nqnA)
	pub := func(node string) error {
		_, err := e.ctrl.ControllerPublishVolume(t.Context(), &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: mountCap(rwo)[0]})
		return err
	}
	// the controller reads Nodes from its informer: wait until it sees the duplicate
	controlplane.Eventually(t, 30*time.Second, 100*time.Millisecond, "publish refused", func() error {
		if err := pub(a); status.Code(err) != codes.FailedPrecondition {
			return fmt.Errorf("publish to %s: %v", a, err)
		}
		return nil
	})
	for _, node := range []string{a, b} {
		err := pub(node)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), b) || !strings.Contains(err.Error(), nqnA) {
			t.Errorf("publish to %s: %v, want FAILED_PRECONDITION naming %s, %s and the NQN", node, err, a, b)
		}
	}
	if msg := eventAbout(t, e.c, a, hostnqn.ReasonDuplicate); !strings.Contains(msg, b) {
		t.Errorf("event on %s: %q does not name %s", a, msg, b)
	}
	vs := &storev1.VolumeState{}
	if err := e.c.Get(t.Context(), client.ObjectKey{Name: id}, vs); err != nil {
		t.Fatal(err)
	}
	if len(vs.Spec.Publications) != 0 || vs.Spec.PublicationGeneration != 0 {
		t.Errorf("publications %+v generation %d after the refusals, want none and 0", vs.Spec.Publications, vs.Spec.PublicationGeneration)
	}
	setHostNQN(t, e.c, b, "nqn.2014-08.org.nvmexpress:uuid:"+b)
	controlplane.Eventually(t, 30*time.Second, 100*time.Millisecond, "publish once the NQN is unique", func() error { return pub(a) })
	if err := e.c.Get(t.Context(), client.ObjectKey{Name: id}, vs); err != nil {
		t.Fatal(err)
	}
	if len(vs.Spec.Publications) != 1 || vs.Spec.Publications[0].HostNQN != nqnA {
		t.Errorf("publications %+v, want only %s", vs.Spec.Publications, nqnA)
	}
}

// A node plugin that starts with a host NQN another Node already presents does not register:
// its Node gets neither plinth.dev/host-nqn nor the initiator label (an annotation it had is
// removed), a Warning event DuplicateHostNQN on its Node names both nodes, and the plugin still
// serves (local volumes need it). The node that registered first keeps its registration when
// its plugin restarts.
func TestNodePluginRejectsDuplicateHostNQN(t *testing.T) {
	cp := sharedControlPlane(t)
	c := kubeClient(t, cp.Admin.Config)
	first, second := fresh("nqn-first-"), fresh("nqn-second-")
	nqn := "nqn.2014-08.org.nvmexpress:uuid:" + first
	create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: first, Annotations: map[string]string{policyv1.AnnotationHostNQN: nqn}}})
	// the second node carries the annotation from an earlier registration: it is taken away
	create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: second, Labels: map[string]string{policyv1.LabelNVMeInitiator: "true"}}})
	file := filepath.Join(t.TempDir(), "hostnqn")
	if err := os.WriteFile(file, []byte(nqn+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	conn := startDriver(t, csi.Options{Mode: csi.ModeNode, Config: cp.Admin.Config, NodeName: second, HostNQNFile: file})
	if _, err := csipb.NewIdentityClient(conn).Probe(t.Context(), &csipb.ProbeRequest{}); err != nil {
		t.Fatalf("the rejected node's plugin does not serve: %v", err)
	}
	msg := eventAbout(t, c, second, hostnqn.ReasonDuplicate)
	if !strings.Contains(msg, first) || !strings.Contains(msg, second) || !strings.Contains(msg, nqn) {
		t.Errorf("event %q does not name %s, %s and the NQN", msg, first, second)
	}
	var n corev1.Node
	if err := c.Get(t.Context(), client.ObjectKey{Name: second}, &n); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations[policyv1.AnnotationHostNQN]; ok || n.Labels[policyv1.LabelNVMeInitiator] != "" {
		t.Errorf("rejected node registered: labels %v annotations %v", n.Labels, n.Annotations)
	}
	// the first node's plugin restarts: its registration stands
	startDriver(t, csi.Options{Mode: csi.ModeNode, Config: cp.Admin.Config, NodeName: first, HostNQNFile: file})
	if err := c.Get(t.Context(), client.ObjectKey{Name: first}, &n); err != nil {
		t.Fatal(err)
	}
	if n.Annotations[policyv1.AnnotationHostNQN] != nqn {
		t.Errorf("first node lost its registration: annotations %v", n.Annotations)
	}
}

// A staged volume whose device vanished (the NVMe-oF controller removed after ctrlLossTmo)
// is reported by the node plugin without anyone asking: once, as a Warning event DeviceGone
// on its VolumeState naming the node, plinth_csi_node_volumes_inaccessible{reason=DeviceGone}
// 1 and plinth_csi_node_volume_failures_total{reason=DeviceGone} 1 — still 1 at the next
// checks; the gauge returns to 0 when the volume is unstaged. A volume whose stage is still
// connecting (its record has no device yet) is never reported.
func TestVolumeHealthReported(t *testing.T) {
	cp := sharedControlPlane(t)
	c := kubeClient(t, cp.Admin.Config)
	node := fresh("health-node-")
	create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	id := storev1.VolumeID(fresh("health-vol-"))
	create(t, c, &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{fakeIgnore: "true"}}, Spec: storev1.VolumeStateSpec{CSIName: id, StoreName: "s", CapacityBytes: 1 << 20, VolumeMode: "Filesystem",
		Policy: storev1.FrozenPolicy{Placement: "p", Pool: "p", Protocol: "p", Backend: policyv1.Backend{File: &policyv1.FileBackend{Directory: "/x"}},
			ProtocolSpec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "127.0.0.0/8"}}}}})
	state := t.TempDir()
	device := filepath.Join(t.TempDir(), "nvme9n1")
	if err := os.WriteFile(device, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	stages := stage.Dir{Path: state}
	if err := stages.Save(stage.Record{VolumeID: id, StagingPath: t.TempDir(), Kind: "nvmeofTcp", Device: device, NQN: "nqn.2014-08.dev.plinth:" + id}); err != nil {
		t.Fatal(err)
	}
	// A second volume whose stage is in progress: NodeStageVolume saves its record before the
	// NVMe-oF connect, with no device yet. It is not inaccessible; the check that reports the
	// first volume checks it too, so the gauge of exactly 1 and the counter of exactly 1 below
	// say it was never reported.
	connecting := storev1.VolumeID(fresh("health-connecting-"))
	if err := stages.Save(stage.Record{VolumeID: connecting, StagingPath: t.TempDir(), Kind: "nvmeofTcp", NQN: "nqn.2014-08.dev.plinth:" + connecting}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	startDriver(t, csi.Options{Mode: csi.ModeNode, Config: cp.Admin.Config, NodeName: node, StateDir: state,
		HostNQNFile: filepath.Join(state, "no-hostnqn"), VolumeHealthInterval: 50 * time.Millisecond, Registerer: reg})
	gauge := func() float64 {
		return gatherValue(t, reg, "plinth_csi_node_volumes_inaccessible", csi.ReasonDeviceGone)
	}
	counter := func() float64 {
		return gatherValue(t, reg, "plinth_csi_node_volume_failures_total", csi.ReasonDeviceGone)
	}
	if g, n := gauge(), counter(); g != 0 || n != 0 {
		t.Fatalf("healthy volume: gauge %v counter %v, want 0 and 0", g, n)
	}
	if err := os.Remove(device); err != nil {
		t.Fatal(err)
	}
	msg := eventAbout(t, c, id, csi.ReasonDeviceGone)
	if !strings.Contains(msg, node) || !strings.Contains(msg, device) {
		t.Errorf("event %q does not name the node %s and the device %s", msg, node, device)
	}
	controlplane.Eventually(t, 10*time.Second, 50*time.Millisecond, "gauge 1", func() error {
		if g := gauge(); g != 1 {
			return fmt.Errorf("gauge %v", g)
		}
		return nil
	})
	// Three more checks, counted by what they report rather than waited for: each step stages
	// one more volume whose device is not there. The check that reports k+1 inaccessible
	// volumes (the gauge, set at its end) also found the first one still gone; the counter,
	// read after the gauge, must be k+1: each volume counted once, none again.
	var gone []string
	for k := 1; k <= 3; k++ {
		extra := storev1.VolumeID(fresh("health-gone-"))
		if err := stages.Save(stage.Record{VolumeID: extra, StagingPath: t.TempDir(), Kind: "nvmeofTcp",
			Device: filepath.Join(t.TempDir(), "nvme9n1"), NQN: "nqn.2014-08.dev.plinth:" + extra}); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, extra)
		controlplane.Eventually(t, 10*time.Second, 50*time.Millisecond, fmt.Sprintf("gauge %d", k+1), func() error {
			if g := gauge(); g != float64(k+1) {
				return fmt.Errorf("gauge %v", g)
			}
			return nil
		})
		if n := counter(); n != float64(k+1) {
			t.Errorf("plinth_csi_node_volume_failures_total{reason=DeviceGone} = %v after the check that found %d volumes gone, want %d (each counted once)", n, k+1, k+1)
		}
	}
	for _, v := range append(gone, id) {
		if err := stages.Remove(v); err != nil {
			t.Fatal(err)
		}
	}
	controlplane.Eventually(t, 10*time.Second, 50*time.Millisecond, "gauge 0 once unstaged", func() error {
		if g := gauge(); g != 0 {
			return fmt.Errorf("gauge %v", g)
		}
		return nil
	})
}

// gatherValue returns the value of the series name{reason=reason} in reg (0 when absent).
func gatherValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					if g := m.GetGauge(); g != nil {
						return g.GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
