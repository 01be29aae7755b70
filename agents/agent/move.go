package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"golang.org/x/sys/unix"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/failpoint"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Event reasons of a move (on the VolumeState).
const (
	ReasonMoveCopied   = "MoveCopied"
	ReasonMoveFinished = "MoveFinished"
	ReasonMoveFailed   = "MoveFailed"
)

// moveChunk is the copy's unit: one read and one write of the source and target devices.
const moveChunk = 4 << 20

// move carries out the agent's part of spec.move once the volume is Ready on
// spec.storeName (docs/design.md, "Data mobility"): before the switch (storeName is the
// move's source) it makes the target volume on the target Store, copies the source's bytes
// into it and verifies them (status.move Copied); after the switch (storeName is the target,
// where converge now serves the volume) it deletes the source's copy (Done). A move cleared
// before its switch has its target copy deleted, so no second copy stays behind. Only moves
// between two Stores of this node are carried out; any other is Failed, naming why.
//
// Every step is idempotent and found again from the backends, not from memory: a crash at
// any point resumes at the next reconcile (the copy starts again from byte 0).
func (r *volumeReconciler) move(ctx context.Context, vs *storev1.VolumeState) (ctrl.Result, error) {
	m, st := vs.Spec.Move, vs.Status.Move
	if m == nil {
		if st == nil || st.Phase == storev1.MoveDone || st.Phase == storev1.MoveFailed || vs.Spec.StoreName != st.SourceStore {
			return ctrl.Result{}, nil
		}
		// cleared before the switch: the source stays the live copy, the target goes
		before := vs.DeepCopy()
		if err := r.deleteCopy(ctx, st.TargetStore, vs.Name); err != nil {
			return r.moveRetry(ctx, vs, before, fmt.Sprintf("move %s cancelled; deleting its copy on %s: %v", st.ID, st.TargetStore, err))
		}
		st.Phase, st.Message = storev1.MoveFailed, "cancelled before the switch (spec.move cleared): the copy on "+st.TargetStore+" is deleted"
		return r.status(ctx, vs, before, ctrl.Result{})
	}
	if st != nil && st.ID == m.ID && (st.Phase == storev1.MoveDone || st.Phase == storev1.MoveFailed) {
		return ctrl.Result{}, nil
	}
	before := vs.DeepCopy()
	if st == nil || st.ID != m.ID {
		st = &storev1.MoveStatus{ID: m.ID, SourceStore: m.SourceStore, TargetStore: m.TargetStore}
		vs.Status.Move = st
	}
	switch vs.Spec.StoreName {
	case m.TargetStore:
		return r.moveFinish(ctx, vs, before)
	case m.SourceStore:
	default:
		return ctrl.Result{}, nil // refused by the CRD's rules; nothing to act on
	}
	if st.Phase == storev1.MoveCopied && st.PublicationGeneration == vs.Spec.PublicationGeneration {
		return ctrl.Result{}, nil // the controller switches storeName next
	}
	// else not copied yet, or a consumer was let in since the copy: it is made again

	target, err := r.moveTarget(ctx, vs, m)
	if target == nil {
		if err != nil {
			return ctrl.Result{}, err
		}
		res := ctrl.Result{}
		if vs.Status.Move.Phase == storev1.MoveWaiting {
			res.RequeueAfter = r.opts.RefreshInterval // a Store's arrival wakes no volume
		}
		return r.status(ctx, vs, before, res)
	}
	if pubs := vs.Spec.Publications; len(pubs) > 0 {
		// offline copy: a consumer writing the source during the copy would be lost
		nodes := make([]string, 0, len(pubs))
		for _, p := range pubs {
			nodes = append(nodes, p.NodeName)
		}
		st.Phase, st.Message = storev1.MoveWaiting, "waiting for the consumer to stop: published to "+strings.Join(nodes, ", ")
		return r.status(ctx, vs, before, ctrl.Result{})
	}
	tbe, err := r.backend(ctx, target, r.runtime(target))
	if err != nil {
		return r.moveRetry(ctx, vs, before, fmt.Sprintf("target store %s: %v", target.Name, err))
	}
	total := vs.Status.ActualBytes
	tv, err := tbe.Get(ctx, vs.Name)
	if errors.Is(err, backend.ErrNotFound) {
		tv, err = r.timed("create", func() (backend.Volume, error) { return tbe.Create(ctx, vs.Name, total) })
		if err == nil {
			failpoint.Hit(failpoint.MoveTargetCreated)
		}
	}
	if err != nil {
		return r.moveRetry(ctx, vs, before, fmt.Sprintf("target volume on %s: %v", target.Name, err))
	}
	if tv.SizeBytes < total {
		return r.moveRetry(ctx, vs, before, fmt.Sprintf("target volume on %s has %d bytes, the source %d", target.Name, tv.SizeBytes, total))
	}
	dst := tv.DevicePath
	if dst == "" {
		if dst, err = tbe.DevicePath(ctx, vs.Name); err != nil {
			return r.moveRetry(ctx, vs, before, fmt.Sprintf("target device on %s: %v", target.Name, err))
		}
	}
	now := metav1.Now()
	st.Phase, st.Message, st.BytesTotal, st.BytesCopied, st.Checksum, st.StartedAt, st.CopiedAt = storev1.MoveCopying, "", total, 0, "", &now, nil
	st.PublicationGeneration = vs.Spec.PublicationGeneration
	if _, err := r.status(ctx, vs, before, ctrl.Result{}); err != nil {
		return ctrl.Result{}, err
	}
	// the patch replaced vs.Status.Move with the server's copy
	before, st = vs.DeepCopy(), vs.Status.Move
	failpoint.Hit(failpoint.MoveCopyStarted)

	sum, err := copyVerify(ctx, vs.Status.DevicePath, dst, total)
	OperationDuration.WithLabelValues("move-copy").Observe(metav1.Now().Sub(now.Time).Seconds())
	if err != nil {
		// the source stays the live copy; the next try copies again
		return r.moveRetry(ctx, vs, before, fmt.Sprintf("copy %s → %s: %v", vs.Status.DevicePath, dst, err))
	}
	failpoint.Hit(failpoint.MoveCopied)
	// a publication made while the copy ran (a new generation) voids it: the consumer may
	// have written the source since
	var live storev1.VolumeState
	if err := r.reader.Get(ctx, client.ObjectKeyFromObject(vs), &live); err != nil {
		return ctrl.Result{}, err
	}
	if live.Generation != vs.Generation {
		return ctrl.Result{}, nil // the new generation comes as its own event
	}
	done := metav1.Now()
	st.Phase, st.BytesCopied, st.Checksum, st.CopiedAt = storev1.MoveCopied, total, sum, &done
	MoveBytes.Add(float64(total))
	r.events.Eventf(vs, nil, corev1.EventTypeNormal, ReasonMoveCopied, "Move", "move %s: %d bytes copied from %s to %s and verified (%s)",
		m.ID, total, m.SourceStore, m.TargetStore, sum)
	return r.status(ctx, vs, before, ctrl.Result{})
}

