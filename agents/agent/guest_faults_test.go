package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/agents/fencing"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The guest agent runs under a restart loop (guestAgentLoop), as kubelet
// restarts a container: each exit is appended to /tmp/agent-exits, and the
// next run has the crash points named in /tmp/agent-failpoints. After an
// exit at a crash point (failpoint.ExitCode) the loop holds until the test
// writes to the FIFO /tmp/agent-resume, so the test reads what the crash
// left before the restarted agent touches it.
const guestStateDir = "/tmp/plinth-state"

func guestAgentLoop(refresh time.Duration, sharePath string) string {
	return fmt.Sprintf(`mkfifo /tmp/agent-resume && : > /tmp/agent-exits && cat > /tmp/agent-loop.sh <<'EOF'
while :; do
  PLINTH_FAILPOINTS=$(cat /tmp/agent-failpoints 2>/dev/null) /tmp/plinth agent --node %s --kubeconfig %s/kubeconfig --state-dir %s \
    --refresh-interval %s --metrics-bind-address 127.0.0.1:18080 --health-probe-bind-address 127.0.0.1:18081 --v 1 >>/tmp/agent.log 2>&1 &
  echo $! > /tmp/agent.pid
  wait $!
  code=$?
  echo $code >> /tmp/agent-exits
  if [ $code = %d ]; then read go < /tmp/agent-resume; fi
done
EOF
(sh /tmp/agent-loop.sh >/dev/null 2>&1 &)`, guestNode, sharePath, guestStateDir, refresh, failpoint.ExitCode)
}

// exits is the list of exit codes of the guest agent so far.
func (g guestT) exits() []int {
	g.t.Helper()
	var codes []int
	for _, f := range strings.Fields(g.sh("cat /tmp/agent-exits")) {
		n, err := strconv.Atoi(f)
		if err != nil {
			g.t.Fatalf("/tmp/agent-exits: %q", f)
		}
		codes = append(codes, n)
	}
	return codes
}

// waitExit waits until the guest agent has exited n times and returns the
// code of the n-th exit.
func (g guestT) waitExit(n int, timeout time.Duration) int {
	g.t.Helper()
	var codes []int
	eventually(g.t, timeout, fmt.Sprintf("agent exit #%d", n), func() error {
		out, code := g.try("cat /tmp/agent-exits")
		if code != 0 {
			return fmt.Errorf("cat /tmp/agent-exits: %s", out)
		}
		codes = codes[:0]
		for _, f := range strings.Fields(out) {
			c, _ := strconv.Atoi(f)
			codes = append(codes, c)
		}
		if len(codes) < n {
			return fmt.Errorf("%d exits", len(codes))
		}
		return nil
	})
	if len(codes) != n {
		g.t.Fatalf("agent exits %v, want exactly %d", codes, n)
	}
	return codes[n-1]
}

// rearm restarts the guest agent with points armed afresh ("once" records
// of earlier hits removed): SIGTERM, then the loop starts it again. It
// returns the number of exits so far.
func (g guestT) rearm(points string) int {
	g.t.Helper()
	n := len(g.exits())
	g.sh(fmt.Sprintf("echo %s > /tmp/agent-failpoints && rm -rf %s/agent/failpoints/%s && kill $(cat /tmp/agent.pid)", points, guestStateDir, guestNode))
	// Expected: the agent stops cleanly on SIGTERM (exit 0); the loop starts the armed one.
	if code := g.waitExit(n+1, time.Minute); code != 0 {
		g.t.Fatalf("agent exited with %d on SIGTERM, want 0", code)
	}
	return n + 1
}

