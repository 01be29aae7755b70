package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/nvmet"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// orphans returns the drift items of the volumes in vols that no VolumeState of this node
// names (known). Under driftPolicy Correct an orphan seen for OrphanGracePeriod on this
// process's refreshes is deleted — export first, then the volume, and its fencing mark is
// released so that a new lifecycle of the same name is admitted —, unless its identity stamp
// is unreadable or was written under another Store object (foreignStamp: a volume of a lost
// control plane, kept for `plinth adopt`); it is reported until then,
// and when the deletion fails. Orphans appear when a VolumeState was deleted while its node
// was away (the CSI controller releases the finalizer of a deleted Node) or by hand.
func (r *storeReconciler) orphans(ctx context.Context, s *storev1.Store, rt *storeRuntime, vols []backend.Volume, known map[string]bool) []storev1.DriftItem {
	correct := s.Spec.DriftPolicy == policyv1.DriftPolicyCorrect
	now := time.Now()
	r.mu.Lock()
	prev := r.orphanSince[s.Name]
	seen := map[string]time.Time{}
	for _, v := range vols {
		if known[v.ID] {
			continue
		}
		since, ok := prev[v.ID]
		if !ok {
			since = now
		}
		seen[v.ID] = since
	}
	r.orphanSince[s.Name] = seen
	r.mu.Unlock()

	var items []storev1.DriftItem
	for _, v := range vols {
		since, ok := seen[v.ID]
		if !ok {
			continue
		}
		msg := fmt.Sprintf("volume %s carries Plinth's name but no VolumeState names it (driftPolicy Report: reported, never deleted)", v.ID)
		keep := foreignStamp(s, v)
		if correct && keep != "" {
			msg = fmt.Sprintf("volume %s carries Plinth's name but no VolumeState names it; driftPolicy Correct keeps it: %s", v.ID, keep)
		}
		if correct && keep == "" {
			due := since.Add(r.opts.OrphanGracePeriod)
			if !now.Before(due) {
				err := r.deleteOrphan(ctx, rt, v.ID)
				if err == nil {
					r.mu.Lock()
					delete(r.orphanSince[s.Name], v.ID)
					r.mu.Unlock()
					continue
				}
				msg = fmt.Sprintf("volume %s carries Plinth's name but no VolumeState names it; deleting it under driftPolicy Correct failed: %v", v.ID, err)
			} else {
				msg = fmt.Sprintf("volume %s carries Plinth's name but no VolumeState names it; driftPolicy Correct deletes it if it is still so at %s",
					v.ID, due.UTC().Format(time.RFC3339))
			}
		}
		items = append(items, storev1.DriftItem{Kind: KindLogicalVolume, Name: v.ID, Reason: DriftOrphan, Message: msg})
	}
	return items
}

// deleteOrphan removes the export and the volume id under the volume's fencing lock, after
// checking again that no VolumeState names it, then releases its mark.
func (r *storeReconciler) deleteOrphan(ctx context.Context, rt *storeRuntime, id string) error {
	unlock, err := r.marks.Lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	var vs storev1.VolumeState
	if err := r.client.Get(ctx, client.ObjectKey{Name: id}, &vs); err == nil {
		return fmt.Errorf("VolumeState %s appeared: not an orphan", id)
	}
	rt.mu.Lock()
	be := rt.be
	rt.mu.Unlock()
	if be == nil {
		return errors.New("backend not built yet")
	}
	if nqn, err := nvmet.VolumeNQN(id); err == nil {
		// no subsystem (or no configfs): nothing to remove
		if err := r.target.Unexport(ctx, nqn); err != nil {
			return fmt.Errorf("unexport %s: %w", nqn, err)
		}
	}
	if err := be.Delete(ctx, id); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	m, found, err := r.marks.Load(id)
	if err == nil && found && !m.Released {
		m.Released = true
		if err := r.marks.Save(id, m); err != nil {
			return fmt.Errorf("volume deleted, mark not released: %w", err)
		}
	}
	ctrl.LoggerFrom(ctx).Info("deleted an orphan volume under driftPolicy Correct", "volume", id, "gracePeriod", r.opts.OrphanGracePeriod)
	return nil
}
