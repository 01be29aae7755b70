package agent

import (
	"context"
	"fmt"
	"slices"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/plinth-storage/plinth/agents/backend"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// groupConsistency says, for the Ready condition of a group member, what instant the backend
// of store captures (docs/design.md#group-snapshots).
func groupConsistency(store *storev1.Store) string {
	switch b := store.Spec.Backend; {
	case b.ZFS != nil:
		return "crash-consistent: one atomic zfs snapshot of every member"
	case b.LVM != nil:
		return "crash-consistent: a group of one thin LV (several are taken under their consumers' freeze)"
	case b.File != nil:
		return "crash-consistent for members with a mounted filesystem (frozen together); others copied unfrozen"
	}
	return "crash-consistent"
}

// takeGroup takes the group snapshot ss is a member of, all its members at once (the backend's
// GroupSnapshotter), once every member object of ss.Spec.GroupMembers exists on this Store and
// none is being deleted; then it reports every member ready. A member missing still (the CSI
// controller creates them one after the other) waits for its creation, whose own reconcile
// takes the group. Each member is a snapshot like any other from then on: restored, listed
// and deleted alone.
func (r *snapshotReconciler) takeGroup(ctx context.Context, ss *storev1.VolumeSnapshotState, sn backend.Snapshotter, store *storev1.Store) (ctrl.Result, error) {
	if ss.Spec.Freeze != nil {
		return r.takeFrozen(ctx, ss, sn)
	}
	var list storev1.VolumeSnapshotStateList
	if err := r.client.List(ctx, &list, client.MatchingLabels{storev1.LabelGroup: ss.Spec.Group}); err != nil {
		return ctrl.Result{}, err
	}
	byName := map[string]*storev1.VolumeSnapshotState{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	byName[ss.Name] = ss
	members := make([]*storev1.VolumeSnapshotState, 0, len(ss.Spec.GroupMembers))
	for _, id := range ss.Spec.GroupMembers {
		m, ok := byName[id]
		if !ok || m.Spec.Group != ss.Spec.Group || !slices.Equal(m.Spec.GroupMembers, ss.Spec.GroupMembers) {
			return ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil // not all created yet
		}
		if m.DeletionTimestamp != nil {
			return ctrl.Result{}, nil // the group is being deleted: nothing to take
		}
		if m.Spec.StoreName != store.Name {
			return r.failGroup(ctx, []*storev1.VolumeSnapshotState{ss}, storev1.ReasonSnapshotFailed,
				fmt.Sprintf("group %s: member %s is on store %s, not %s: a group is taken on one store", ss.Spec.Group, id, m.Spec.StoreName, store.Name))
		}
		members = append(members, m)
	}
	if !slices.Contains(ss.Spec.GroupMembers, ss.Name) {
		return r.failGroup(ctx, []*storev1.VolumeSnapshotState{ss}, storev1.ReasonSnapshotFailed,
			fmt.Sprintf("group %s does not list this snapshot among its members", ss.Spec.Group))
	}
	gs, ok := sn.(backend.GroupSnapshotter)
	if !ok && len(members) == 1 { // one snapshot is of one instant
		gs, ok = singleGroup{sn}, true
	}
	if !ok {
		return r.failGroup(ctx, members, storev1.ReasonSnapshotUnsupported,
			fmt.Sprintf("the %s backend of store %s takes no group snapshots", store.Spec.Backend.Kind(), store.Name))
	}
	// every member keeps the backend's snapshot until it is removed, from before it is taken
	for _, m := range members {
		if !controllerutil.ContainsFinalizer(m, FinalizerSnapshot) {
			controllerutil.AddFinalizer(m, FinalizerSnapshot)
			if err := r.client.Update(ctx, m); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	req := make([]backend.GroupMember, len(members))
	for i, m := range members {
		req[i] = backend.GroupMember{SnapID: m.Name, VolID: m.Spec.SourceVolume}
	}
	var snaps []backend.Snapshot
	_, err := r.timedSnapshot(func() (backend.Snapshot, error) {
		var err error
		snaps, err = gs.CreateGroupSnapshot(ctx, req)
		return backend.Snapshot{}, err
	})
	if err != nil {
		reason := snapshotFailureReason(err)
		return r.failGroup(ctx, members, reason, fmt.Sprintf("group %s: %v", ss.Spec.Group, err))
	}
	how := groupConsistency(store)
	for i, m := range members {
		before := m.DeepCopy()
		markSnapshotReady(m, snaps[i], fmt.Sprintf(", member %d of %d of group %s (%s)", i+1, len(members), ss.Spec.Group, how))
		if _, err := r.status(ctx, m, before, ctrl.Result{}); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// failGroup reports the members failed with reason and msg, and retries after the refresh
// interval, like a single snapshot.
func (r *snapshotReconciler) failGroup(ctx context.Context, members []*storev1.VolumeSnapshotState, reason, msg string) (ctrl.Result, error) {
	for _, m := range members {
		before := m.DeepCopy()
		m.Status.Phase = storev1.SnapshotFailed
		setCond(&m.Status.Conditions, m.Generation, CondReady, false, reason, msg)
		if _, err := r.status(ctx, m, before, ctrl.Result{}); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: r.opts.RefreshInterval}, nil
}

// singleGroup takes a group of one member as a single snapshot, for backends without
// GroupSnapshotter (thin LVM).
type singleGroup struct{ backend.Snapshotter }

func (g singleGroup) CreateGroupSnapshot(ctx context.Context, members []backend.GroupMember) ([]backend.Snapshot, error) {
	if len(members) != 1 {
		return nil, fmt.Errorf("a group of %d volumes: %w", len(members), backend.ErrUnsupported)
	}
	s, err := g.CreateSnapshot(ctx, members[0].SnapID, members[0].VolID)
	if err != nil {
		return nil, err
	}
	return []backend.Snapshot{s}, nil
}

// freezePoll is how often the agent looks again at a group member's consumer freezes while it
// waits for them: the answers are status changes, which do not start a reconcile.
const freezePoll = 250 * time.Millisecond

// freezeGrace is how long after spec.freeze.timeoutSeconds from the member's creation the
// agent waits for a node that never answered before it fails the group.
const freezeGrace = 5 * time.Second

// takeFrozen takes member ss of a group taken under its consumers' freeze (spec.freeze) as a
// single snapshot, once every node of spec.freeze.nodes answered Frozen (or NotMounted: it
// holds no filesystem of the volume). Every member is taken while its own filesystems are
// frozen, and no freeze is thawed as "taken" before every member is: so all members hold the
// volumes' contents of the instant the last freeze began. A freeze that ended otherwise (its
// timeout, a failed FIFREEZE) or a node that does not answer within the timeout fails the
// member with reason GroupFreezeLost, and the CSI controller deletes the group.
func (r *snapshotReconciler) takeFrozen(ctx context.Context, ss *storev1.VolumeSnapshotState, sn backend.Snapshotter) (ctrl.Result, error) {
	fz := ss.Spec.Freeze
	ctrl.LoggerFrom(ctx).V(1).Info("group member under a consumer freeze", "freezes", ss.Status.Freezes)
	var frozen []string
	for _, n := range fz.Nodes {
		i := slices.IndexFunc(ss.Status.Freezes, func(f storev1.FreezeStatus) bool { return f.Node == n })
		switch {
		case i < 0:
			limit := time.Duration(fz.TimeoutSeconds)*time.Second + freezeGrace
			if age := time.Since(ss.CreationTimestamp.Time); age > limit {
				return r.failGroup(ctx, []*storev1.VolumeSnapshotState{ss}, storev1.ReasonGroupFreezeLost,
					fmt.Sprintf("group %s: node %s did not freeze the filesystem of %s within %s", ss.Spec.Group, n, ss.Spec.SourceVolume, limit))
			}
			return ctrl.Result{RequeueAfter: freezePoll}, nil
		case ss.Status.Freezes[i].Phase == storev1.FreezeFrozen:
			frozen = append(frozen, n)
		case ss.Status.Freezes[i].Phase == storev1.FreezeNotMounted:
		default:
			f := ss.Status.Freezes[i]
			return r.failGroup(ctx, []*storev1.VolumeSnapshotState{ss}, storev1.ReasonGroupFreezeLost,
				fmt.Sprintf("group %s: node %s thawed the filesystem of %s before it was taken (reason %s): %s", ss.Spec.Group, n, ss.Spec.SourceVolume, f.Reason, f.Message))
		}
	}
	before := ss.DeepCopy()
	snap, err := r.timedSnapshot(func() (backend.Snapshot, error) { return sn.CreateSnapshot(ctx, ss.Name, ss.Spec.SourceVolume) })
	if err != nil {
		return r.failGroup(ctx, []*storev1.VolumeSnapshotState{ss}, snapshotFailureReason(err), fmt.Sprintf("group %s: %v", ss.Spec.Group, err))
	}
	how := "nothing wrote to it: published to no node"
	if len(frozen) > 0 {
		how = fmt.Sprintf("taken while its filesystem was frozen on %v", frozen)
	} else if len(fz.Nodes) > 0 {
		how = fmt.Sprintf("not mounted on %v", fz.Nodes)
	}
	markSnapshotReady(ss, snap, fmt.Sprintf(", member of group %s (crash-consistent under the consumers' freeze: %s; the group fails if a freeze ends before every member is taken)",
		ss.Spec.Group, how))
	return r.status(ctx, ss, before, ctrl.Result{})
}
