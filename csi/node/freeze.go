package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/stage"
	"github.com/plinth-storage/plinth/internal/failpoint"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Consumer freeze of group snapshots (docs/design.md#group-snapshots). A group snapshot its
// backend cannot take at one instant alone (members on several Stores, several thin LVs)
// carries spec.freeze on each member: the nodes the source volume is published to. The node
// plugin of each such node freezes the volume's filesystem at its staging path (FIFREEZE),
// answers Frozen in the member's status.freezes (its own entry only: the admission policy
// plinth-csi-node-freeze-scope), and thaws it when every member of the group is taken or has
// failed, or when the group is being deleted, or at spec.freeze.timeoutSeconds after the
// freeze started, whichever comes first. The timeout thaws from a timer of this process, so
// neither the API server nor a FIFREEZE that does not return keeps a filesystem frozen past
// it; a thaw for any reason but "every member taken" fails the group (the agent takes no
// member after it; the CSI controller deletes a group whose freeze ended early). A plugin
// that restarts while a freeze it answered is held thaws it on start and answers FreezeFailed.
//
// The node plugin's API access for this (kustomize/rbac/csi_node.yaml):
//
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumesnapshotstates,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumesnapshotstates/status,verbs=get;patch

// hold is one freeze of this node: a member's filesystem at path.
type hold struct {
	path     string
	mu       sync.Mutex
	frozen   bool          // FIFREEZE returned success and no thaw ran since
	held     *mount.Frozen // while frozen: the thaw goes through it, even after an unmount
	ended    bool          // thawed, or the freeze failed or timed out: no freeze is held
	reason   string
	message  string
	frozenAt time.Time
	thawedAt time.Time
	timer    *time.Timer
}

// end thaws h if it is frozen and marks it ended with reason; a second end keeps the first
// reason. It never waits for the API.
func (h *hold) end(reason, msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return
	}
	h.ended, h.reason, h.message = true, reason, msg
	if h.timer != nil {
		h.timer.Stop()
	}
	if h.frozen {
		if err := h.held.Thaw(); err != nil {
			h.message = fmt.Sprintf("%s; FITHAW: %v", msg, err)
		}
		h.frozen, h.held = false, nil
	}
	h.thawedAt = time.Now()
}

// freezer holds this node's freezes, by member snapshot id; sync runs in one goroutine.
type freezer struct {
	mu     sync.Mutex
	holds  map[string]*hold
	groups map[string]string // member snapshot id → group id, of the holds
	kick   chan string       // group ids to sync
}

// FollowFreezes answers the freezes the group snapshots ask of this node, from the informer
// events of members that carry spec.freeze (Kick) until ctx ends. Without an API client it
// returns at once. ThawLeftovers runs before it, before the plugin serves.
func (s *Service) FollowFreezes(ctx context.Context, members client.Reader) {
	if s.kube == nil {
		return
	}
	retryAfter := time.NewTicker(time.Second)
	defer retryAfter.Stop()
	pending := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			s.freeze.mu.Lock()
			for _, h := range s.freeze.holds {
				h.end(storev1.ReasonFreezeFailed, "the node plugin stopped")
			}
			s.freeze.mu.Unlock()
			return
		case g := <-s.freeze.kick:
			pending[g] = true
		case <-retryAfter.C:
		}
		for g := range pending {
			if err := s.syncGroup(ctx, members, g); err != nil {
				s.log.Error(err, "answer a group snapshot's freeze", "group", g)
				continue // retried on the next tick
			}
			delete(pending, g)
		}
	}
}

// Kick asks FollowFreezes to look at group g again (an informer event of one of its members).
func (s *Service) Kick(g string) {
	select {
	case s.freeze.kick <- g:
	default: // full: the ticker's pass picks up what is pending
		go func() { s.freeze.kick <- g }()
	}
}

// ThawLeftovers thaws, at start, the filesystems of members this node answered Frozen before a
// restart: this process holds no timer for them any more. The driver runs it before it serves,
// so that no NodeUnstageVolume unmounts such a filesystem first (Linux would keep it frozen
// with no mount left to thaw it through). A failed list is its error (the plugin does not
// start); a thawed member whose answer cannot be written is logged (its group then never
// settles as Taken: CreateVolumeGroupSnapshot ends at its wait timeout).
func (s *Service) ThawLeftovers(ctx context.Context, members client.Reader) error {
	if s.kube == nil {
		return nil
	}
	var list storev1.VolumeSnapshotStateList
	if err := members.List(ctx, &list, client.MatchingLabels{storev1.LabelGroupFreeze: "true"}); err != nil {
		return fmt.Errorf("list group members with a freeze at start: %w", err)
	}
	for i := range list.Items {
		m := &list.Items[i]
		f := s.myFreeze(m)
		if f == nil || f.Phase != storev1.FreezeFrozen {
			continue
		}
		msg := "the node plugin restarted while the filesystem was frozen; thawed on start"
		if rec, err := s.stages.Load(m.Spec.SourceVolume); err == nil && !rec.Block {
			if err := mount.Thaw(rec.StagingPath); err != nil {
				msg += fmt.Sprintf(" (FITHAW: %v)", err)
			}
		}
		now := metav1.Now()
		if err := s.answerFreeze(ctx, m.Name, storev1.FreezeStatus{Phase: storev1.FreezeThawed, Reason: storev1.ReasonFreezeFailed,
			Message: msg, FrozenAt: f.FrozenAt, ThawedAt: &now}); err != nil {
			s.log.Error(err, "report the thaw of a freeze left by a restart", "snapshot", m.Name)
		}
	}
	return nil
}

