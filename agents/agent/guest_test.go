package agent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/kernel/apimux"
	"github.com/plinth-storage/plinth/test/kernel/guest"
)

// The guest suite: `plinth agent` (CGO_ENABLED=0) runs inside the qemu guest
// of test/kernel (Debian's kernel, real LVM thin pool, real nvmet and the
// nvme-tcp initiator) and reaches the host's kube-apiserver through qemu
// guestfwd at 10.0.2.100 (through test/kernel/apimux: guestfwd carries every
// guest connection over one byte stream). The test drives it from the host
// through the API and inspects the kernel with commands run in the guest.
// The agent runs under a restart loop (guestAgentLoop); CrashPoints, last,
// crashes it at named points on thick LVM, thin LVM and ZFS in the same boot.
//
// It boots one guest (about 2–4 minutes under software emulation), so it
// runs only with PLINTH_GUEST_AGENT=1, after make testbin and make
// kernel-assets.
const guestNode = "guest-node"

// guestHostNQN is the guest's /etc/nvme/hostnqn (test/kernel/README.md).
const guestHostNQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001"

type guestT struct {
	t *testing.T
	g *guest.Guest
}

func (g guestT) sh(script string) string {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := g.g.Run(ctx, script, nil)
	if err != nil || res.ExitCode != 0 {
		g.t.Fatalf("guest: %s: exit %d, %v\n%s", script, res.ExitCode, err, res.Output)
	}
	return string(res.Output)
}

func (g guestT) try(script string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := g.g.Run(ctx, script, nil)
	if err != nil {
		return err.Error(), -1
	}
	return string(res.Output), res.ExitCode
}

var (
	commandsRe  = regexp.MustCompile(`(?m)^plinth_agent_backend_commands_total\{backend="lvm"\} (\d+)`)
	refreshesRe = regexp.MustCompile(`(?m)^plinth_agent_operation_duration_seconds_count\{op="refresh"\} (\d+)`)
)

// lvmCounts reads, from one scrape of the agent's /metrics in the guest,
// plinth_agent_backend_commands_total{backend="lvm"} and the number of Store
// refreshes finished (plinth_agent_operation_duration_seconds_count{op="refresh"}).
func (g guestT) lvmCounts() (commands, refreshes int) {
	g.t.Helper()
	out := g.sh("wget -q -O - http://127.0.0.1:18080/metrics")
	for _, c := range []struct {
		re *regexp.Regexp
		n  *int
	}{{commandsRe, &commands}, {refreshesRe, &refreshes}} {
		m := c.re.FindStringSubmatch(out)
		if m == nil {
			g.t.Fatalf("no %s in /metrics", c.re)
		}
		*c.n, _ = strconv.Atoi(m[1])
	}
	return commands, refreshes
}

