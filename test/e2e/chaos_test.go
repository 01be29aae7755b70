package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// chaosSteps is the number of faults of the short randomized run every make test makes on the
// scenario's running cluster; PLINTH_CHAOS_STEPS makes a long one (make test-chaos) and
// PLINTH_CHAOS_SEED replays a sequence.
const chaosSteps = 3

// runChaos runs devenv's randomized faults on the scenario's cluster (no boot of its own) and
// fails the test on a broken invariant, naming the seed that replays it.
func runChaos(t *testing.T, walk *devenv.Walk) {
	t.Helper()
	o, err := devenv.ChaosOptionsFromEnv(chaosSteps)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("randomized faults: seed %d, %d faults (replay: %s=%d %s=%d)", o.Seed, o.Steps, devenv.EnvChaosSeed, o.Seed, devenv.EnvChaosSteps, o.Steps)
	// A fault waits at most a few minutes for the cluster to converge: the bound grows with the run.
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(o.Steps)*5*time.Minute+5*time.Minute)
	defer cancel()
	start := time.Now()
	sum, err := walk.Chaos(ctx, o)
	if err != nil {
		t.Errorf("randomized faults, seed %d (replay: %s=%d %s=%d): %v", o.Seed, devenv.EnvChaosSeed, o.Seed, devenv.EnvChaosSteps, o.Steps, err)
		return
	}
	if len(sum.Faults) != o.Steps || sum.Acked == 0 || sum.Claims < 1 {
		t.Errorf("randomized faults, seed %d: %d faults injected (want %d), %d acknowledged writes checked over %d claims (want some)",
			o.Seed, len(sum.Faults), o.Steps, sum.Acked, sum.Claims)
	}
	t.Logf("randomized faults, seed %d: %d faults %v, %d acknowledged writes verified over %d claims, in %s",
		o.Seed, len(sum.Faults), sum.Faults, sum.Acked, sum.Claims, time.Since(start).Round(time.Second))
}
