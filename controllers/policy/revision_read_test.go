package policy

import (
	"strings"
	"testing"

	"github.com/fluxcd/pkg/runtime/conditions"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// The revision a policy object reports is the one the sync tool applied, never one it only
// tried: a refused newer revision is said apart.
func TestSyncToolRevisions(t *testing.T) {
	ready := func(status, msg string) []any {
		return []any{map[string]any{"type": "Ready", "status": status, "message": msg}}
	}
	cases := []struct {
		name    string
		read    func(map[string]any) syncRevision
		status  map[string]any
		applied string
		refused string
		why     string
	}{
		{"flux in sync", kustomizationRevision, map[string]any{"lastAppliedRevision": "main@sha1:r1", "lastAttemptedRevision": "main@sha1:r1", "conditions": ready("True", "Applied revision: main@sha1:r1")}, "main@sha1:r1", "", ""},
		{"flux refused a newer revision", kustomizationRevision, map[string]any{"lastAppliedRevision": "main@sha1:r1", "lastAttemptedRevision": "main@sha1:r2", "conditions": ready("False", `Placement/fast dry-run failed: unknown field "spec.reclaimPolcy"`)}, "main@sha1:r1", "main@sha1:r2", `Placement/fast dry-run failed: unknown field "spec.reclaimPolcy"`},
		{"flux applying a newer revision", kustomizationRevision, map[string]any{"lastAppliedRevision": "main@sha1:r1", "lastAttemptedRevision": "main@sha1:r2", "conditions": ready("Unknown", "Reconciliation in progress")}, "main@sha1:r1", "", ""},
		{"flux first apply refused", kustomizationRevision, map[string]any{"lastAttemptedRevision": "main@sha1:r1", "conditions": ready("False", "dry-run failed")}, "", "main@sha1:r1", "dry-run failed"},
		{"flux without status", kustomizationRevision, nil, "", "", ""},
		{"argo synced", applicationRevision, map[string]any{"sync": map[string]any{"revision": "r1"}, "history": []any{map[string]any{"revision": "r0"}, map[string]any{"revision": "r1"}}, "operationState": map[string]any{"phase": "Succeeded", "syncResult": map[string]any{"revision": "r1"}}}, "r1", "", ""},
		{"argo sync failed", applicationRevision, map[string]any{"sync": map[string]any{"revision": "r2"}, "history": []any{map[string]any{"revision": "r1"}}, "operationState": map[string]any{"phase": "Failed", "message": "one or more objects failed to apply", "syncResult": map[string]any{"revision": "r2"}}}, "r1", "r2", "one or more objects failed to apply"},
		{"argo out of sync, never synced", applicationRevision, map[string]any{"sync": map[string]any{"revision": "r2"}}, "", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			obj := map[string]any{}
			if c.status != nil {
				obj["status"] = c.status
			}
			got := c.read(obj)
			if got.applied != c.applied || got.refused != c.refused || got.why != c.why {
				t.Fatalf("got applied %q refused %q why %q, want %q %q %q", got.applied, got.refused, got.why, c.applied, c.refused, c.why)
			}
		})
	}
}

func TestSetSynced(t *testing.T) {
	cases := []struct {
		name           string
		rev            *syncRevision
		status, reason string
		msg            []string
	}{
		{"unread keeps", nil, "True", ReasonRevisionApplied, []string{"revision r0"}},
		{"no sync tool", &syncRevision{applied: "r9"}, "", "", nil},
		{"applied", &syncRevision{tool: "Flux Kustomization flux-system/storage", applied: "r1"}, "True", ReasonRevisionApplied, []string{"revision r1 applied by Flux Kustomization flux-system/storage"}},
		{"refused", &syncRevision{tool: "Flux Kustomization flux-system/storage", applied: "r1", refused: "r2", why: "dry-run failed"}, "False", ReasonRevisionRefused,
			[]string{"revision r1 is applied; newer revision r2 was not: Flux Kustomization flux-system/storage refused it: dry-run failed"}},
		{"pending", &syncRevision{tool: "Flux Kustomization flux-system/storage"}, "Unknown", ReasonRevisionPending, []string{"applied no revision yet"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pl := &policyv1.Placement{}
			conditions.MarkTrue(pl, SyncedCondition, ReasonRevisionApplied, "revision r0 applied")
			setSynced(pl, c.rev)
			got := conditions.Get(pl, SyncedCondition)
			if c.status == "" {
				if got != nil {
					t.Fatalf("Synced %+v, want none", got)
				}
				return
			}
			if got == nil || string(got.Status) != c.status || got.Reason != c.reason {
				t.Fatalf("Synced %+v, want %s %s", got, c.status, c.reason)
			}
			for _, m := range c.msg {
				if !strings.Contains(got.Message, m) {
					t.Errorf("message %q lacks %q", got.Message, m)
				}
			}
		})
	}
}