func TestGuestLVMNVMeoF(t *testing.T) {
	if os.Getenv("PLINTH_GUEST_AGENT") != "1" {
		t.Skip("boots a qemu guest with the agent: set PLINTH_GUEST_AGENT=1 (after make testbin and make kernel-assets)")
	}
	cp := controlplane.ForTest(t, controlplane.Options{})
	root, err := controlplane.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvFor(t, cp)
	ctx := t.Context()

	// the agent binary, static, for the guest
	work := t.TempDir()
	bin := filepath.Join(work, "plinth")
	build := exec.Command("go", "build", "-o", bin, "./cmd/plinth")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build plinth: %v\n%s", err, out)
	}
	mux := exec.Command("go", "build", "-o", filepath.Join(work, "apimux"), "./test/kernel/cmd/apimux")
	mux.Dir = root
	mux.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := mux.CombinedOutput(); err != nil {
		t.Fatalf("build apimux: %v\n%s", err, out)
	}
	demux := apimux.StartForTest(t, cp.URL)

	bootStart := time.Now()
	gg, err := guest.Boot(ctx, guest.Options{
		// vda: the VG; vdb: a device with data; vdc: the thick VG and vdd: the zpool of CrashPoints
		DiskBytes:     []int64{2 << 30, 1 << 30, 512 << 20, 512 << 20},
		GuestForwards: []guest.Forward{{HostPort: demux.Port(), GuestPort: 6443}},
		Timeout:       20 * time.Minute,
	})
	if err != nil {
		t.Fatalf("boot guest: %v", err)
	}
	t.Cleanup(func() { gg.Stop() })
	g := guestT{t, gg}
	t.Logf("TIMING guest-boot %s", time.Since(bootStart).Round(time.Millisecond))

	// the agent talks to apimux on the guest's loopback (the serving
	// certificate names 127.0.0.1 too); apimux carries it to 10.0.2.100:6443
	kc, err := cp.KubeconfigFor("admin", "https://127.0.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gg.ShareDir(), "kubeconfig"), kc, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{bin, filepath.Join(work, "apimux")} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(gg.ShareDir(), filepath.Base(f)), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	g.sh(fmt.Sprintf("cp %s/apimux /tmp/apimux && /tmp/apimux -listen 127.0.0.1:6443 -upstream %s:6443 >/tmp/apimux.log 2>&1 &", guest.SharePath, guest.GuestForwardAddr))
	// a device that carries data: the agent must never touch it
	g.sh("mkfs.ext4 -q /dev/vdb")
	const refresh = 5 * time.Second
	g.sh(fmt.Sprintf("cp %s/plinth /tmp/plinth && %s", guest.SharePath, guestAgentLoop(refresh, guest.SharePath)))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := g.try("tail -n 80 /tmp/agent.log; echo exits: $(cat /tmp/agent-exits); cat /tmp/apimux.log; lvs -a; zfs list -t all; ls -R /sys/kernel/config/nvmet | head -50")
			t.Logf("guest agent log and kernel state:\n%s", out)
		}
	})

	thin := policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "plinth-agent", Devices: []string{"/dev/vda"},
		ThinPool: &policyv1.ThinPool{Name: "pool", SizePercent: 80}}}
	nvmeof := policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "127.0.0.0/8"}}
	storeName := storev1.StoreName("thin", guestNode)

	a := &storev1.Agent{}
	a.Name = guestNode
	a.Spec = storev1.AgentSpec{NodeName: guestNode, Stores: []string{storeName}, NVMeoF: &storev1.NVMeoFEndpoint{Port: 4420, BindCIDR: "127.0.0.0/8"}}
	s := &storev1.Store{}
	s.Name = storeName
	s.Labels = nodeLabels(guestNode, "thin")
	s.Spec = storev1.StoreSpec{Pool: "thin", NodeName: guestNode, Backend: thin, Reserve: "5%", OvercommitPercent: 200, DriftPolicy: policyv1.DriftPolicyReport}
	busy := &storev1.Store{}
	busy.Name = storev1.StoreName("busy", guestNode)
	busy.Labels = nodeLabels(guestNode, "busy")
	busy.Spec = storev1.StoreSpec{Pool: "busy", NodeName: guestNode, Backend: policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "plinth-data", Devices: []string{"/dev/vdb"}}}}
	for _, o := range []client.Object{a, s, busy} {
		if err := e.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("AgentStatus", func(t *testing.T) {
		eventually(t, 3*time.Minute, "Agent Ready", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
				return err
			}
			if !apimeta.IsStatusConditionTrue(a.Status.Conditions, agent.CondReady) {
				return fmt.Errorf("status %+v", a.Status)
			}
			return nil
		})
		if a.Status.Address != "127.0.0.1" || a.Status.HostNQN != guestHostNQN || len(a.Status.Capabilities.KernelModules) != len(agent.KernelModules) {
			t.Errorf("Agent status %+v", a.Status)
		}
	})

	t.Run("StoreThinCapacity", func(t *testing.T) {
		g := guestT{t, gg}
		eventually(t, 3*time.Minute, "Store Ready", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				return err
			}
			if !apimeta.IsStatusConditionTrue(s.Status.Conditions, agent.CondReady) || s.Status.Capacity == nil {
				return fmt.Errorf("conditions %+v", s.Status.Conditions)
			}
			return nil
		})
		c := s.Status.Capacity
		reserve, _ := policyv1.ReserveBytes("5%", c.Total)
		if c.Total <= 0 || c.Total >= 2<<30 || c.Allocatable != c.Total-reserve || c.Available != (c.Total-reserve)*2-c.Provisioned ||
			s.Status.Thin == nil || s.Status.ExtentBytes != 4<<20 {
			t.Errorf("capacity %+v thin %+v extent %d", c, s.Status.Thin, s.Status.ExtentBytes)
		}
		// the pool really is a thin pool of 80 % of the VG
		out := g.sh("lvs --noheadings -o lv_name,segtype plinth-agent")
		if !strings.Contains(out, "pool") || !strings.Contains(out, "thin-pool") {
			t.Errorf("lvs: %s", out)
		}
	})

	t.Run("DeviceWithDataRefused", func(t *testing.T) {
		g := guestT{t, gg}
		eventually(t, 2*time.Minute, "busy Store refused", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(busy), busy); err != nil {
				return err
			}
			rc := apimeta.FindStatusCondition(busy.Status.Conditions, agent.CondReady)
			if rc == nil || rc.Status != "False" || rc.Reason != agent.ReasonDeviceNotEmpty {
				return fmt.Errorf("Ready %+v", rc)
			}
			return nil
		})
		if out := g.sh("blkid -p -o value -s TYPE /dev/vdb"); strings.TrimSpace(out) != "ext4" {
			t.Errorf("/dev/vdb was touched: blkid says %q", out)
		}
	})

	vs := newVolumeState("pvc-guest", guestNode, "thin", storeName, 64<<20, nvmeof, thin)
	vs.Spec.Publications = []storev1.Publication{{NodeName: guestNode, HostNQN: guestHostNQN, AccessMode: "SINGLE_NODE_WRITER"}}
	vs.Spec.PublicationGeneration = 1
	nqn, _ := nvmet.VolumeNQN(vs.Name)
	connect := func(t *testing.T, wantBytes int64) {
		t.Helper()
		g := guestT{t, gg}
		g.sh(fmt.Sprintf("nvme connect -t tcp -a 127.0.0.1 -s 4420 -n %s", nqn))
		defer g.sh(fmt.Sprintf("nvme disconnect -n %s", nqn))
		out := g.sh(fmt.Sprintf(`for i in $(seq 100); do for f in /sys/class/nvme-subsystem/*/subsysnqn; do
  if [ "$(cat $f)" = "%s" ]; then for n in $(dirname $f)/nvme*n*; do d=/dev/$(basename $n); [ -b $d ] && { blockdev --getsize64 $d; exit 0; }; done; fi; done; sleep 0.1; done; exit 1`, nqn))
		if n, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64); n != wantBytes {
			t.Errorf("the initiator sees %s bytes, want %d", strings.TrimSpace(out), wantBytes)
		}
	}

	t.Run("CreateExportConnect", func(t *testing.T) {
		g := guestT{t, gg}
		start := time.Now()
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		var got *storev1.VolumeState
		eventually(t, 3*time.Minute, "VolumeState Ready", func() (err error) { got, err = readyVS(ctx, e.c, vs.Name); return err })
		t.Logf("TIMING guest volumestate-create-to-ready %s", time.Since(start).Round(time.Millisecond))
		if got.Status.Export == nil || got.Status.Export.NQN != nqn || got.Status.Export.Address != "127.0.0.1" || got.Status.Export.Port != 4420 ||
			got.Status.DevicePath != "/dev/plinth-agent/"+vs.Name || got.Status.ActualBytes != 64<<20 {
			t.Fatalf("status %+v", got.Status)
		}
		hosts := g.sh(fmt.Sprintf("ls /sys/kernel/config/nvmet/subsystems/%s/allowed_hosts", nqn))
		if strings.TrimSpace(hosts) != guestHostNQN {
			t.Errorf("allowed hosts %q", hosts)
		}
		connect(t, 64<<20)
		*vs = *got
	})

	t.Run("IdleIsOneVgsLvsPairPerRefresh", func(t *testing.T) {
		g := guestT{t, gg}
		// Counted, not slept: wait (bounded) until at least eight Store refreshes have finished,
		// then compare the LVM commands to the refreshes that ran. Per refresh at most: the thin
		// store one vgs+lvs pair; the refused store one vgs (no VG) and one blkid -p (the device
		// still has data), and less once its failed Ensure backs off. A refresh in flight at the
		// second scrape has run some of its commands without being counted: up to two per store.
		c0, r0 := g.lvmCounts()
		var c1, r1 int
		eventually(t, 12*refresh, "eight Store refreshes", func() error {
			if c1, r1 = g.lvmCounts(); r1-r0 < 8 {
				return fmt.Errorf("%d refreshes", r1-r0)
			}
			return nil
		})
		commands, refreshes := c1-c0, r1-r0
		t.Logf("idle: %d LVM commands over %d Store refreshes", commands, refreshes)
		const perRefresh, inFlight = 2, 2 * 2
		if commands > perRefresh*refreshes+inFlight {
			t.Errorf("%d LVM commands while idle over %d Store refreshes, want at most %d (one vgs+lvs pair per store and refresh)",
				commands, refreshes, perRefresh*refreshes+inFlight)
		}
		if commands == 0 {
			t.Errorf("no LVM command over %d Store refreshes: the refreshes did not look at the VG", refreshes)
		}
	})

	t.Run("ExpandRevalidates", func(t *testing.T) {
		g := guestT{t, gg}
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
			t.Fatal(err)
		}
		vs.Spec.CapacityBytes = 96 << 20
		if err := e.c.Update(ctx, vs); err != nil {
			t.Fatal(err)
		}
		eventually(t, 3*time.Minute, "expanded", func() error {
			v, err := readyVS(ctx, e.c, vs.Name)
			if err == nil && v.Status.ActualBytes != 96<<20 {
				return errors.New("not yet")
			}
			return err
		})
		if out := g.sh("lvs --noheadings --units b --nosuffix -o lv_size plinth-agent/" + vs.Name); strings.TrimSpace(out) != strconv.Itoa(96<<20) {
			t.Errorf("LV size %q after expand", out)
		}
		connect(t, 96<<20)
	})

	t.Run("ExportRemovedByHand", func(t *testing.T) {
		g := guestT{t, gg}
		// remove the export the way an operator would, in the kernel's order
		g.sh(fmt.Sprintf(`set -e; C=/sys/kernel/config/nvmet; N=%s
for l in $C/ports/*/subsystems/$N; do rm $l; done
echo 0 > $C/subsystems/$N/namespaces/1/enable; rmdir $C/subsystems/$N/namespaces/1
for h in $C/subsystems/$N/allowed_hosts/*; do rm $h; done
rmdir $C/subsystems/$N`, nqn))
		eventually(t, 2*time.Minute, "Drifted under Report", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			c := apimeta.FindStatusCondition(vs.Status.Conditions, agent.CondDrifted)
			if c == nil || c.Status != "True" || c.Reason != agent.KindExport+agent.DriftMissing {
				return fmt.Errorf("Drifted %+v", c)
			}
			return nil
		})
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			t.Fatal(err)
		}
		if !apimeta.IsStatusConditionTrue(s.Status.Conditions, agent.CondDrifted) {
			t.Errorf("Store not Drifted: %+v", s.Status.Conditions)
		}
		if _, code := g.try("test -d /sys/kernel/config/nvmet/subsystems/" + nqn); code == 0 {
			t.Fatal("export recreated under driftPolicy Report")
		}
		// switch the pool to Correct: the agent re-exports
		s.Spec.DriftPolicy = policyv1.DriftPolicyCorrect
		if err := e.c.Update(ctx, s); err != nil {
			t.Fatal(err)
		}
		eventually(t, 2*time.Minute, "corrected", func() error {
			v, err := readyVS(ctx, e.c, vs.Name)
			if err != nil {
				return err
			}
			if apimeta.IsStatusConditionTrue(v.Status.Conditions, agent.CondDrifted) {
				return errors.New("still Drifted")
			}
			return nil
		})
		connect(t, 96<<20)
	})

	t.Run("Delete", func(t *testing.T) {
		g := guestT{t, gg}
		// The delete is cut at agent.delete.unexported: the NVMe-oF export is gone, the LV not.
		armed := g.rearm(failpoint.AgentDeleteUnexported + "=once")
		if err := e.c.Delete(ctx, vs); err != nil {
			t.Fatal(err)
		}
		// Expected: the agent's next exit is with failpoint.ExitCode at the point.
		if code := g.waitExit(armed+1, 2*time.Minute); code != failpoint.ExitCode {
			t.Fatalf("agent exited with %d, want %d (crash point %s)", code, failpoint.ExitCode, failpoint.AgentDeleteUnexported)
		}
		if _, code := g.try("test -d /sys/kernel/config/nvmet/subsystems/" + nqn); code == 0 {
			t.Errorf("after the crash at %s: subsystem %s still there", failpoint.AgentDeleteUnexported, nqn)
		}
		if out, code := g.try("lvs --noheadings -o lv_name plinth-agent/" + vs.Name); code != 0 {
			t.Errorf("after the crash at %s: LV %s gone already: %s", failpoint.AgentDeleteUnexported, vs.Name, out)
		}
		var held storev1.VolumeState
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), &held); err != nil || len(held.Finalizers) != 1 {
			t.Errorf("after the crash at %s: VolumeState %v, finalizers %v; want it held by one", failpoint.AgentDeleteUnexported, err, held.Finalizers)
		}
		if m, found := g.guestMark(vs.Name); !found || m.Released {
			t.Errorf("after the crash at %s: mark %+v found=%v, want it unreleased", failpoint.AgentDeleteUnexported, m, found)
		}
		g.sh("echo go > /tmp/agent-resume")
		// Expected: the restarted agent finishes the delete (an export already gone is no error).
		eventually(t, 3*time.Minute, "VolumeState gone", func() error { return gone(ctx, e.c, vs) })
		if out, code := g.try("lvs --noheadings -o lv_name plinth-agent/" + vs.Name); code == 0 {
			t.Errorf("LV still there: %s", out)
		}
		if _, code := g.try("test -d /sys/kernel/config/nvmet/subsystems/" + nqn); code == 0 {
			t.Error("subsystem still there")
		}
		if m, found := g.guestMark(vs.Name); !found || !m.Released {
			t.Errorf("mark after the delete: %+v found=%v, want released", m, found)
		}
		if all := g.exits(); len(all) != armed+1 {
			t.Errorf("agent exits %v, want one (at the crash point) after the first %d", all, armed)
		}
	})

	t.Run("CrashPoints", func(t *testing.T) { guestCrashPoints(t, e, guestT{t, gg}, a, storeName, thin) })
	t.Run("MoveThinToZFS", func(t *testing.T) { guestMove(t, e, guestT{t, gg}, storeName, thin) })

	// last: it replaces the control plane
	t.Run("ControlPlaneLost", func(t *testing.T) { guestControlPlaneLost(t, cp, guestT{t, gg}, a, refresh) })
}
