package agent_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/internal/hostnqn"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// An agent whose node's host NQN another node's Agent already registered (cloned machine
// images share /etc/nvme/hostnqn): its registration is rejected — its Agent's status.hostNQN
// stays empty, HostNQNConflict=True with reason DuplicateHostNQN names both nodes and the NQN,
// a Warning event DuplicateHostNQN on its Agent says the same, and the Ready message mentions
// it. The first node's Agent is left alone. Once the other node no longer presents the NQN, the
// next heartbeat registers it and the condition goes away.
func TestAgentRejectsDuplicateHostNQN(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	const first, second = "nqn-first", "nqn-second"
	a1 := &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: first}, Spec: storev1.AgentSpec{NodeName: first}}
	if err := e.c.Create(ctx, a1); err != nil {
		t.Fatal(err)
	}
	// the first node's agent registered the NQN (its status, written here in its stead)
	a1.Status.HostNQN = hostNQN
	if err := e.c.Status().Update(ctx, a1); err != nil {
		t.Fatal(err)
	}
	a2 := &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: second}, Spec: storev1.AgentSpec{NodeName: second}}
	if err := e.c.Create(ctx, a2); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	nqnFile := filepath.Join(state, "hostnqn")
	if err := os.WriteFile(nqnFile, []byte(hostNQN+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &runner{t: t, cfg: e.cfg}
	r.start(agent.Options{NodeName: second, StateDir: state, RefreshInterval: 500 * time.Millisecond, MetricsAddr: "0", ProbeAddr: "0",
		HostNQNFile: nqnFile, SysRoot: t.TempDir(), NVMetRoot: filepath.Join(state, "no-nvmet")})
	defer r.stop()

	var cond *metav1.Condition
	eventually(t, 60*time.Second, "registration rejected", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(a2), a2); err != nil {
			return err
		}
		cond = apimeta.FindStatusCondition(a2.Status.Conditions, storev1.ConditionHostNQNConflict)
		if a2.Status.LastHeartbeatTime == nil || cond == nil {
			return errors.New("no conflict reported yet")
		}
		return nil
	})
	if a2.Status.HostNQN != "" {
		t.Errorf("rejected registration: status.hostNQN %q, want empty", a2.Status.HostNQN)
	}
	if cond.Status != metav1.ConditionTrue || cond.Reason != hostnqn.ReasonDuplicate {
		t.Errorf("HostNQNConflict %+v, want True %s", cond, hostnqn.ReasonDuplicate)
	}
	for _, want := range []string{first, second, hostNQN} {
		if !strings.Contains(cond.Message, want) {
			t.Errorf("HostNQNConflict message %q lacks %q", cond.Message, want)
		}
	}
	if rc := apimeta.FindStatusCondition(a2.Status.Conditions, agent.CondReady); rc == nil || !strings.Contains(rc.Message, "host NQN not registered") {
		t.Errorf("Ready %+v does not mention the rejected registration", rc)
	}
	eventually(t, 30*time.Second, "event DuplicateHostNQN on the Agent", func() error {
		var list corev1.EventList
		if err := e.c.List(ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.InvolvedObject.Name == second && ev.InvolvedObject.Kind == "Agent" && ev.Reason == hostnqn.ReasonDuplicate && ev.Type == corev1.EventTypeWarning {
				if !strings.Contains(ev.Message, first) || !strings.Contains(ev.Message, second) {
					return fmt.Errorf("event %q does not name both nodes", ev.Message)
				}
				return nil
			}
		}
		return errors.New("no event yet")
	})
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(a1), a1); err != nil || a1.Status.HostNQN != hostNQN {
		t.Errorf("first node's Agent: hostNQN %q (%v), want %s kept", a1.Status.HostNQN, err, hostNQN)
	}

	// the first node got its own NQN (its agent reports the new one)
	a1.Status.HostNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000ff"
	if err := e.c.Status().Update(ctx, a1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "registered once the NQN is unique", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(a2), a2); err != nil {
			return err
		}
		if a2.Status.HostNQN != hostNQN || apimeta.FindStatusCondition(a2.Status.Conditions, storev1.ConditionHostNQNConflict) != nil {
			return fmt.Errorf("hostNQN %q conditions %+v", a2.Status.HostNQN, a2.Status.Conditions)
		}
		return nil
	})
}
