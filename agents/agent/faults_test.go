package agent_test

import (
	"context"
	"encoding/json"
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
	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/fencing"
	"github.com/plinth-storage/plinth/agents/file"
	"github.com/plinth-storage/plinth/internal/failpoint"
	"github.com/plinth-storage/plinth/internal/identity"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// faultPhase is the work during which a crash point is hit.
type faultPhase string

const (
	phaseCreate faultPhase = "create"
	phaseExpand faultPhase = "expand"
	phaseDelete faultPhase = "delete"
)

// TestHostFaults crashes the agent — a real process, with os.Exit at a named
// crash point (internal/failpoint) — at each step of creating, expanding and
// deleting a volume on the file backend (real loop devices, real API
// server), restarts it with the same environment (the point is armed "once",
// as the e2e DaemonSet arms it) and checks that the node converged: one
// VolumeState, one file, one loop device of the right size, no temp file, no
// orphan, Ready (or, for deletion, nothing left and the finalizer released).
func TestHostFaults(t *testing.T) {
	requireLoop(t)
	e := newEnv(t)
	ctx := t.Context()
	state := t.TempDir()
	dir := filepath.Join(t.TempDir(), "volumes")
	spec := hostProcessSpec(t, e, state)
	sys, nqnFile := spec.SysRoot, spec.HostNQNFile
	opts := agent.Options{NodeName: node, StateDir: state}
	t.Cleanup(func() {
		if fb, err := file.New(file.Config{Directory: dir}); err == nil {
			vols, _ := fb.List(context.Background())
			for _, v := range vols {
				fb.Delete(context.Background(), v.ID)
			}
		}
	})

	backendDecl := policyv1.Backend{File: &policyv1.FileBackend{Directory: dir}}
	local := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	storeName := storev1.StoreName(pool, node)
	a := &storev1.Agent{}
	a.Name, a.Labels = node, nodeLabels(node, pool)
	a.Spec = storev1.AgentSpec{NodeName: node, Stores: []string{storeName}}
	s := &storev1.Store{}
	s.Name, s.Labels = storeName, nodeLabels(node, pool)
	s.Spec = storev1.StoreSpec{Pool: pool, NodeName: node, Backend: backendDecl, Reserve: "1Mi", DriftPolicy: policyv1.DriftPolicyReport}
	for _, o := range []client.Object{a, s} {
		if err := e.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	cases := []struct {
		point string
		phase faultPhase
	}{
		{failpoint.AgentMarkSaved, phaseCreate},
		{failpoint.FencingMarkTorn, phaseCreate},
		{failpoint.FileCreateSized, phaseCreate},
		{failpoint.FileCreateRenamed, phaseCreate},
		{failpoint.AgentVolumeCreated, phaseCreate},
		{failpoint.FencingMarkTorn, phaseExpand},
		{failpoint.FileExpandTruncated, phaseExpand},
		{failpoint.AgentVolumeExpanded, phaseExpand},
		{failpoint.FencingMarkTorn, phaseDelete},
		{failpoint.FileDeleteDetached, phaseDelete},
		{failpoint.AgentDeleteVolumeRemoved, phaseDelete},
		{failpoint.AgentDeleteMarkReleased, phaseDelete},
	}
	for i, tc := range cases {
		t.Run(string(tc.phase)+"/"+tc.point, func(t *testing.T) {
			// each case arms its point afresh
			if err := os.RemoveAll(opts.FailpointsDir()); err != nil {
				t.Fatal(err)
			}
			csiName := fmt.Sprintf("pvc-fault-%d", i)
			vs := newVolumeState(csiName, node, pool, storeName, 8*mib, local, backendDecl)
			path := filepath.Join(dir, vs.Name+".img")
			want := int64(8 * mib)

			if tc.phase != phaseCreate {
				// the volume exists and is Ready before the faulty work
				p := startProcess(t, spec, "")
				if err := e.c.Create(ctx, vs); err != nil {
					t.Fatal(err)
				}
				eventually(t, 60*time.Second, "Ready before the fault", func() error { _, err := readyVS(ctx, e.c, vs.Name); return err })
				p.stop()
				if code := p.waitExit(time.Second); code != 0 {
					t.Fatalf("agent stopped with exit code %d", code)
				}
			}

			armed := tc.point + "=once"
			p := startProcess(t, spec, armed)
			switch tc.phase {
			case phaseCreate:
				if err := e.c.Create(ctx, vs); err != nil {
					t.Fatal(err)
				}
			case phaseExpand:
				want = 24 * mib
				if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
					t.Fatal(err)
				}
				vs.Spec.CapacityBytes = want
				if err := e.c.Update(ctx, vs); err != nil {
					t.Fatal(err)
				}
			case phaseDelete:
				if err := e.c.Delete(ctx, vs); err != nil {
					t.Fatal(err)
				}
			}
			if code := p.waitExit(60 * time.Second); code != failpoint.ExitCode {
				t.Fatalf("agent exited with code %d, want %d (crash point %s)", code, failpoint.ExitCode, tc.point)
			}
			if msg := "plinth failpoint " + tc.point + ": exiting"; !strings.Contains(p.logText(), msg) {
				t.Fatalf("log lacks %q", msg)
			}
			t.Logf("crashed at %s: %s", tc.point, describe(t, ctx, e.c, vs.Name, path))
			assertCrashLeft(t, ctx, e.c, tc.point, vs.Name, path, opts.MarksDir(), want)

			// the restarted agent has the same environment: the point, hit
			// once on this node, lets it through
			p = startProcess(t, spec, armed)
			if tc.phase == phaseDelete {
				eventually(t, 60*time.Second, "VolumeState deleted after the restart", func() error { return gone(ctx, e.c, vs) })
				assertNoVolumeLeft(t, dir, path)
				marks, err := fencing.Open(opts.MarksDir())
				if err != nil {
					t.Fatal(err)
				}
				if m, found, err := marks.Load(vs.Name); err != nil || !found || !m.Released {
					t.Errorf("mark after delete: %+v found=%v err=%v", m, found, err)
				}
			} else {
				var got *storev1.VolumeState
				eventually(t, 60*time.Second, "Ready after the restart", func() (err error) {
					got, err = readyVS(ctx, e.c, vs.Name)
					if err == nil && got.Status.ActualBytes != want {
						err = fmt.Errorf("actualBytes %d, want %d", got.Status.ActualBytes, want)
					}
					return err
				})
				assertOneVolume(t, ctx, e.c, dir, path, got, want)
				assertStoreClean(t, ctx, e.c, s, want)
				// leave the node empty for the next case
				if err := e.c.Delete(ctx, got); err != nil {
					t.Fatal(err)
				}
				eventually(t, 60*time.Second, "deleted", func() error { return gone(ctx, e.c, got) })
			}
			assertNoTemp(t, opts.MarksDir(), dir)
			if code := p.waitExitOrStop(); code != 0 {
				t.Errorf("restarted agent exited with code %d, want 0 after SIGTERM", code)
			}
		})
	}

	t.Run("DrainingStoreTakesNoNewVolume", func(t *testing.T) {
		r := &runner{t: t, cfg: e.cfg}
		r.start(agent.Options{
			NodeName: node, StateDir: state, RefreshInterval: time.Second, MetricsAddr: "0", ProbeAddr: "0",
			HostNQNFile: nqnFile, SysRoot: sys, NVMetRoot: spec.NVMetRoot,
		})
		defer r.stop()
		held := newVolumeState("pvc-held", node, pool, storeName, 4*mib, local, backendDecl)
		if err := e.c.Create(ctx, held); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "held volume Ready", func() error { _, err := readyVS(ctx, e.c, held.Name); return err })
		setDraining := func(on bool) {
			t.Helper()
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				t.Fatal(err)
			}
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			if on {
				s.Annotations[storev1.AnnotationDraining] = "true"
			} else {
				delete(s.Annotations, storev1.AnnotationDraining)
			}
			if err := e.c.Update(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		setDraining(true)
		vs := newVolumeState("pvc-draining", node, pool, storeName, 4*mib, local, backendDecl)
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "Ready=False StoreDraining", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			c := apimeta.FindStatusCondition(vs.Status.Conditions, agent.CondReady)
			if c == nil || c.Status != "False" || c.Reason != storev1.ReasonStoreDraining {
				return fmt.Errorf("Ready %+v", c)
			}
			return nil
		})
		if _, err := os.Stat(filepath.Join(dir, vs.Name+".img")); !os.IsNotExist(err) {
			t.Errorf("a draining store made a new volume: %v", err)
		}
		if vs.Status.ActualBytes != 0 || vs.Status.Phase == storev1.VolumeReady {
			t.Errorf("status of the refused volume: %+v", vs.Status)
		}
		// the volume it holds is still served, and deleted when asked
		if _, err := readyVS(ctx, e.c, held.Name); err != nil {
			t.Errorf("held volume on the draining store: %v", err)
		}
		if err := e.c.Delete(ctx, held); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "held volume deleted", func() error { return gone(ctx, e.c, held) })
		// the mark lifted, the waiting volume is made at the next retry
		setDraining(false)
		eventually(t, 60*time.Second, "Ready once the store no longer drains", func() error { _, err := readyVS(ctx, e.c, vs.Name); return err })
		if err := e.c.Delete(ctx, vs); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "deleted", func() error { return gone(ctx, e.c, vs) })

		// a Store its pool evacuates (spec.evacuate) takes no new volume either, and says why
		setEvacuate := func(on bool) {
			t.Helper()
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				t.Fatal(err)
			}
			s.Spec.Evacuate = on
			if err := e.c.Update(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		setEvacuate(true)
		ev := newVolumeState("pvc-evacuated", node, pool, storeName, 4*mib, local, backendDecl)
		if err := e.c.Create(ctx, ev); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "Ready=False StoreDraining, evacuated", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(ev), ev); err != nil {
				return err
			}
			c := apimeta.FindStatusCondition(ev.Status.Conditions, agent.CondReady)
			if c == nil || c.Status != "False" || c.Reason != storev1.ReasonStoreDraining || !strings.Contains(c.Message, "evacuated") {
				return fmt.Errorf("Ready %+v", c)
			}
			return nil
		})
		if _, err := os.Stat(filepath.Join(dir, ev.Name+".img")); !os.IsNotExist(err) {
			t.Errorf("an evacuated store made a new volume: %v", err)
		}
		setEvacuate(false)
		eventually(t, 60*time.Second, "Ready once the store is no longer evacuated", func() error { _, err := readyVS(ctx, e.c, ev.Name); return err })
		if err := e.c.Delete(ctx, ev); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "deleted", func() error { return gone(ctx, e.c, ev) })
	})

	t.Run("OrphanDeletedUnderCorrectAfterGrace", func(t *testing.T) {
		// a volume whose VolumeState went while the node was away (its fencing mark never
		// released), under a Store with driftPolicy Correct
		setPolicy := func(p policyv1.DriftPolicy) {
			t.Helper()
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				t.Fatal(err)
			}
			s.Spec.DriftPolicy = p
			if err := e.c.Update(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		setPolicy(policyv1.DriftPolicyCorrect)
		defer setPolicy(policyv1.DriftPolicyReport)
		fb, err := file.New(file.Config{Directory: dir})
		if err != nil {
			t.Fatal(err)
		}
		id := storev1.VolumeID("left-while-away")
		if _, err := fb.Create(ctx, id, mib); err != nil {
			t.Fatal(err)
		}
		marks, err := fencing.Open(opts.MarksDir())
		if err != nil {
			t.Fatal(err)
		}
		if err := marks.Save(id, fencing.Mark{UID: "uid-of-a-deleted-volumestate", Generation: 1}); err != nil {
			t.Fatal(err)
		}
		orphanItem := func() (*storev1.DriftItem, error) {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				return nil, err
			}
			for i, d := range s.Status.Drift {
				if d.Name == id && d.Reason == agent.DriftOrphan {
					return &s.Status.Drift[i], nil
				}
			}
			return nil, nil
		}
		in := agent.Options{
			NodeName: node, StateDir: state, RefreshInterval: time.Second, MetricsAddr: "0", ProbeAddr: "0",
			HostNQNFile: nqnFile, SysRoot: sys, NVMetRoot: spec.NVMetRoot, OrphanGracePeriod: time.Hour,
		}
		r := &runner{t: t, cfg: e.cfg}
		r.start(in)
		// within the grace period: reported with the time it goes, over three refreshes
		beats := map[string]bool{}
		eventually(t, 60*time.Second, "orphan reported over three refreshes", func() error {
			d, err := orphanItem()
			if err != nil {
				return err
			}
			if d == nil || !strings.Contains(d.Message, "driftPolicy Correct deletes it if it is still so at") {
				return fmt.Errorf("orphan item %+v", d)
			}
			beats[s.Status.LastHeartbeatTime.String()] = true
			if len(beats) < 3 {
				return fmt.Errorf("%d refreshes seen", len(beats))
			}
			return nil
		})
		if _, err := fb.Get(ctx, id); err != nil {
			t.Fatalf("orphan deleted within its grace period: %v", err)
		}
		r.stop()

		// past the grace period: deleted, the mark released, no more drift
		in.OrphanGracePeriod = time.Nanosecond
		r = &runner{t: t, cfg: e.cfg}
		r.start(in)
		defer r.stop()
		eventually(t, 60*time.Second, "orphan deleted", func() error {
			if _, err := fb.Get(ctx, id); !errors.Is(err, backend.ErrNotFound) {
				return fmt.Errorf("orphan still there: %v", err)
			}
			d, err := orphanItem()
			if err != nil {
				return err
			}
			if d != nil {
				return fmt.Errorf("still reported: %+v", d)
			}
			return nil
		})
		if l := loopsOf(t, filepath.Join(dir, id+".img")); len(l) != 0 {
			t.Errorf("loop devices of the deleted orphan: %v", l)
		}
		if m, found, err := marks.Load(id); err != nil || !found || !m.Released {
			t.Errorf("mark of the deleted orphan: %+v found=%v %v; want released", m, found, err)
		}
	})

	t.Run("IdentityStampedAndForeignOrphansKept", func(t *testing.T) {
		identityHost(t, e, s, dir, agent.Options{
			NodeName: node, StateDir: state, RefreshInterval: time.Second, MetricsAddr: "0", ProbeAddr: "0",
			HostNQNFile: nqnFile, SysRoot: sys, NVMetRoot: spec.NVMetRoot,
		})
	})

	t.Run("StalePublicationRefused", func(t *testing.T) {
		// The node already acted on publicationGeneration 5 of this lifecycle
		// (its mark says so); the VolumeState it now reads carries 2: a
		// publication list an older controller wrote. The agent refuses it.
		vs := newVolumeState("pvc-stale-pub", node, pool, storeName, 4*mib, local, backendDecl)
		vs.Spec.PublicationGeneration = 2
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		marks, err := fencing.Open(opts.MarksDir())
		if err != nil {
			t.Fatal(err)
		}
		if err := marks.Save(vs.Name, fencing.Mark{UID: string(vs.UID), Generation: vs.Generation, PublicationGeneration: 5}); err != nil {
			t.Fatal(err)
		}
		before := counter(agent.FencingRejections, fencing.ReasonStalePublicationGeneration)
		inProcess := agent.Options{
			NodeName: node, StateDir: state, RefreshInterval: time.Second, MetricsAddr: "0", ProbeAddr: "0",
			HostNQNFile: nqnFile, SysRoot: sys, NVMetRoot: spec.NVMetRoot,
		}
		r := &runner{t: t, cfg: e.cfg}
		r.start(inProcess)
		defer r.stop()
		eventually(t, 60*time.Second, "Fenced StalePublicationGeneration", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			c := apimeta.FindStatusCondition(vs.Status.Conditions, agent.CondFenced)
			if c == nil || c.Status != "True" || c.Reason != fencing.ReasonStalePublicationGeneration {
				return fmt.Errorf("Fenced %+v", c)
			}
			return nil
		})
		// The agent counts the refusal after its status write and before its event: the
		// counter is read once the event is there, never right after the condition.
		eventually(t, 30*time.Second, "Warning event StalePublicationGeneration on the VolumeState", func() error {
			return warningEvent(ctx, e.c, vs.Name, fencing.ReasonStalePublicationGeneration)
		})
		if after := counter(agent.FencingRejections, fencing.ReasonStalePublicationGeneration); after != before+1 {
			t.Errorf("plinth_agent_fencing_rejections_total{reason=StalePublicationGeneration} %v → %v, want +1", before, after)
		}
		if _, err := os.Stat(filepath.Join(dir, vs.Name+".img")); !os.IsNotExist(err) {
			t.Errorf("stale publication work created a volume: %v", err)
		}
		if m, _, err := marks.Load(vs.Name); err != nil || m.PublicationGeneration != 5 {
			t.Errorf("mark moved back: %+v %v", m, err)
		}
		if err := e.c.Delete(ctx, vs); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "deleted", func() error { return gone(ctx, e.c, vs) })
	})
}

