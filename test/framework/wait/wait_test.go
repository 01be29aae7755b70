package wait

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPollReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	err := Poll(t.Context(), time.Minute, time.Millisecond, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Poll: %v after %d calls, want nil after 3", err, calls)
	}
}

func TestPollNamesTheLastReason(t *testing.T) {
	reason := errors.New("pod Pending")
	err := Poll(t.Context(), 0, time.Millisecond, func() error { return reason })
	if !errors.Is(err, reason) || !strings.Contains(err.Error(), "not after 0s") {
		t.Fatalf("timeout: %v, want it to wrap %q", err, reason)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = Poll(ctx, time.Minute, time.Millisecond, func() error { return reason })
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "pod Pending") {
		t.Fatalf("cancelled: %v, want context.Canceled naming %q", err, reason)
	}
}