func (s *Service) myFreeze(m *storev1.VolumeSnapshotState) *storev1.FreezeStatus {
	i := slices.IndexFunc(m.Status.Freezes, func(f storev1.FreezeStatus) bool { return f.Node == s.nodeName })
	if i < 0 {
		return nil
	}
	return &m.Status.Freezes[i]
}

// syncGroup moves this node's freezes of group g one step: start the freezes asked for,
// answer them, thaw them once the group is taken, failed or being deleted.
func (s *Service) syncGroup(ctx context.Context, members client.Reader, g string) error {
	var list storev1.VolumeSnapshotStateList
	if err := members.List(ctx, &list, client.MatchingLabels{storev1.LabelGroup: g}); err != nil {
		return err
	}
	var errs []error
	seen := map[string]bool{}
	done, taken := groupOver(list.Items)
	for i := range list.Items {
		m := &list.Items[i]
		if m.Spec.Freeze == nil || !slices.Contains(m.Spec.Freeze.Nodes, s.nodeName) {
			continue
		}
		seen[m.Name] = true
		mine := s.myFreeze(m)
		s.freeze.mu.Lock()
		h := s.freeze.holds[m.Name]
		s.freeze.mu.Unlock()
		switch {
		case mine != nil && (mine.Phase == storev1.FreezeNotMounted || mine.Phase == storev1.FreezeThawed):
			s.drop(m.Name) // answered for good
		case h == nil && mine != nil: // Frozen by a process before a restart: ThawLeftovers answered
		case h == nil && done:
			// over before this node froze anything (failed elsewhere, or deleted)
		case h == nil:
			rec, err := s.stages.Load(m.Spec.SourceVolume)
			if err != nil || rec.Block {
				why := fmt.Sprintf("volume %s is not staged with a filesystem on node %s", m.Spec.SourceVolume, s.nodeName)
				if err != nil && !errors.Is(err, stage.ErrNotFound) {
					why += fmt.Sprintf(" (stage record: %v)", err)
				}
				errs = append(errs, s.answerFreeze(ctx, m.Name, storev1.FreezeStatus{Phase: storev1.FreezeNotMounted, Message: why}))
				continue
			}
			s.startFreeze(m, g, rec.StagingPath)
		default:
			if done && !h.isEnded() {
				reason, msg := storev1.ReasonFreezeTaken, "every member of the group was taken while frozen"
				if !taken {
					reason, msg = storev1.ReasonFreezeGroupFailed, "the group failed or is being deleted"
				}
				h.end(reason, msg)
			}
			errs = append(errs, s.report(ctx, m, mine, h))
		}
	}
	// members deleted while this node held their freeze: thaw, nothing left to answer
	s.freeze.mu.Lock()
	var gone []*hold
	for name, h := range s.freeze.holds {
		if !seen[name] && s.holdGroup(name) == g {
			gone = append(gone, h)
			delete(s.freeze.holds, name)
		}
	}
	s.freeze.mu.Unlock()
	for _, h := range gone {
		h.end(storev1.ReasonFreezeGroupFailed, "the member was deleted")
	}
	return errors.Join(errs...)
}

// frozenAt names the member whose freeze this process holds on the filesystem staged at
// path ("" when none): NodeUnstageVolume must not unmount it, since Linux unmounts a frozen
// filesystem and leaves its superblock frozen with no mount to thaw it through.
func (s *Service) frozenAt(path string) string {
	s.freeze.mu.Lock()
	defer s.freeze.mu.Unlock()
	for name, h := range s.freeze.holds {
		h.mu.Lock()
		frozen := h.path == path && (h.frozen || !h.ended)
		h.mu.Unlock()
		if frozen {
			return name
		}
	}
	return ""
}

// holdGroup is the group of a held member: members' ids are recorded with their group.
func (s *Service) holdGroup(name string) string { return s.freeze.groups[name] }

func (h *hold) isEnded() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended
}

