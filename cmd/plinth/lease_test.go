package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// The Lease timing flags: unset ones keep controller-runtime's defaults (nil); a set that
// client-go's leader election would refuse at start is a usage error naming the flags and the
// effective values, defaults included.
func TestLeaseFlagsTimings(t *testing.T) {
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	for _, c := range []struct {
		name                string
		lease, renew, retry time.Duration
		want                [3]time.Duration // 0: nil
		err                 string
	}{
		{name: "defaults"},
		{name: "all set", lease: sec(137), renew: sec(107), retry: sec(26), want: [3]time.Duration{sec(137), sec(107), sec(26)}},
		{name: "lease only", lease: sec(60), want: [3]time.Duration{sec(60), 0, 0}},
		{name: "renew past the default lease", renew: sec(20), err: "--leader-election-lease-duration (15s) must be longer than --leader-election-renew-deadline (20s)"},
		{name: "equal lease and renew", lease: sec(30), renew: sec(30), err: "--leader-election-lease-duration (30s) must be longer than --leader-election-renew-deadline (30s)"},
		{name: "retry too long for the renew deadline", retry: sec(9), err: "--leader-election-renew-deadline (10s) must be longer than 1.2 × --leader-election-retry-period (9s)"},
		{name: "negative", retry: -sec(1), err: "must not be negative"},
	} {
		l := leaseFlags{leaseDuration: c.lease, renewDeadline: c.renew, retryPeriod: c.retry}
		lease, renew, retry, err := l.timings()
		if c.err != "" {
			var ee *exitError
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.As(err, &ee) || ee.code != exitUsage {
				t.Errorf("%s: error %v, want a usage error containing %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		for i, got := range []*time.Duration{lease, renew, retry} {
			if (got == nil) != (c.want[i] == 0) || (got != nil && *got != c.want[i]) {
				t.Errorf("%s: timing %d is %v, want %v (0: unset)", c.name, i, got, c.want[i])
			}
		}
	}
}

// plinth controller refuses timings client-go would refuse before it reaches an API server,
// with the flags named.
func TestControllerRefusesLeaseTimings(t *testing.T) {
	code, _, _ := plinthOutErr(t, "controller", "--leader-election-renew-deadline=20s", "--kubeconfig=/nonexistent")
	msg := runErr(t, "controller", "--leader-election-renew-deadline=20s", "--kubeconfig=/nonexistent")
	if code != exitUsage || !strings.Contains(msg, "--leader-election-lease-duration (15s) must be longer than --leader-election-renew-deadline (20s)") {
		t.Errorf("plinth controller --leader-election-renew-deadline=20s: exit %d, %q; want %d and the two flags named", code, msg, exitUsage)
	}
}