// guestVolumes lists the volumes of a backend in the guest, name → bytes:
// the LVs of a VG other than its thin pool (lvs), or the zvols of a pool (zfs list).
func (g guestT) guestVolumes(b policyv1.Backend) map[string]int64 {
	g.t.Helper()
	var out string
	if b.ZFS != nil {
		// stderr dropped: "no datasets available" when there is none (the exit code is still checked)
		out = g.sh("zfs list -H -p -t volume -o name,volsize -r " + b.ZFS.Pool + " 2>/dev/null")
	} else {
		out = g.sh("lvs --noheadings --units b --nosuffix --separator ' ' -o lv_name,lv_size,segtype " + b.LVM.VolumeGroup + " 2>/dev/null")
	}
	vols := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || (len(f) == 3 && f[2] == "thin-pool") {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			g.t.Fatalf("volume list %q: %v", out, err)
		}
		name := f[0]
		if i := strings.LastIndex(name, "/"); i >= 0 {
			name = name[i+1:]
		}
		vols[name] = n
	}
	return vols
}

// guestMark reads the fencing mark of a volume from the agent's state in the guest.
func (g guestT) guestMark(id string) (fencing.Mark, bool) {
	g.t.Helper()
	out, code := g.try(fmt.Sprintf("cat %s/agent/marks/%s.json", guestStateDir, id))
	if code != 0 {
		return fencing.Mark{}, false
	}
	var m fencing.Mark
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		g.t.Fatalf("mark of %s: %v: %q", id, err, out)
	}
	return m, true
}