// waitExitOrStop stops a process still running and returns its exit code.
func (p *agentProcess) waitExitOrStop() int {
	p.stop()
	<-p.done
	return p.code
}

// describe says what a crash left: the VolumeState's phase and size, the
// files and loop devices of the volume.
func describe(t *testing.T, ctx context.Context, c client.Client, name, path string) string {
	var vs storev1.VolumeState
	st := "VolumeState gone"
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &vs); err == nil {
		st = fmt.Sprintf("VolumeState phase %q actualBytes %d finalizers %v", vs.Status.Phase, vs.Status.ActualBytes, vs.Finalizers)
	}
	files, _ := filepath.Glob(path + "*")
	for i := range files {
		files[i] = filepath.Base(files[i])
	}
	return fmt.Sprintf("%s; files %v; loop devices %v", st, files, loopsOf(t, path))
}

// loopsOf lists the loop devices whose backing file is path.
func loopsOf(t *testing.T, path string) []string {
	t.Helper()
	m, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, bf := range m {
		b, err := os.ReadFile(bf)
		if err != nil {
			continue
		}
		if strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == path {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(bf))))
		}
	}
	return out
}

// assertOneVolume checks one VolumeState for the volume, one file under its
// name and nothing else in the folder, one loop device, all of want bytes.
func assertOneVolume(t *testing.T, ctx context.Context, c client.Client, dir, path string, vs *storev1.VolumeState, want int64) {
	t.Helper()
	var all storev1.VolumeStateList
	if err := c.List(ctx, &all); err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 1 {
		t.Errorf("%d VolumeStates, want 1", len(all.Items))
	}
	// The image and its identity record, which a Store refresh stamps with the volume's size
	// (a valid stamp of this volume: never a torn one after a crash). Listed once the record
	// says the size asked for: until then a refresh may be writing it (its temp file exists).
	record := strings.TrimSuffix(path, ".img") + ".id"
	eventually(t, 30*time.Second, "identity record stamped with the size", func() error {
		b, err := os.ReadFile(record)
		if err != nil {
			return err
		}
		st, err := identity.ParseText(string(b))
		if err != nil {
			return err
		}
		if st.SizeBytes != want {
			return fmt.Errorf("stamped size %d, want %d", st.SizeBytes, want)
		}
		return nil
	})
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(ents) == 2 && ents[0].Name() == filepath.Base(record) { // ".id" sorts before ".img"
		b, err := os.ReadFile(record)
		if st, perr := identity.ParseText(string(b)); err != nil || perr != nil || st.VolumeID != vs.Name {
			t.Errorf("identity record %s: %+v, %v %v", record, st, err, perr)
		}
		ents = ents[1:]
	}
	if len(ents) != 1 || ents[0].Name() != filepath.Base(path) {
		t.Errorf("volume folder holds %v, want only %s (and its identity record)", names, filepath.Base(path))
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != want {
		t.Errorf("volume file: %v, size %d, want %d", err, fi.Size(), want)
	}
	loops := loopsOf(t, path)
	if len(loops) != 1 || loops[0] != vs.Status.DevicePath {
		t.Errorf("loop devices of %s: %v, status says %s", path, loops, vs.Status.DevicePath)
	} else if n := devSize(t, loops[0]); n != want {
		t.Errorf("%s has %d bytes, want %d (status says %d)", loops[0], n, want, vs.Status.ActualBytes)
	}
	if rc := apimeta.FindStatusCondition(vs.Status.Conditions, agent.CondFenced); rc != nil && rc.Status == "True" {
		t.Errorf("Fenced after the restart: %+v", rc)
	}
}

// assertNoVolumeLeft checks that neither the file nor a loop device of path
// remains, nor any temp file of the backend.
func assertNoVolumeLeft(t *testing.T, dir, path string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("volume folder still holds %s", e.Name())
	}
	if l := loopsOf(t, path); len(l) != 0 {
		t.Errorf("loop devices of the deleted volume remain: %v", l)
	}
}

