package main

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/test/kernel/guest"
)

// stuckGuest stands in for *guest.Guest (no qemu guest boots in a unit test): the test
// binary's command prints the start of a timeout panic and then never ends, as a binary
// whose thread is blocked in the kernel; the diagnostics command answers with a blocked
// zfs process. It records the scripts it was given.
type stuckGuest struct {
	mu      sync.Mutex
	scripts []string
}

const stuckOutput = "=== RUN   TestGuestZFS\npanic: test timed out after 15m0s\n\trunning tests:\n\t\tTestGuestZFS (15m0s)\n"

const stuckDiag = "kguest-diag: 812 D (disk sleep) zfs destroy plinthz/k8s/volumes/a\n" +
	"kguest-diag:     [<0>] zvol_remove_minors_impl+0x1c/0x90 [zfs]\n" +
	"kguest-diag: zfs pool plinthz ONLINE\n" +
	"kguest-diag: zfs zpool events (pid 900) did not answer in 10 s\n"

func (g *stuckGuest) Run(ctx context.Context, script string, w io.Writer) (guest.Result, error) {
	g.mu.Lock()
	g.scripts = append(g.scripts, script)
	g.mu.Unlock()
	if script == guestDiagnostics {
		io.WriteString(w, stuckDiag)
		return guest.Result{Output: []byte(stuckDiag)}, nil
	}
	io.WriteString(w, stuckOutput)
	<-ctx.Done() // the guest command never writes its exit code
	return guest.Result{Output: []byte(stuckOutput)}, ctx.Err()
}

// A test binary that never exits is reported hung by name once hangAfter passed, with its
// output so far and the guest's diagnostics (the blocked command, the pool, zpool events)
// in the digest; kguest goes on with the next binary instead of waiting for the guest's end.
func TestHungBinaryReportedByName(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // kguest's guest outlives the hang
	defer cancel()
	g := &stuckGuest{}
	var out strings.Builder
	began := time.Now()
	r := runBinary(ctx, g, "agents_zfs.test", "run agents_zfs.test", time.Second, &out)
	took := time.Since(began)
	if took > 10*time.Second {
		t.Fatalf("runBinary returned after %s, want about the 1s hang bound", took)
	}
	if !r.failed || r.interrupted || !strings.Contains(r.summary, "agents_zfs.test") || !strings.Contains(r.summary, "HUNG") {
		t.Errorf("result %+v, want failed, not interrupted, summary naming the binary HUNG", r)
	}
	if len(g.scripts) != 2 || g.scripts[1] != guestDiagnostics {
		t.Errorf("guest commands %q, want the binary then the diagnostics", g.scripts)
	}
	digest := strings.Join(r.digest, "\n")
	for _, want := range []string{"--- agents_zfs.test HUNG", "TestGuestZFS (15m0s)", "812 D (disk sleep) zfs destroy", "zvol_remove_minors_impl",
		"zfs pool plinthz ONLINE", "zpool events (pid 900) did not answer"} {
		if !strings.Contains(digest, want) {
			t.Errorf("digest lacks %q:\n%s", want, digest)
		}
	}
	if !strings.Contains(out.String(), "=== KERNEL agents_zfs.test HUNG") {
		t.Errorf("output lacks the HUNG line:\n%s", out.String())
	}
}

// exitGuest stands in for *guest.Guest: the binary's command exits with code rc.
type exitGuest struct {
	rc    int
	diags int
}

func (g *exitGuest) Run(ctx context.Context, script string, w io.Writer) (guest.Result, error) {
	if script == guestDiagnostics {
		g.diags++
		return guest.Result{}, nil
	}
	return guest.Result{ExitCode: g.rc, Output: []byte("--- FAIL: TestX (0.01s)\n")}, nil
}

// A binary that exits is not hung: a pass runs no diagnostics, a failure runs them once.
func TestExitedBinaryNotHung(t *testing.T) {
	for _, rc := range []int{0, 1} {
		g := &exitGuest{rc: rc}
		r := runBinary(t.Context(), g, "agents_lvm.test", "run", time.Minute, io.Discard)
		if r.failed != (rc != 0) || strings.Contains(r.summary, "HUNG") || r.interrupted {
			t.Errorf("exit %d: result %+v", rc, r)
		}
		if want := map[bool]int{true: 1, false: 0}[rc != 0]; g.diags != want {
			t.Errorf("exit %d: diagnostics ran %d times, want %d", rc, g.diags, want)
		}
	}
}

// kguest's own context ending (a signal) is no hang: no diagnostics, no more binaries.
func TestInterruptedBinaryStopsTheRun(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	g := &stuckGuest{}
	r := runBinary(ctx, g, "agents_zfs.test", "run", time.Minute, io.Discard)
	if !r.interrupted || strings.Contains(r.summary, "HUNG") || len(g.scripts) != 1 {
		t.Errorf("result %+v after %d guest commands, want interrupted, not hung, no diagnostics", r, len(g.scripts))
	}
}