// guestCrashPoints crashes the guest agent at agent.volume.created,
// agent.volume.expanded and agent.delete.volume-removed on thick LVM
// (/dev/vdc), the thin pool of the suite, and ZFS (a zpool on /dev/vdd), and
// checks after each restart that the node converged: one VolumeState, one
// LV or zvol of the right size, Ready, no drift or orphan on the Store; after
// the delete, no volume, the mark released and the VolumeState gone.
func guestCrashPoints(t *testing.T, e *env, g guestT, a *storev1.Agent, thinStore string, thin policyv1.Backend) {
	ctx := t.Context()
	start := time.Now()
	thick := policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "plinth-thick", Devices: []string{"/dev/vdc"}}}
	zb := policyv1.Backend{ZFS: &policyv1.ZFSBackend{Pool: "plinthz", ParentDataset: "vols"}}
	// the agent makes VGs from devices; a zpool is the operator's (the agent never creates one)
	g.sh("zpool create -f -o ashift=12 plinthz /dev/vdd")

	type store struct {
		pool string
		b    policyv1.Backend
		s    *storev1.Store
	}
	stores := []store{{pool: "thick", b: thick}, {pool: "thin", b: thin}, {pool: "zfs", b: zb}}
	for i := range stores {
		st := &stores[i]
		st.s = &storev1.Store{}
		if st.pool == "thin" {
			if err := e.c.Get(ctx, client.ObjectKey{Name: thinStore}, st.s); err != nil {
				t.Fatal(err)
			}
			continue
		}
		st.s.Name = storev1.StoreName(st.pool, guestNode)
		st.s.Labels = nodeLabels(guestNode, st.pool)
		st.s.Spec = storev1.StoreSpec{Pool: st.pool, NodeName: guestNode, Backend: st.b, Reserve: "5%", DriftPolicy: policyv1.DriftPolicyReport}
		if st.b.ZFS != nil {
			st.s.Spec.OvercommitPercent = 100
		}
		if err := e.c.Create(ctx, st.s); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
		t.Fatal(err)
	}
	a.Spec.Stores = append(a.Spec.Stores, stores[0].s.Name, stores[2].s.Name)
	if err := e.c.Update(ctx, a); err != nil {
		t.Fatal(err)
	}

	local := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	crashesOf := map[string]int{} // crashes at each point in the guest's agent log
	points := []string{failpoint.AgentVolumeCreated, failpoint.AgentVolumeExpanded, failpoint.AgentDeleteVolumeRemoved}
	for _, st := range stores {
		t.Run(st.pool, func(t *testing.T) {
			g := guestT{t, g.g}
			caseStart := time.Now()
			step := func(what string) { t.Logf("TIMING %s +%s", what, time.Since(caseStart).Round(time.Millisecond)) }
			eventually(t, 3*time.Minute, "Store Ready", func() error { return storeReady(ctx, e.c, st.s) })
			step("store ready")
			// each backend arms the three points afresh, all at once: each is hit
			// once, in the order of the work (create, expand, delete)
			armed := g.rearm(points[0] + "=once," + points[1] + "=once," + points[2] + "=once")
			step("rearmed")
			vs := newVolumeState("pvc-crash-"+st.pool, guestNode, st.pool, st.s.Name, 64<<20, local, st.b)
			exits := armed
			crash := func(point string) {
				t.Helper()
				exits++
				// Expected: the agent's next exit is with failpoint.ExitCode at the point, said once in its log.
				if code := g.waitExit(exits, 2*time.Minute); code != failpoint.ExitCode {
					t.Fatalf("agent exited with %d, want %d (crash point %s)", code, failpoint.ExitCode, point)
				}
				msg := "plinth failpoint " + point + ": exiting"
				if c := strings.TrimSpace(g.sh(fmt.Sprintf("grep -c '%s' /tmp/agent.log || true", msg))); c != strconv.Itoa(crashesOf[point]+1) {
					t.Fatalf("log has %s lines %q, want %d", msg, c, crashesOf[point]+1)
				}
				crashesOf[point]++
				step("crashed at " + point)
			}
			resume := func() { g.sh("echo go > /tmp/agent-resume"); step("resumed") }
			readyAt := func(want int64) *storev1.VolumeState {
				t.Helper()
				var got *storev1.VolumeState
				eventually(t, 2*time.Minute, "Ready after the restart", func() (err error) {
					got, err = readyVS(ctx, e.c, vs.Name)
					if err == nil && got.Status.ActualBytes != want {
						err = fmt.Errorf("actualBytes %d, want %d", got.Status.ActualBytes, want)
					}
					return err
				})
				step("ready")
				return got
			}
			converged := func(got *storev1.VolumeState, want int64) {
				t.Helper()
				// Expected: one VolumeState, one volume on the backend, named for it, of want bytes.
				var all storev1.VolumeStateList
				if err := e.c.List(ctx, &all); err != nil {
					t.Fatal(err)
				}
				if len(all.Items) != 1 {
					t.Errorf("%d VolumeStates, want 1", len(all.Items))
				}
				if vols := g.guestVolumes(st.b); len(vols) != 1 || vols[vs.Name] != want {
					t.Errorf("volumes on %s: %v, want only %s of %d bytes", st.pool, vols, vs.Name, want)
				}
				if !strings.HasSuffix(got.Status.DevicePath, "/"+vs.Name) {
					t.Errorf("device path %q", got.Status.DevicePath)
				}
				if n := strings.TrimSpace(g.sh("blockdev --getsize64 " + got.Status.DevicePath)); n != strconv.FormatInt(want, 10) {
					t.Errorf("%s has %s bytes, want %d", got.Status.DevicePath, n, want)
				}
				// Expected: the Store's next refresh reports no drift (no orphan) and want provisioned.
				assertStoreClean(t, ctx, e.c, st.s, want)
				step("store clean")
			}

			// create: crash with the volume made, before the status says so
			if err := e.c.Create(ctx, vs); err != nil {
				t.Fatal(err)
			}
			crash(failpoint.AgentVolumeCreated)
			// Expected: the volume exists at its size; the status still says Pending or Creating
			// (Creating only when the create outlasted Options.ProgressAfter), without size.
			if vols := g.guestVolumes(st.b); len(vols) != 1 || vols[vs.Name] != 64<<20 {
				t.Errorf("after the crash at %s: volumes %v, want %s of %d bytes", failpoint.AgentVolumeCreated, vols, vs.Name, 64<<20)
			}
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				t.Fatal(err)
			}
			if (vs.Status.Phase != "" && vs.Status.Phase != storev1.VolumeCreating) || vs.Status.ActualBytes != 0 {
				t.Errorf("after the crash at %s: status %q/%d, want Pending or Creating, 0", failpoint.AgentVolumeCreated, vs.Status.Phase, vs.Status.ActualBytes)
			}
			resume()
			converged(readyAt(64<<20), 64<<20)

			// expand: crash with the volume grown, before the status says so
			const grown = 96 << 20
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				t.Fatal(err)
			}
			vs.Spec.CapacityBytes = grown
			if err := e.c.Update(ctx, vs); err != nil {
				t.Fatal(err)
			}
			crash(failpoint.AgentVolumeExpanded)
			// Expected: the volume has the new size; the status still the old one.
			if vols := g.guestVolumes(st.b); len(vols) != 1 || vols[vs.Name] != grown {
				t.Errorf("after the crash at %s: volumes %v, want %s of %d bytes", failpoint.AgentVolumeExpanded, vols, vs.Name, grown)
			}
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				t.Fatal(err)
			}
			if vs.Status.ActualBytes != 64<<20 {
				t.Errorf("after the crash at %s: status actualBytes %d, want the old %d", failpoint.AgentVolumeExpanded, vs.Status.ActualBytes, 64<<20)
			}
			resume()
			got := readyAt(grown)
			converged(got, grown)

			// delete: crash with the volume removed, before the mark is released
			if err := e.c.Delete(ctx, got); err != nil {
				t.Fatal(err)
			}
			crash(failpoint.AgentDeleteVolumeRemoved)
			// Expected: no volume; the VolumeState still held by the finalizer; the mark not yet released.
			if vols := g.guestVolumes(st.b); len(vols) != 0 {
				t.Errorf("after the crash at %s: volumes %v, want none", failpoint.AgentDeleteVolumeRemoved, vols)
			}
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil || len(vs.Finalizers) != 1 {
				t.Errorf("after the crash at %s: VolumeState %v, finalizers %v; want it held by one", failpoint.AgentDeleteVolumeRemoved, err, vs.Finalizers)
			}
			if m, found := g.guestMark(vs.Name); !found || m.Released {
				t.Errorf("after the crash at %s: mark %+v found=%v, want it unreleased", failpoint.AgentDeleteVolumeRemoved, m, found)
			}
			resume()
			// Expected: the VolumeState gone (finalizer released), no volume, the mark released.
			eventually(t, 2*time.Minute, "VolumeState deleted after the restart", func() error { return gone(ctx, e.c, vs) })
			step("deleted")
			if vols := g.guestVolumes(st.b); len(vols) != 0 {
				t.Errorf("volumes after the delete: %v, want none", vols)
			}
			if m, found := g.guestMark(vs.Name); !found || !m.Released {
				t.Errorf("mark after the delete: %+v found=%v, want released", m, found)
			}
			// Expected: since the re-arming restart, three exits, each at its crash point;
			// nothing else stopped the agent.
			if all := g.exits(); len(all) != armed+3 || !slices.Equal(all[armed:], []int{failpoint.ExitCode, failpoint.ExitCode, failpoint.ExitCode}) {
				t.Errorf("agent exits %v, want three of %d after the first %d", all, failpoint.ExitCode, armed)
			}
			t.Logf("TIMING guest crash-points %s %s", st.pool, time.Since(caseStart).Round(time.Millisecond))
		})
	}
	t.Logf("TIMING guest crash-points total %s", time.Since(start).Round(time.Millisecond))
}

// storeReady is nil once the Store is Ready.
func storeReady(ctx context.Context, c client.Client, s *storev1.Store) error {
	if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
		return err
	}
	if apimeta.IsStatusConditionTrue(s.Status.Conditions, agent.CondReady) {
		return nil
	}
	return fmt.Errorf("conditions %+v", s.Status.Conditions)
}