// groupOver reports whether the group of members is over for its freezes: every member
// exists and is taken or failed, or one is being deleted; taken: all are ready.
func groupOver(members []storev1.VolumeSnapshotState) (done, taken bool) {
	if len(members) == 0 {
		return true, false
	}
	want := len(members[0].Spec.GroupMembers)
	taken = len(members) == want
	settled := len(members) == want
	for _, m := range members {
		if m.DeletionTimestamp != nil || m.Status.Phase == storev1.SnapshotFailed {
			return true, false
		}
		if !m.Status.ReadyToUse {
			taken, settled = false, false
		}
	}
	return settled, taken
}

// startFreeze freezes path for member m of group g in a goroutine, its timeout running from
// now; the answer is written by the next sync of g.
func (s *Service) startFreeze(m *storev1.VolumeSnapshotState, g, path string) {
	h := &hold{path: path}
	timeout := time.Duration(m.Spec.Freeze.TimeoutSeconds) * time.Second
	s.freeze.mu.Lock()
	s.freeze.holds[m.Name] = h
	s.freeze.groups[m.Name] = g
	s.freeze.mu.Unlock()
	h.mu.Lock()
	h.timer = time.AfterFunc(timeout, func() {
		h.end(storev1.ReasonFreezeTimeout, fmt.Sprintf("thawed at the timeout of %s: the group was not taken by then", timeout))
		s.Kick(g)
	})
	h.mu.Unlock()
	go func() {
		failpoint.Hit(failpoint.CSIFreezeBefore)
		held, err := mount.FreezeHeld(path)
		h.mu.Lock()
		switch {
		case err != nil && !h.ended:
			h.ended, h.reason, h.message, h.thawedAt = true, storev1.ReasonFreezeFailed, err.Error(), time.Now()
			h.timer.Stop()
		case err != nil:
		case h.ended: // the timeout passed while FIFREEZE ran: thaw at once
			if terr := held.Thaw(); terr != nil {
				h.message += fmt.Sprintf("; FITHAW after a late FIFREEZE: %v", terr)
			}
		default:
			h.frozen, h.held, h.frozenAt = true, held, time.Now()
		}
		h.mu.Unlock()
		s.Kick(g)
	}()
	s.log.Info("freezing a group member's filesystem", "group", g, "snapshot", m.Name, "volume", m.Spec.SourceVolume, "path", path, "timeout", timeout)
}

// report writes h's state as this node's answer for m when it differs from mine.
func (s *Service) report(ctx context.Context, m *storev1.VolumeSnapshotState, mine *storev1.FreezeStatus, h *hold) error {
	h.mu.Lock()
	want := storev1.FreezeStatus{Message: h.message}
	switch {
	case h.ended:
		want.Phase, want.Reason = storev1.FreezeThawed, h.reason
		t := metav1.NewTime(h.thawedAt)
		want.ThawedAt = &t
	case h.frozen:
		want.Phase, want.Message = storev1.FreezeFrozen, "frozen at "+h.path
	default:
		h.mu.Unlock()
		return nil // FIFREEZE still running
	}
	if !h.frozenAt.IsZero() {
		t := metav1.NewTime(h.frozenAt)
		want.FrozenAt = &t
	}
	h.mu.Unlock()
	if mine != nil && mine.Phase == want.Phase && mine.Reason == want.Reason {
		return nil
	}
	if err := s.answerFreeze(ctx, m.Name, want); err != nil {
		return err
	}
	if want.Phase == storev1.FreezeFrozen {
		failpoint.Hit(failpoint.CSIFreezeAnswered)
	}
	return nil
}

// drop forgets the hold of member name once its final answer is written.
func (s *Service) drop(name string) {
	s.freeze.mu.Lock()
	defer s.freeze.mu.Unlock()
	if h := s.freeze.holds[name]; h != nil && h.isEnded() {
		delete(s.freeze.holds, name)
		delete(s.freeze.groups, name)
	}
}

// answerFreeze sets this node's entry of member name's status.freezes to f (its Node set
// here), read live and patched with an optimistic lock, retried on conflicts.
func (s *Service) answerFreeze(ctx context.Context, name string, f storev1.FreezeStatus) error {
	f.Node = s.nodeName
	s.log.V(1).Info("answering a group snapshot's freeze", "snapshot", name, "phase", f.Phase, "reason", f.Reason)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var m storev1.VolumeSnapshotState
		if err := s.live.Get(ctx, client.ObjectKey{Name: name}, &m); err != nil {
			return client.IgnoreNotFound(err)
		}
		before := m.DeepCopy()
		i := slices.IndexFunc(m.Status.Freezes, func(x storev1.FreezeStatus) bool { return x.Node == s.nodeName })
		if i < 0 {
			m.Status.Freezes = append(m.Status.Freezes, f)
		} else {
			m.Status.Freezes[i] = f
		}
		return s.kube.Status().Patch(ctx, &m, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	})
}
