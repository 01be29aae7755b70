// Package failpoint holds Plinth's named crash points: places in the agent
// (and the packages it drives) and in the CSI driver where a fault test stops
// the process on purpose, at an exact step, instead of racing a timer.
//
// A point costs one map lookup when nothing is armed. It is armed in one of
// two ways:
//
//   - in a process, through the environment variable PLINTH_FAILPOINTS
//     (Env): a comma-separated list of name=action, where action is
//     "exit" (exit at every hit) or "once" (exit at the first hit only; the
//     hit is recorded as a file in the directory given to Configure, so the
//     restarted process — same environment, same node — runs through). The
//     process writes "plinth failpoint NAME: exiting with code 86" to stderr
//     and calls os.Exit(ExitCode): no deferred function runs, no file is
//     closed cleanly, exactly as a SIGKILL or an OOM kill at that step would
//     leave things. An unknown name or action is an error at startup.
//   - inside a test process, with Enable(name, fn): fn runs at the point (a
//     barrier, a conflicting write); no exit.
//
// The catalogue of points is the constants below; Known lists them.
package failpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Env names the environment variable that arms points in a process, e.g.
// PLINTH_FAILPOINTS=agent.volume.created=once.
const Env = "PLINTH_FAILPOINTS"

// ExitCode is the status a process exits with at an armed point: distinct
// from Go's 2 (panic) and the shells' 1 and 128+signal, so a test (or
// kubelet's lastState.terminated.exitCode) tells a planned crash from a real
// one.
const ExitCode = 86