// hostProcessSpec is the agent process of the host tests on the node: state as its state
// folder and host NQN file (the test's host NQN), a sysfs root with the nvmet module but no
// configfs target (NVMetRoot absent), a 1 s refresh.
func hostProcessSpec(t *testing.T, e *env, state string) processSpec {
	t.Helper()
	sys := t.TempDir()
	os.MkdirAll(filepath.Join(sys, "module", "nvmet"), 0o755)
	nqnFile := filepath.Join(state, "hostnqn")
	os.WriteFile(nqnFile, []byte(hostNQN+"\n"), 0o644)
	return processSpec{
		Kubeconfig: e.kubeconfig, NodeName: node, StateDir: state, HostNQNFile: nqnFile,
		SysRoot: sys, NVMetRoot: filepath.Join(state, "no-nvmet"), RefreshInterval: time.Second,
	}
}

// assertStoreClean waits for the second Store refresh written after the volume became Ready
// (the first may have measured before it) and checks it reports no drift and provisioned =
// the volume's size.
func assertStoreClean(t *testing.T, ctx context.Context, c client.Client, s *storev1.Store, provisioned int64) {
	t.Helper()
	if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
		t.Fatal(err)
	}
	var seen time.Time
	if s.Status.LastHeartbeatTime != nil {
		seen = s.Status.LastHeartbeatTime.Time
	}
	// A refresh whose write lands after Ready may have measured the pool before the volume
	// was made (it was in flight). The agent refreshes one at a time, so the second refresh
	// written after Ready measured after the first's write: that one must count the volume.
	refreshes := 0
	eventually(t, 30*time.Second, "two Store refreshes after Ready", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return err
		}
		if hb := s.Status.LastHeartbeatTime; hb != nil && hb.After(seen) {
			seen = hb.Time
			refreshes++
		}
		if refreshes < 2 {
			return fmt.Errorf("%d refreshes after Ready, want 2", refreshes)
		}
		return nil
	})
	if len(s.Status.Drift) != 0 || s.Status.Capacity == nil || s.Status.Capacity.Provisioned != provisioned {
		t.Errorf("Store after the restart: drift %+v, capacity %+v; want no drift, %d provisioned", s.Status.Drift, s.Status.Capacity, provisioned)
	}
}

