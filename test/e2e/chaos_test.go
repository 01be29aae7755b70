package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// chaosSteps is the number of faults of the short randomized run every make test makes on the
// scenario's running cluster; PLINTH_CHAOS_DURATION makes a long one (make test-chaos),
// PLINTH_CHAOS_SEED with PLINTH_CHAOS_STEPS replays a sequence.
const chaosSteps = 3

// runChaos runs devenv's randomized faults on the scenario's cluster (no boot of its own) and
// fails the test on a broken invariant, naming the seed that replays it.
func runChaos(t *testing.T, walk *devenv.Walk) {
	t.Helper()
	o, err := devenv.ChaosOptionsFromEnv(chaosSteps)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("randomized faults: %s", o)
	// A fault waits at most a few minutes for the cluster to converge: the bound grows with the run.
	bound := time.Duration(o.Steps)*5*time.Minute + 5*time.Minute
	if o.Duration > 0 {
		bound = o.Duration + 15*time.Minute // the last fault begins before Duration ends
	}
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	start := time.Now()
	sum, err := walk.Chaos(ctx, o)
	if err != nil {
		t.Errorf("randomized faults, %s: %v (faults made before: %d)", o, err, len(sum.Faults))
		return
	}
	made := len(sum.Faults) == o.Steps
	if o.Duration > 0 {
		made = len(sum.Faults) > 0 && sum.Elapsed >= o.Duration
	}
	if !made || sum.Acked == 0 || sum.Claims < 1 {
		t.Errorf("randomized faults, %s: %d faults injected in %s, %d acknowledged writes checked over %d claims (want the run's length, some writes)",
			o, len(sum.Faults), sum.Elapsed, sum.Acked, sum.Claims)
	}
	t.Logf("randomized faults, seed %d: %d faults %v in %s (replay: %s=%d %s=%d), %d acknowledged writes verified over %d claims, in %s with the clean-up",
		o.Seed, len(sum.Faults), sum.Faults, sum.Elapsed.Round(time.Second), devenv.EnvChaosSeed, o.Seed, devenv.EnvChaosSteps, len(sum.Faults),
		sum.Acked, sum.Claims, time.Since(start).Round(time.Second))
}