// The crash points. Each name says where it sits; the comment says what
// exists on the node when a process stops there.
const (
	// AgentMarkSaved: the volume's fencing mark admitted this work and is
	// durable; nothing was done in the kernel yet.
	AgentMarkSaved = "agent.mark.saved"
	// AgentVolumeCreated: the backend made the volume (LV, zvol or file with
	// its loop device); the VolumeState status does not say so yet.
	AgentVolumeCreated = "agent.volume.created"
	// AgentVolumeExpanded: the backend grew the volume; status still holds
	// the old size.
	AgentVolumeExpanded = "agent.volume.expanded"
	// AgentExportCreated: the nvmet subsystem, namespace and port link exist;
	// status has no export yet.
	AgentExportCreated = "agent.export.created"
	// AgentDeleteUnexported: on deletion, the export is gone, the volume not.
	AgentDeleteUnexported = "agent.delete.unexported"
	// AgentDeleteVolumeRemoved: on deletion, the volume is gone; the fencing
	// mark is not released and the finalizer is still on the VolumeState.
	AgentDeleteVolumeRemoved = "agent.delete.volume-removed"
	// AgentDeleteMarkReleased: on deletion, the mark is released; the
	// finalizer is still on the VolumeState.
	AgentDeleteMarkReleased = "agent.delete.mark-released"
	// FencingMarkTorn: in the middle of a fencing-mark write: half of the new
	// mark is in the temp file, not fsynced, not renamed.
	FencingMarkTorn = "fencing.mark.torn"
	// FileCreateSized: the file backend's temp file has its size and is
	// fsynced; it is not renamed to the volume's name yet.
	FileCreateSized = "file.create.sized"
	// FileCreateRenamed: the volume file exists under its name; no loop
	// device is attached to it yet.
	FileCreateRenamed = "file.create.renamed"
	// FileExpandTruncated: the volume file has its new size; the loop device
	// was not told (LOOP_SET_CAPACITY) and still shows the old size.
	FileExpandTruncated = "file.expand.truncated"
	// FileDeleteDetached: the loop device is detached; the file remains.
	FileDeleteDetached = "file.delete.detached"
	// NVMetSubsystemCreated: the nvmet subsystem, its allowed hosts and its
	// namespace exist; the subsystem is not linked to the port yet.
	NVMetSubsystemCreated = "nvmet.subsystem.created"
	// CSIPublishBeforeUpdate: ControllerPublish/Unpublish read the
	// VolumeState and computed the new publications; the compare-and-swap
	// update is not sent yet.
	CSIPublishBeforeUpdate = "csi.publish.before-update"
	// CSIModifyBeforeUpdate: ControllerModifyVolume read the VolumeState and
	// set the new tier in spec.attributes; the compare-and-swap update is not
	// sent yet.
	CSIModifyBeforeUpdate = "csi.modify.before-update"
	// CSICreateSpreadQueued: CreateVolume of a spread NVMe-oF volume found its
	// workload's lock held by another CreateVolume and waits for it; it has
	// counted nothing and written nothing.
	CSICreateSpreadQueued = "csi.create.spread-queued"
	// CSICreateSpreadCounted: CreateVolume of a spread NVMe-oF volume holds its
	// workload's lock, counted the workload's VolumeStates per domain and chose
	// a Store; the VolumeState is not created yet.
	CSICreateSpreadCounted = "csi.create.spread-counted"
	// CSIStageRecordSaved: NodeStage saved the stage record (device known);
	// the device is neither formatted nor mounted at the staging path.
	CSIStageRecordSaved = "csi.stage.record-saved"
	// CSIStageMounted: NodeStage mounted the filesystem at the staging path;
	// kubelet has no answer yet and will call NodeStage again.
	CSIStageMounted = "csi.stage.mounted"
	// CSINodePublishMounted: NodePublish bind-mounted the target; the stage
	// record does not list the target yet.
	CSINodePublishMounted = "csi.node-publish.mounted"
	// CSIUnstageUnmounted: NodeUnstage unmounted the staging path (and
	// disconnected NVMe-oF); the stage record is not removed yet.
	CSIUnstageUnmounted = "csi.unstage.unmounted"
	// CryptFormatted: NodeStage wrote the LUKS2 header of an encrypted volume on its
	// blank device; the mapping is not open, nothing is inside.
	CryptFormatted = "crypt.formatted"
	// CryptOpened: NodeStage opened the volume's dm-crypt mapping; no filesystem is made
	// or mounted in it yet.
	CryptOpened = "crypt.opened"
	// CSIKeyRotated: the CSI controller wrote a new key into a volume's key Secret (the old
	// one as key-previous, the new generation); no header holds the new key yet.
	CSIKeyRotated = "csi.key.rotated"
	// CryptRewrapAdded: a key rotation added the new passphrase's keyslot to a LUKS2 header;
	// the old passphrase's keyslot is still there (both open the volume).
	CryptRewrapAdded = "crypt.rewrap.added"
	// CryptRewrapRemoved: a key rotation removed the old passphrase's keyslot; the key
	// Secret still holds the previous key (not confirmed yet).
	CryptRewrapRemoved = "crypt.rewrap.removed"
	// CSIFreezeBefore: the node plugin is about to FIFREEZE a group member's filesystem for
	// a group snapshot; its timeout is running, nothing is frozen yet (a test holds the
	// freeze here to show the timeout thaws and the group fails).
	CSIFreezeBefore = "csi.freeze.before"
	// CSIFreezeAnswered: the node plugin froze a group member's filesystem and answered
	// Frozen in the member's status; the thaw (group taken, timeout) lives only in this
	// process, so a restarted plugin must thaw it from that answer.
	CSIFreezeAnswered = "csi.freeze.answered"
	// MoveTargetCreated: the agent made the target volume of a move (spec.move) on the
	// target Store; nothing is copied and the status does not say so yet.
	MoveTargetCreated = "move.target-created"
	// MoveCopyStarted: the status says Copying (the target exists); no byte is copied yet.
	MoveCopyStarted = "move.copy-started"
	// MoveCopied: the copy is written and verified (the target's checksum equals the
	// source's); the status still says Copying.
	MoveCopied = "move.copied"
	// MoveSourceDeleted: after the switch (spec.storeName is the target), the source's copy is
	// deleted; the status does not say Done yet.
	MoveSourceDeleted = "move.source-deleted"
)