// assertNoTemp checks that no temp file of a mark or of a volume remains.
func assertNoTemp(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".tmp") {
				t.Errorf("temp file left in %s: %s", d, e.Name())
			}
		}
	}
}

// assertCrashLeft checks that the process stopped where the point says: what
// exists on the node and in the VolumeState right after the crash.
func assertCrashLeft(t *testing.T, ctx context.Context, c client.Client, point, name, path, marksDir string, want int64) {
	t.Helper()
	var vs storev1.VolumeState
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &vs); err != nil {
		t.Fatalf("VolumeState after the crash: %v", err)
	}
	fileSize := int64(-1)
	if fi, err := os.Stat(path); err == nil {
		fileSize = fi.Size()
	}
	loops := loopsOf(t, path)
	_, tmpErr := os.Stat(path + ".tmp")
	var problems []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	switch point {
	case failpoint.FencingMarkTorn:
		tmps, _ := filepath.Glob(filepath.Join(marksDir, "."+name+".*.tmp"))
		check(len(tmps) == 1, "want one torn temp mark, have %v", tmps)
		if len(tmps) == 1 {
			b, _ := os.ReadFile(tmps[0])
			check(len(b) > 0 && !strings.HasSuffix(string(b), "}\n"), "temp mark %q is not torn", b)
		}
	case failpoint.AgentMarkSaved:
		check(fileSize < 0 && vs.Status.Phase == "", "want no file and no phase, have file size %d, phase %q", fileSize, vs.Status.Phase)
	case failpoint.FileCreateSized:
		check(fileSize < 0 && tmpErr == nil, "want only the temp file, have file size %d, temp %v", fileSize, tmpErr)
	case failpoint.FileCreateRenamed:
		check(fileSize == want && len(loops) == 0, "want the file and no loop device, have size %d, loops %v", fileSize, loops)
	case failpoint.AgentVolumeCreated:
		// Creating only when the create outlasted Options.ProgressAfter; never more than that
		check(fileSize == want && len(loops) == 1 && vs.Status.ActualBytes == 0 &&
			(vs.Status.Phase == "" || vs.Status.Phase == storev1.VolumeCreating),
			"want file, loop and status Pending or Creating without size, have size %d, loops %v, status %q/%d", fileSize, loops, vs.Status.Phase, vs.Status.ActualBytes)
	case failpoint.FileExpandTruncated:
		check(fileSize == want && len(loops) == 1 && devSize(t, loops[0]) < want,
			"want the grown file behind a loop device of the old size, have size %d, loops %v", fileSize, loops)
	case failpoint.AgentVolumeExpanded:
		check(len(loops) == 1 && devSize(t, loops[0]) == want && vs.Status.ActualBytes < want,
			"want the grown device and the old size in status, have loops %v, status %d", loops, vs.Status.ActualBytes)
	case failpoint.FileDeleteDetached:
		check(fileSize > 0 && len(loops) == 0, "want the file without loop device, have size %d, loops %v", fileSize, loops)
	case failpoint.AgentDeleteVolumeRemoved, failpoint.AgentDeleteMarkReleased:
		m, found, err := loadMark(marksDir, name)
		check(fileSize < 0 && len(loops) == 0 && len(vs.Finalizers) == 1 && err == nil && found &&
			m.Released == (point == failpoint.AgentDeleteMarkReleased),
			"want no volume, the finalizer, mark released=%v; have size %d, loops %v, finalizers %v, mark %+v %v",
			point == failpoint.AgentDeleteMarkReleased, fileSize, loops, vs.Finalizers, m, err)
	}
	for _, p := range problems {
		t.Errorf("after the crash at %s: %s", point, p)
	}
}

// loadMark reads a mark without fencing.Open's cleanup of temp files.
func loadMark(dir, id string) (fencing.Mark, bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return fencing.Mark{}, false, nil
	}
	if err != nil {
		return fencing.Mark{}, false, err
	}
	var m fencing.Mark
	err = json.Unmarshal(b, &m)
	return m, err == nil, err
}

// warningEvent is nil once a Warning event with reason about VolumeState name is recorded
// (the agent records a VolumeState's events in the default namespace).
func warningEvent(ctx context.Context, c client.Client, name, reason string) error {
	var list corev1.EventList
	if err := c.List(ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
		return err
	}
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == name && ev.Reason == reason && ev.Type == corev1.EventTypeWarning {
			return nil
		}
	}
	return fmt.Errorf("no Warning event %s about %s yet", reason, name)
}
