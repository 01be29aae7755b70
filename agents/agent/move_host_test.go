package agent_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/agents/file"
	"github.com/plinth-storage/plinth/controllers/moveexec"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestHostMove moves volumes with data between two Stores of one node (two file-backend
// folders: real loop devices, the agent a real process, the controller's move step in this
// process, the real API server), and crashes the agent (os.Exit at a named crash point) at
// each step of a move: after the restart every move finishes with the bytes equal to what was
// written, the volume served from the target, and no copy left on the source. Besides: a
// move cleared before its switch leaves no copy on the target, a consumer holds the copy back
// until it stops, a target on another node fails the move and leaves the volume, and the API
// server refuses a second move of a volume while one is set.
func TestHostMove(t *testing.T) {
	requireLoop(t)
	e := newEnv(t)
	ctx := t.Context()
	state := t.TempDir()
	dirA := filepath.Join(t.TempDir(), "slow")
	dirB := filepath.Join(t.TempDir(), "fast")
	spec := hostProcessSpec(t, e, state)
	opts := agent.Options{NodeName: node, StateDir: state}
	t.Cleanup(func() {
		for _, d := range []string{dirA, dirB} {
			if fb, err := file.New(file.Config{Directory: d}); err == nil {
				vols, _ := fb.List(context.Background())
				for _, v := range vols {
					fb.Delete(context.Background(), v.ID)
				}
			}
		}
	})

	local := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	declA := policyv1.Backend{File: &policyv1.FileBackend{Directory: dirA}}
	declB := policyv1.Backend{File: &policyv1.FileBackend{Directory: dirB}}
	src, dst := storev1.StoreName("slow", node), storev1.StoreName("fast", node)
	far := storev1.StoreName("fast", "node-b")
	a := &storev1.Agent{}
	a.Name, a.Labels = node, nodeLabels(node, "slow")
	a.Spec = storev1.AgentSpec{NodeName: node, Stores: []string{src, dst}}
	objs := []client.Object{a}
	for _, s := range []struct {
		name, pool, node string
		decl             policyv1.Backend
	}{{src, "slow", node, declA}, {dst, "fast", node, declB}, {far, "fast", "node-b", declB}} {
		st := &storev1.Store{}
		st.Name, st.Labels = s.name, nodeLabels(s.node, s.pool)
		st.Spec = storev1.StoreSpec{Pool: s.pool, NodeName: s.node, Backend: s.decl, Reserve: "1Mi", DriftPolicy: policyv1.DriftPolicyReport}
		objs = append(objs, st)
	}
	for _, o := range objs {
		if err := e.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	startMoveStep(t, e) // the controller's part: switch and end
	succeeded0, failed0 := counter(moveexec.Moves, moveexec.ResultSucceeded), counter(moveexec.Moves, moveexec.ResultFailed)

	// newVolume makes a Ready volume on src filled with random bytes and returns it with the
	// bytes' checksum; the agent process runs only for that.
	newVolume := func(t *testing.T, csiName string) (*storev1.VolumeState, string) {
		t.Helper()
		p := startProcess(t, spec, "")
		vs := newVolumeState(csiName, node, "slow", src, 8*mib, local, declA)
		if err := e.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "Ready on the source", func() error {
			got, err := readyVS(ctx, e.c, vs.Name)
			if err == nil {
				*vs = *got
			}
			return err
		})
		f, err := os.OpenFile(vs.Status.DevicePath, os.O_WRONLY|os.O_SYNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(f, rand.Reader, vs.Status.ActualBytes); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		p.stop()
		return vs, deviceSum(t, vs.Status.DevicePath, vs.Status.ActualBytes)
	}
	setMove := func(t *testing.T, vs *storev1.VolumeState, id, target string) {
		t.Helper()
		eventually(t, 30*time.Second, "spec.move set", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			vs.Spec.Move = &storev1.VolumeMove{ID: id, SourceStore: src, TargetStore: target}
			return e.c.Update(ctx, vs)
		})
	}
	// moved waits for the move to end Done and checks the bytes and what is left on disk
	moved := func(t *testing.T, vs *storev1.VolumeState, sum string) {
		t.Helper()
		eventually(t, 90*time.Second, "move Done, spec.move cleared, Ready on the target", func() error {
			got, err := readyVS(ctx, e.c, vs.Name)
			if err != nil {
				return err
			}
			*vs = *got
			if st := vs.Status.Move; vs.Spec.Move != nil || st == nil || st.Phase != storev1.MoveDone || vs.Spec.StoreName != dst {
				return fmt.Errorf("storeName %s, spec.move %+v, status.move %+v", vs.Spec.StoreName, vs.Spec.Move, vs.Status.Move)
			}
			return nil
		})
		if got := deviceSum(t, vs.Status.DevicePath, vs.Status.Move.BytesTotal); got != sum || vs.Status.Move.Checksum != sum {
			t.Errorf("target holds %s, status.move.checksum %s; the source held %s", got, vs.Status.Move.Checksum, sum)
		}
		if st := vs.Status.Move; st.BytesCopied != st.BytesTotal || st.BytesTotal != 8*mib || st.StartedAt == nil || st.CopiedAt == nil {
			t.Errorf("status.move %+v: want 8 MiB copied with start and copy times", st)
		}
		if !strings.HasPrefix(vs.Status.DevicePath, "/dev/loop") || vs.Labels[policyv1.LabelPool] != "fast" || vs.Spec.Policy.Pool != "fast" || vs.Spec.Policy.Backend.File.Directory != dirB {
			t.Errorf("after the switch: device %s, labels %v, frozen pool %s backend %+v", vs.Status.DevicePath, vs.Labels, vs.Spec.Policy.Pool, vs.Spec.Policy.Backend)
		}
		srcPath, dstPath := filepath.Join(dirA, vs.Name+".img"), filepath.Join(dirB, vs.Name+".img")
		if _, err := os.Stat(srcPath); !os.IsNotExist(err) {
			t.Errorf("the source's copy %s is still there: %v", srcPath, err)
		}
		if l := loopsOf(t, srcPath); len(l) != 0 {
			t.Errorf("loop devices %v still hold the source's copy", l)
		}
		if l := loopsOf(t, dstPath); len(l) != 1 || l[0] != vs.Status.DevicePath {
			t.Errorf("loop devices of the target %v, want exactly %s", l, vs.Status.DevicePath)
		}
	}
	remove := func(t *testing.T, vs *storev1.VolumeState) {
		t.Helper()
		p := startProcess(t, spec, "")
		if err := e.c.Delete(ctx, vs); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "VolumeState deleted", func() error { return gone(ctx, e.c, vs) })
		p.stop()
		for _, d := range []string{dirA, dirB} {
			if _, err := os.Stat(filepath.Join(d, vs.Name+".img")); !os.IsNotExist(err) {
				t.Errorf("%s left in %s: %v", vs.Name, d, err)
			}
		}
	}

	points := []string{"", failpoint.MoveTargetCreated, failpoint.MoveCopyStarted, failpoint.MoveCopied, failpoint.MoveSourceDeleted}
	for i, point := range points {
		name := "NoCrash"
		if point != "" {
			name = "CrashAt/" + point
		}
		t.Run(name, func(t *testing.T) {
			if err := os.RemoveAll(opts.FailpointsDir()); err != nil {
				t.Fatal(err)
			}
			vs, sum := newVolume(t, fmt.Sprintf("pvc-move-%d", i))
			armed := ""
			if point != "" {
				armed = point + "=once"
			}
			p := startProcess(t, spec, armed)
			setMove(t, vs, "m1", dst)
			if point != "" {
				if code := p.waitExit(60 * time.Second); code != failpoint.ExitCode {
					t.Fatalf("agent exited with code %d, want %d (crash point %s)", code, failpoint.ExitCode, point)
				}
				if msg := "plinth failpoint " + point + ": exiting"; !strings.Contains(p.logText(), msg) {
					t.Fatalf("log lacks %q", msg)
				}
				p = startProcess(t, spec, armed)
			}
			moved(t, vs, sum)
			p.stop()
			remove(t, vs)
		})
	}

	t.Run("OneMoveAtATime", func(t *testing.T) {
		vs, _ := newVolume(t, "pvc-move-refused")
		// each refused write builds on the latest version: a stale one would be a Conflict
		fresh := func() *storev1.VolumeState {
			t.Helper()
			var got storev1.VolumeState
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), &got); err != nil {
				t.Fatal(err)
			}
			return &got
		}
		bad := fresh()
		bad.Spec.Move = &storev1.VolumeMove{ID: "m1", SourceStore: dst, TargetStore: src}
		if err := e.c.Update(ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "starts from spec.storeName") {
			t.Errorf("a move from a Store that does not hold the volume: %v, want Invalid", err)
		}
		setMove(t, vs, "m1", far) // no agent runs: the move stays set
		other := fresh()
		other.Spec.Move = &storev1.VolumeMove{ID: "m2", SourceStore: src, TargetStore: dst}
		if err := e.c.Update(ctx, other); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "one move of a volume at a time") {
			t.Errorf("a second move while one is set: %v, want Invalid", err)
		}
		sw := fresh()
		sw.Spec.StoreName = dst
		if err := e.c.Update(ctx, sw); !apierrors.IsInvalid(err) {
			t.Errorf("storeName to a Store other than the move's target: %v, want Invalid", err)
		}
		// a target on another node: the agent fails the move, the controller ends it
		p := startProcess(t, spec, "")
		eventually(t, 60*time.Second, "move Failed and cleared", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			if st := vs.Status.Move; vs.Spec.Move != nil || st == nil || st.Phase != storev1.MoveFailed || !strings.Contains(st.Message, "on node node-b") {
				return fmt.Errorf("spec.move %+v, status.move %+v", vs.Spec.Move, vs.Status.Move)
			}
			return nil
		})
		if vs.Spec.StoreName != src {
			t.Errorf("storeName %s after a failed move, want %s", vs.Spec.StoreName, src)
		}
		p.stop()
		remove(t, vs)
	})

	t.Run("WaitsForTheConsumer", func(t *testing.T) {
		vs, sum := newVolume(t, "pvc-move-consumer")
		eventually(t, 30*time.Second, "published", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			vs.Spec.Publications = []storev1.Publication{{NodeName: node, AccessMode: "SINGLE_NODE_WRITER"}}
			vs.Spec.PublicationGeneration++
			return e.c.Update(ctx, vs)
		})
		p := startProcess(t, spec, "")
		setMove(t, vs, "m1", dst)
		eventually(t, 60*time.Second, "move Waiting", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			if st := vs.Status.Move; st == nil || st.Phase != storev1.MoveWaiting || !strings.Contains(st.Message, "published to "+node) {
				return fmt.Errorf("status.move %+v", vs.Status.Move)
			}
			return nil
		})
		if _, err := os.Stat(filepath.Join(dirB, vs.Name+".img")); !os.IsNotExist(err) {
			t.Errorf("a copy was started while the consumer ran: %v", err)
		}
		eventually(t, 30*time.Second, "unpublished", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			vs.Spec.Publications = nil
			vs.Spec.PublicationGeneration++
			return e.c.Update(ctx, vs)
		})
		moved(t, vs, sum)
		p.stop()
		remove(t, vs)
	})

	t.Run("ClearedBeforeTheSwitch", func(t *testing.T) {
		if err := os.RemoveAll(opts.FailpointsDir()); err != nil {
			t.Fatal(err)
		}
		vs, sum := newVolume(t, "pvc-move-cancelled")
		armed := failpoint.MoveCopyStarted + "=once"
		p := startProcess(t, spec, armed)
		setMove(t, vs, "m1", dst)
		if code := p.waitExit(60 * time.Second); code != failpoint.ExitCode {
			t.Fatalf("agent exited with code %d, want %d", code, failpoint.ExitCode)
		}
		copyPath := filepath.Join(dirB, vs.Name+".img")
		if _, err := os.Stat(copyPath); err != nil {
			t.Fatalf("no target copy after the crash at %s: %v", failpoint.MoveCopyStarted, err)
		}
		eventually(t, 30*time.Second, "spec.move cleared", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			vs.Spec.Move = nil
			return e.c.Update(ctx, vs)
		})
		p = startProcess(t, spec, armed)
		eventually(t, 60*time.Second, "move cancelled", func() error {
			if err := e.c.Get(ctx, client.ObjectKeyFromObject(vs), vs); err != nil {
				return err
			}
			if st := vs.Status.Move; st == nil || st.Phase != storev1.MoveFailed || !strings.Contains(st.Message, "cancelled") {
				return fmt.Errorf("status.move %+v", vs.Status.Move)
			}
			return nil
		})
		if _, err := os.Stat(copyPath); !os.IsNotExist(err) {
			t.Errorf("the cancelled move's copy %s is still there: %v", copyPath, err)
		}
		if l := loopsOf(t, copyPath); len(l) != 0 {
			t.Errorf("loop devices %v still hold the cancelled copy", l)
		}
		if got, err := readyVS(ctx, e.c, vs.Name); err != nil || got.Spec.StoreName != src || deviceSum(t, got.Status.DevicePath, got.Status.ActualBytes) != sum {
			t.Errorf("after the cancel the source must serve the same bytes: %v %+v", err, got)
		}
		p.stop()
		remove(t, vs)
	})

	if got := counter(moveexec.Moves, moveexec.ResultSucceeded) - succeeded0; got != float64(len(points)+1) {
		t.Errorf("plinth_volume_moves_total{result=succeeded} rose by %v, want %d", got, len(points)+1)
	}
	if got := counter(moveexec.Moves, moveexec.ResultFailed) - failed0; got != 1 {
		t.Errorf("plinth_volume_moves_total{result=failed} rose by %v, want 1 (the target on another node)", got)
	}
}

// deviceSum is "sha256:<hex>" of the first n bytes of the device at path.
func deviceSum(t *testing.T, path string, n int64) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, n); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