// Known returns every point name, sorted.
func Known() []string {
	k := []string{
		AgentMarkSaved, AgentVolumeCreated, AgentVolumeExpanded, AgentExportCreated,
		AgentDeleteUnexported, AgentDeleteVolumeRemoved, AgentDeleteMarkReleased,
		FencingMarkTorn, FileCreateSized, FileCreateRenamed, FileExpandTruncated, FileDeleteDetached,
		NVMetSubsystemCreated, CSIPublishBeforeUpdate, CSIModifyBeforeUpdate, CSICreateSpreadQueued, CSICreateSpreadCounted,
		CSIStageRecordSaved, CSIStageMounted, CSINodePublishMounted, CSIUnstageUnmounted,
		CryptFormatted, CryptOpened, CSIKeyRotated, CryptRewrapAdded, CryptRewrapRemoved,
		CSIFreezeBefore, CSIFreezeAnswered,
		MoveTargetCreated, MoveCopyStarted, MoveCopied, MoveSourceDeleted,
	}
	slices.Sort(k)
	return k
}

// Action is what an armed point does in a process.
type Action string

// Actions of PLINTH_FAILPOINTS.
const (
	// Exit exits at every hit.
	Exit Action = "exit"
	// Once exits at the first hit on this node (recorded under the
	// directory given to Configure) and lets later hits through.
	Once Action = "once"
)

var (
	mu      sync.Mutex
	armed   = map[string]Action{}
	funcs   = map[string]func(){}
	onceDir string
	active  bool // fast path: nothing armed
	exit    = os.Exit
)

// Parse reads a PLINTH_FAILPOINTS value ("name=action,..."; empty is none).
// Errors name the entry and list the known points.
func Parse(spec string) (map[string]Action, error) {
	out := map[string]Action{}
	for _, e := range strings.Split(spec, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		name, act, ok := strings.Cut(e, "=")
		if !ok {
			return nil, fmt.Errorf("%s entry %q: want name=action (action exit or once)", Env, e)
		}
		if !slices.Contains(Known(), name) {
			return nil, fmt.Errorf("%s entry %q: unknown point %q; known: %s", Env, e, name, strings.Join(Known(), ", "))
		}
		switch a := Action(act); a {
		case Exit, Once:
			out[name] = a
		default:
			return nil, fmt.Errorf("%s entry %q: unknown action %q (exit or once)", Env, e, act)
		}
	}
	return out, nil
}

// Configure arms the points of spec (the value of Env, see Parse) for this
// process; dir records the hits of "once" points (created when needed; it
// must survive a restart of the process, e.g. the agent's state folder).
// It returns the armed names, sorted, so the caller can log them.
func Configure(spec, dir string) ([]string, error) {
	a, err := Parse(spec)
	if err != nil {
		return nil, err
	}
	for _, act := range a {
		if act == Once && dir == "" {
			return nil, fmt.Errorf("%s: action once needs a folder that survives restarts", Env)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	armed, onceDir = a, dir
	active = len(armed) > 0 || len(funcs) > 0
	names := make([]string, 0, len(a))
	for n := range a {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// Enable makes fn run at every hit of the point name in this process (tests
// only: a barrier between two callers, a write that makes the next one
// conflict). It returns the function that disables it again.
func Enable(name string, fn func()) (disable func()) {
	if !slices.Contains(Known(), name) {
		panic("failpoint: unknown point " + name) // a test's typo, not a runtime path
	}
	mu.Lock()
	funcs[name] = fn
	active = true
	mu.Unlock()
	return func() {
		mu.Lock()
		delete(funcs, name)
		active = len(armed) > 0 || len(funcs) > 0
		mu.Unlock()
	}
}

// Hit marks the point name: nothing unless it is armed (see the package
// doc). Call it exactly where the point's comment says.
func Hit(name string) {
	mu.Lock()
	if !active {
		mu.Unlock()
		return
	}
	fn, act, dir := funcs[name], armed[name], onceDir
	mu.Unlock()
	if fn != nil {
		fn()
	}
	switch act {
	case Exit:
		crash(name)
	case Once:
		marker := filepath.Join(dir, name+".hit")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			fmt.Fprintf(os.Stderr, "plinth failpoint %s: %v; not crashing\n", name, err)
			return
		}
		f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return // hit before this restart
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "plinth failpoint %s: %v; not crashing\n", name, err)
			return
		}
		f.Sync() // the marker must outlive the crash it announces
		f.Close()
		crash(name)
	}
}

func crash(name string) {
	fmt.Fprintf(os.Stderr, "plinth failpoint %s: exiting with code %d\n", name, ExitCode)
	exit(ExitCode)
}
