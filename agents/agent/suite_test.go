package agent_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/crdtest"
	"github.com/plinth-storage/plinth/test/prereq"
)

// These tests run the agent against the real kube-apiserver and etcd of
// test/framework/controlplane (make testbin) with the file backend on the host's real
// loop devices. They skip without the binaries (fail with
// PLINTH_INTEGRATION=1) and without root or /dev/loop-control.

const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa"

// env is one control plane with the CRDs and a client for a test.
type env struct {
	cfg        *rest.Config
	c          client.Client
	kubeconfig string // the admin's, for agents run as processes
}

func requireLoop(t testing.TB) {
	t.Helper()
	prereq.LoopControl(t)
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvFor(t, controlplane.ForTest(t, controlplane.Options{}))
}

// newEnvFor installs Plinth's CRDs into cp and returns an admin client.
func newEnvFor(t testing.TB, cp *controlplane.ControlPlane) *env {
	t.Helper()
	if err := crdtest.Install(cp); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: agent.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	kc, err := cp.Kubeconfig("admin")
	if err != nil {
		t.Fatal(err)
	}
	return &env{cfg: cp.Admin.Config, c: c, kubeconfig: kc}
}

// runner runs one agent instance at a time and can crash it.
type runner struct {
	t      *testing.T
	cfg    *rest.Config
	opts   agent.Options
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan error
}

func (r *runner) start(opts agent.Options) {
	r.t.Helper()
	mgr, err := agent.NewManager(r.cfg, opts)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	r.mu.Lock()
	r.cancel, r.done = cancel, done
	r.mu.Unlock()
}

// crash cancels the running agent; the reconcile in flight ends where it is.
func (r *runner) crash() {
	r.mu.Lock()
	cancel := r.cancel
	r.mu.Unlock()
	cancel()
}

func (r *runner) wait() {
	r.t.Helper()
	select {
	case err := <-r.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			r.t.Errorf("agent exited: %v", err)
		}
	case <-time.After(60 * time.Second):
		r.t.Fatal("agent did not stop")
	}
}

func (r *runner) stop() { r.crash(); r.wait() }

// eventually polls f until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	controlplane.Eventually(t, timeout, 100*time.Millisecond, what, f)
}

func counter(c *prometheus.CounterVec, label string) float64 {
	m := &dto.Metric{}
	if err := c.WithLabelValues(label).Write(m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

func nodeLabels(node, pool string) map[string]string {
	return map[string]string{policyv1.LabelNode: storev1.NameLabelValue(node), policyv1.LabelPool: storev1.NameLabelValue(pool)}
}

func newVolumeState(csiName, node, pool, store string, size int64, proto policyv1.ProtocolSpec, backend policyv1.Backend) *storev1.VolumeState {
	vs := &storev1.VolumeState{}
	vs.Name = storev1.VolumeID(csiName)
	vs.Labels = nodeLabels(node, pool)
	vs.Spec = storev1.VolumeStateSpec{
		CSIName: csiName, StoreName: store, CapacityBytes: size, VolumeMode: "Filesystem",
		Policy: storev1.FrozenPolicy{Placement: "p", Pool: pool, Protocol: "proto", Backend: backend, ProtocolSpec: proto},
	}
	return vs
}

// ready returns nil when the VolumeState is Ready for its current generation.
func readyVS(ctx context.Context, c client.Client, name string) (*storev1.VolumeState, error) {
	var vs storev1.VolumeState
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &vs); err != nil {
		return nil, err
	}
	rc := apimeta.FindStatusCondition(vs.Status.Conditions, agent.CondReady)
	if vs.Status.Phase != storev1.VolumeReady || rc == nil || rc.Status != "True" || vs.Status.ObservedGeneration != vs.Generation {
		return &vs, fmt.Errorf("phase %q, observedGeneration %d of %d, Ready %+v", vs.Status.Phase, vs.Status.ObservedGeneration, vs.Generation, rc)
	}
	return &vs, nil
}

func gone(ctx context.Context, c client.Client, obj client.Object) error {
	err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("%s still exists (finalizers %v)", obj.GetName(), obj.GetFinalizers())
}
