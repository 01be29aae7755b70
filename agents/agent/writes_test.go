package agent_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// testWritesPerVolume (TestHostFileBackend/WritesPerVolume): the agent writes a VolumeState
// exactly twice in its life when its work is quick: its status once, straight to Ready, and
// the release of its finalizer once the volume is gone. The VolumeStates are made as
// CreateVolume makes them (the agent's finalizer and the node and pool labels set at create), on
// a Store that has reported its capacity (CreateVolume chooses no other). Counted at the agent's
// own transport, failed requests included: a status written twice, a write that changes
// nothing, a progress phase or a finalizer the agent adds itself each show up as one more.
func testWritesPerVolume(t *testing.T, e *env) {
	ctx := context.Background()
	const nodeName, n = "node-writes", 5
	s, decl, state := fileStore(t, e, nodeName)
	w := controlplane.NewWriteCounter("volumestates")
	r := &runner{t: t, cfg: w.Wrap(e.cfg)}
	r.start(agent.Options{
		NodeName: nodeName, StateDir: state, RefreshInterval: time.Hour, MetricsAddr: "0", ProbeAddr: "0",
		HostNQNFile: filepath.Join(state, "hostnqn"), NVMetRoot: filepath.Join(state, "nvmet"),
		// the progress phases of slow work are testProgressMark's: here every volume's work is
		// quick, on a loaded machine too
		ProgressAfter: time.Minute,
	})
	defer r.stop()
	eventually(t, 60*time.Second, "Store capacity", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return err
		}
		if s.Status.Capacity == nil {
			return errors.New("no capacity reported")
		}
		return nil
	})

	local := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	vols := make([]*storev1.VolumeState, n)
	for i := range vols {
		vols[i] = newVolumeState(fmt.Sprintf("writes-%d", i), nodeName, pool, s.Name, mib, local, decl)
		vols[i].Finalizers = []string{agent.FinalizerVolume} // as CreateVolume creates it
		if err := e.c.Create(ctx, vols[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, vs := range vols {
		eventually(t, 60*time.Second, vs.Name+" Ready", func() error { _, err := readyVS(ctx, e.c, vs.Name); return err })
	}
	for _, vs := range vols {
		if got, want := w.Of(vs.Name), map[string]int{"PATCH /status": 1}; !maps.Equal(got, want) {
			t.Errorf("%s: agent writes until Ready %v, want %v", vs.Name, got, want)
		}
		if err := e.c.Delete(ctx, vs); err != nil {
			t.Fatal(err)
		}
	}
	for _, vs := range vols {
		eventually(t, 60*time.Second, vs.Name+" deleted", func() error { return gone(ctx, e.c, vs) })
	}
	for _, vs := range vols {
		if got, want := w.Of(vs.Name), map[string]int{"PATCH /status": 1, "PUT": 1}; !maps.Equal(got, want) {
			t.Errorf("%s: agent writes over its life %v, want %v (the finalizer's release)", vs.Name, got, want)
		}
	}
	if got := w.Of(""); len(got) != 0 {
		t.Errorf("agent created VolumeStates: %v", got)
	}
}

// fileStore creates the Store of pool for node nodeName on a file backend in a temporary
// folder, and returns it with its backend declaration and a state folder for the node's agent.
func fileStore(t *testing.T, e *env, nodeName string) (*storev1.Store, policyv1.Backend, string) {
	t.Helper()
	decl := policyv1.Backend{File: &policyv1.FileBackend{Directory: filepath.Join(t.TempDir(), "vols")}}
	s := &storev1.Store{}
	s.Name = nodeName + "-store"
	s.Labels = nodeLabels(nodeName, pool)
	s.Spec = storev1.StoreSpec{Pool: pool, NodeName: nodeName, Backend: decl, Reserve: "1Mi", DriftPolicy: policyv1.DriftPolicyReport}
	if err := e.c.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return s, decl, t.TempDir()
}