// moveTarget returns the move's target Store when this agent can carry the move out; else
// it sets status.move (Failed, or Waiting for a Store not seen yet) and returns nil.
func (r *volumeReconciler) moveTarget(ctx context.Context, vs *storev1.VolumeState, m *storev1.VolumeMove) (*storev1.Store, error) {
	st := vs.Status.Move
	var target storev1.Store
	err := r.reader.Get(ctx, client.ObjectKey{Name: m.TargetStore}, &target)
	if apierrors.IsNotFound(err) {
		st.Phase, st.Message = storev1.MoveWaiting, "target store "+m.TargetStore+" not found"
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	fail := func(msg string) (*storev1.Store, error) {
		st.Phase, st.Message = storev1.MoveFailed, msg
		r.events.Eventf(vs, nil, corev1.EventTypeWarning, ReasonMoveFailed, "Move", "move %s: %s", m.ID, msg)
		return nil, nil
	}
	switch {
	case target.Spec.NodeName != r.opts.NodeName:
		return fail(fmt.Sprintf("target store %s is on node %s, the source on %s: moves between nodes are not carried out yet", target.Name, target.Spec.NodeName, r.opts.NodeName))
	case target.IsDraining():
		return fail("target store " + target.Name + " is draining or evacuated: it takes no new volume")
	}
	var snaps storev1.VolumeSnapshotStateList
	if err := r.client.List(ctx, &snaps); err != nil {
		return nil, err
	}
	for _, s := range snaps.Items {
		if s.Spec.SourceVolume == vs.Name {
			return fail("the volume has snapshots (" + s.Name + "), which are not moved: moving it would strand them")
		}
	}
	return &target, nil
}

// moveFinish deletes the source's copy once the volume is served from the target (converge
// ran on spec.storeName = the target before this) and marks the move Done.
func (r *volumeReconciler) moveFinish(ctx context.Context, vs, before *storev1.VolumeState) (ctrl.Result, error) {
	st := vs.Status.Move
	if err := r.deleteCopy(ctx, st.SourceStore, vs.Name); err != nil {
		return r.moveRetry(ctx, vs, before, fmt.Sprintf("delete the source's copy on %s: %v", st.SourceStore, err))
	}
	failpoint.Hit(failpoint.MoveSourceDeleted)
	st.Phase, st.Message = storev1.MoveDone, ""
	r.events.Eventf(vs, nil, corev1.EventTypeNormal, ReasonMoveFinished, "Move", "move %s: served from %s; the copy on %s is deleted",
		st.ID, st.TargetStore, st.SourceStore)
	return r.status(ctx, vs, before, ctrl.Result{})
}

// deleteCopy deletes volume id on the Store named store (of this node); absent is done.
func (r *volumeReconciler) deleteCopy(ctx context.Context, store, id string) error {
	var s storev1.Store
	if err := r.reader.Get(ctx, client.ObjectKey{Name: store}, &s); err != nil {
		return fmt.Errorf("read store %s: %w", store, err)
	}
	if s.Spec.NodeName != r.opts.NodeName {
		return fmt.Errorf("store %s belongs to node %s: %w", s.Name, s.Spec.NodeName, errOtherNode)
	}
	be, err := r.backend(ctx, &s, r.runtime(&s))
	if err != nil {
		return err
	}
	if _, err := be.Get(ctx, id); errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	_, err = r.timed("delete", func() (backend.Volume, error) { return backend.Volume{}, be.Delete(ctx, id) })
	return err
}

// moveRetry records why a step failed (status.move.message; the phase stays) and retries
// at the refresh interval: the source stays the live copy.
func (r *volumeReconciler) moveRetry(ctx context.Context, vs, before *storev1.VolumeState, msg string) (ctrl.Result, error) {
	ctrl.LoggerFrom(ctx).Info("move step failed; retrying", "volume", vs.Name, "message", msg)
	vs.Status.Move.Message = msg
	return r.status(ctx, vs, before, ctrl.Result{RequeueAfter: r.opts.RefreshInterval})
}

// copyVerify copies the first n bytes of the block device (or file) src into dst, flushes
// dst to stable storage, drops its cached pages and reads them back: it returns
// "sha256:<hex>" of the n bytes when the target's read-back equals the source's, else an
// error naming the difference. ctx ends the copy between chunks.
func copyVerify(ctx context.Context, src, dst string, n int64) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return "", err
	}
	defer out.Close()
	hs := sha256.New()
	buf := make([]byte, moveChunk)
	for off := int64(0); off < n; {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		c := buf[:min(int64(len(buf)), n-off)]
		if _, err := in.ReadAt(c, off); err != nil {
			return "", fmt.Errorf("read source at %d: %w", off, err)
		}
		if _, err := out.WriteAt(c, off); err != nil {
			return "", fmt.Errorf("write target at %d: %w", off, err)
		}
		hs.Write(c)
		off += int64(len(c))
	}
	if err := out.Sync(); err != nil {
		return "", fmt.Errorf("flush target: %w", err)
	}
	want := "sha256:" + hex.EncodeToString(hs.Sum(nil))
	got, err := sumOf(ctx, dst, n)
	if err != nil {
		return "", fmt.Errorf("read back target: %w", err)
	}
	if got != want {
		return "", fmt.Errorf("target reads %s, the source %s", got, want)
	}
	return want, nil
}

// sumOf is "sha256:<hex>" of the first n bytes of path, read past the page cache's copy
// (dropped first), so it is what the device holds.
func sumOf(ctx context.Context, path string, n int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, n, unix.FADV_DONTNEED); err != nil {
		return "", fmt.Errorf("drop cached pages: %w", err)
	}
	h := sha256.New()
	if err := copyN(ctx, h, f, n); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func copyN(ctx context.Context, h hash.Hash, f *os.File, n int64) error {
	buf := make([]byte, moveChunk)
	for off := int64(0); off < n; {
		if err := ctx.Err(); err != nil {
			return err
		}
		c := buf[:min(int64(len(buf)), n-off)]
		if _, err := io.ReadFull(f, c); err != nil {
			return fmt.Errorf("read at %d: %w", off, err)
		}
		h.Write(c)
		off += int64(len(c))
	}
	return nil
}
