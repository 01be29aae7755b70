package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/deploy"
	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// argoCDPhase runs Argo CD's own controllers on the cluster the Flux scenario booted
// (devenv.Walk.ArgoCD): Flux's Kustomization suspended, Argo CD's application-controller and
// repo-server (test/tools/build.sh, ARGOCD_VERSION) and redis-server as host processes,
// kustomize/argocd applied with the policy Application pointed at a Git repository on loopback;
// the Application Synced and Healthy through argocd-cm's health checks, Degraded with the schema's
// message for a stalling placement, and a placement removed from Git pruned by Argo CD and kept
// by Plinth while its StorageClass is in use. Plinth's own Application (sync wave 0) syncs the dev
// overlay this cluster runs, rendered by repo-server with testbin's kustomize CLI: Synced and
// Healthy with no rollout, and a Plinth object deleted by hand restored by self-heal.
func argoCDPhase(t *testing.T, walk *devenv.Walk) {
	t.Helper()
	controlplane.RequireBinaries(t, devenv.BinArgoCD, devenv.BinKustomize)
	if _, err := os.Stat(devenv.BinRedisServer); err != nil {
		t.Fatalf("Argo CD phase: %v (hack/install-deps.sh installs redis-server)", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	start := time.Now()
	sum, err := walk.ArgoCD(ctx)
	if err != nil {
		t.Errorf("Argo CD phase: %v", err)
		return
	}
	// The policy the Flux scenario left: the quickstart's StoragePool, Protocol and Placement, and
	// the StatefulSet's xfs Placement.
	if sum.PolicyObjects != 4 || sum.Resources != sum.PolicyObjects {
		t.Errorf("Argo CD tracks %d resources of %d policy objects, want 4 of 4", sum.Resources, sum.PolicyObjects)
	}
	// The plinth Application tracks the dev overlay's objects (compared by kind and name in the
	// phase).
	overlay, err := deploy.Build(filepath.Join(walk.Root, devenv.DevOverlay))
	if err != nil {
		t.Fatal(err)
	}
	if sum.PlinthResources != len(overlay) {
		t.Errorf("Argo CD tracks %d resources of the plinth Application, the dev overlay has %d objects", sum.PlinthResources, len(overlay))
	}
	for name, d := range map[string]time.Duration{"Synced/Healthy": sum.Synced, "plinth Synced/Healthy": sum.PlinthSynced, "self-heal": sum.SelfHealed, "Degraded": sum.Degraded, "pruned": sum.Pruned} {
		if d <= 0 {
			t.Errorf("Argo CD %s: no measurement (%s)", name, d)
		}
	}
	t.Logf("Argo CD phase %s: policy Synced and Healthy %s after start, plinth %s (%d resources), self-heal %s, Degraded %s after the stalling commit, pruned %s after the removing commit",
		time.Since(start).Round(time.Second), sum.Synced.Round(100*time.Millisecond), sum.PlinthSynced.Round(100*time.Millisecond), sum.PlinthResources,
		sum.SelfHealed.Round(100*time.Millisecond), sum.Degraded.Round(100*time.Millisecond), sum.Pruned.Round(100*time.Millisecond))
}
