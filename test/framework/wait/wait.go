// Package wait is the test framework's one bounded poll: the scenario, the monitoring stack
// and the e2e steps wait for a condition the same way, and a failure names the last reason the
// condition did not hold.
package wait

import (
	"context"
	"fmt"
	"time"
)

// Poll calls f at once and then every interval until f returns nil (Poll returns nil), ctx
// ends (ctx's error, with f's last error) or timeout has passed since the call ("not after
// <timeout>", wrapping f's last error).
func Poll(ctx context.Context, timeout, interval time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}
