package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/controllers/moveexec"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// startMoveStep runs the controller's part of moves (controllers/moveexec) in this process
// until the test ends.
func startMoveStep(t *testing.T, e *env) {
	t.Helper()
	mgr, err := ctrl.NewManager(e.cfg, ctrl.Options{Scheme: agent.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := (&moveexec.Reconciler{Client: mgr.GetClient(), Events: mgr.GetEventRecorder("plinth-controller"), SkipNameValidation: true}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// guestMove moves an NVMe-oF volume holding data from the thin LVM Store to the ZFS Store of
// the same guest (made by CrashPoints), with the agent crashed once after the verified copy:
// the zvol then holds the bytes written into the LV (sha256sum in the guest), the LV is gone,
// and an initiator let in afterwards (a publication, as for the restarted consumer) reads the
// same bytes through the same subsystem NQN, now served from the zvol.
func guestMove(t *testing.T, e *env, g guestT, thinStore string, thin policyv1.Backend) {
	ctx := t.Context()
	start := time.Now()
	startMoveStep(t, e)
	zfsStore := storev1.StoreName("zfs", guestNode)
	nvmeof := policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "127.0.0.0/8"}}
	vs := newVolumeState("pvc-guest-move", guestNode, "thin", thinStore, 64<<20, nvmeof, thin)
	if err := e.c.Create(ctx, vs); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "Ready on the thin Store", func() (err error) {
		got, err := readyVS(ctx, e.c, vs.Name)
		if err == nil {
			*vs = *got
		}
		return err
	})
	lv := "/dev/plinth-agent/" + vs.Name
	g.sh(fmt.Sprintf("dd if=/dev/urandom of=%s bs=1M count=64 oflag=direct status=none", lv))
	sum := strings.Fields(g.sh("sha256sum " + lv))[0]
	nqn := vs.Status.Export.NQN

	armed := g.rearm(failpoint.MoveCopied + "=once")
	eventually(t, 30*time.Second, "spec.move set", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
			return err
		}
		vs.Spec.Move = &storev1.VolumeMove{ID: "guest-1", SourceStore: thinStore, TargetStore: zfsStore}
		return e.c.Update(ctx, vs)
	})
	if code := g.waitExit(armed+1, 2*time.Minute); code != failpoint.ExitCode {
		t.Fatalf("agent exited with %d, want %d (crash point %s)", code, failpoint.ExitCode, failpoint.MoveCopied)
	}
	g.sh("echo go > /tmp/agent-resume")
	eventually(t, 3*time.Minute, "move Done, Ready on the ZFS Store", func() error {
		got, err := readyVS(ctx, e.c, vs.Name)
		if err != nil {
			return err
		}
		*vs = *got
		if st := vs.Status.Move; vs.Spec.Move != nil || st == nil || st.Phase != storev1.MoveDone || vs.Spec.StoreName != zfsStore {
			return fmt.Errorf("storeName %s, spec.move %+v, status.move %+v", vs.Spec.StoreName, vs.Spec.Move, vs.Status.Move)
		}
		return nil
	})
	t.Logf("TIMING guest move-64MiB %s (copy %s)", time.Since(start).Round(time.Millisecond), vs.Status.Move.CopiedAt.Sub(vs.Status.Move.StartedAt.Time))
	zvol := "/dev/zvol/plinthz/vols/" + vs.Name
	if got := strings.Fields(g.sh("sha256sum " + zvol))[0]; got != sum || vs.Status.Move.Checksum != "sha256:"+sum {
		t.Errorf("zvol %s holds %s, status.move.checksum %s; the LV held %s", zvol, got, vs.Status.Move.Checksum, sum)
	}
	if out, code := g.try("lvs --noheadings -o lv_name plinth-agent/" + vs.Name); code == 0 {
		t.Errorf("the source LV is still there: %s", out)
	}
	if vs.Status.Export == nil || vs.Status.Export.NQN != nqn {
		t.Errorf("export %+v, want the same subsystem NQN %s", vs.Status.Export, nqn)
	}
	ns := strings.TrimSpace(g.sh(fmt.Sprintf("readlink -f $(cat /sys/kernel/config/nvmet/subsystems/%s/namespaces/*/device_path)", nqn)))
	if want := strings.TrimSpace(g.sh("readlink -f " + zvol)); ns != want {
		t.Errorf("the namespace serves %s, want the zvol %s", ns, want)
	}
	// the consumer's side, as after its restart: ControllerPublish lets its host in under
	// the same volume handle, and it reads the same bytes through the same NQN
	eventually(t, 30*time.Second, "published", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
			return err
		}
		vs.Spec.Publications = []storev1.Publication{{NodeName: guestNode, HostNQN: guestHostNQN, AccessMode: "SINGLE_NODE_WRITER"}}
		vs.Spec.PublicationGeneration++
		return e.c.Update(ctx, vs)
	})
	eventually(t, time.Minute, "the publication exported", func() error {
		got, err := readyVS(ctx, e.c, vs.Name)
		if err != nil {
			return err
		}
		if got.Status.ObservedPublicationGeneration != got.Spec.PublicationGeneration {
			return fmt.Errorf("publicationGeneration %d observed %d", got.Spec.PublicationGeneration, got.Status.ObservedPublicationGeneration)
		}
		return nil
	})
	g.sh(fmt.Sprintf("nvme connect -t tcp -a 127.0.0.1 -s 4420 -n %s", nqn))
	defer g.sh(fmt.Sprintf("nvme disconnect -n %s", nqn))
	out := g.sh(fmt.Sprintf(`for i in $(seq 100); do for f in /sys/class/nvme-subsystem/*/subsysnqn; do
  if [ "$(cat $f)" = "%s" ]; then for n in $(dirname $f)/nvme*n*; do d=/dev/$(basename $n); [ -b $d ] && { head -c %d $d | sha256sum; exit 0; }; done; fi; done; sleep 0.1; done; exit 1`, nqn, 64<<20))
	if got := strings.Fields(out)[0]; got != sum {
		t.Errorf("the initiator reads %s through %s, want %s", got, nqn, sum)
	}
}
