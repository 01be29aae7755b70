package main

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Lease timings when a flag is left at 0: client-go's leader election as controller-runtime
// sets it (the kubernetes-csi sidecars use 15 s, 10 s and 5 s).
const (
	defaultLeaseDuration = 15 * time.Second
	defaultRenewDeadline = 10 * time.Second
	defaultRetryPeriod   = 2 * time.Second
)

// leaseFlags are the Lease timings of a process that elects a leader, under the flag names
// the kubernetes-csi sidecars and Flux's controllers use, so one chart value sets them all.
// A leader that cannot renew its Lease within the renew deadline (an API server answering in
// seconds) stops leading and its process exits; longer timings keep it leading on slow
// clusters, at the cost of a slower failover when its node is lost (up to the lease duration).
type leaseFlags struct {
	leaseDuration, renewDeadline, retryPeriod time.Duration
}

func (l *leaseFlags) bind(f *pflag.FlagSet) {
	f.DurationVar(&l.leaseDuration, "leader-election-lease-duration", 0, "how long a standby waits after the leader's last renewal before it takes the Lease (0: 15s)")
	f.DurationVar(&l.renewDeadline, "leader-election-renew-deadline", 0, "how long the leader retries renewing its Lease before it stops leading and exits; shorter than the lease duration (0: 10s)")
	f.DurationVar(&l.retryPeriod, "leader-election-retry-period", 0, "the wait between tries to take or renew the Lease; the renew deadline must exceed 1.2 times it (0: 2s)")
}

// timings returns the three timings for ctrl.Options (nil where left at 0: the default).
// Errors: a negative timing, or a set that client-go's leader election refuses at start (the
// lease duration not longer than the renew deadline, the renew deadline not longer than 1.2
// retry periods), naming the flags and their effective values.
func (l *leaseFlags) timings() (leaseDuration, renewDeadline, retryPeriod *time.Duration, err error) {
	lease, renew, retry := orDefault(l.leaseDuration, defaultLeaseDuration), orDefault(l.renewDeadline, defaultRenewDeadline), orDefault(l.retryPeriod, defaultRetryPeriod)
	switch {
	case l.leaseDuration < 0 || l.renewDeadline < 0 || l.retryPeriod < 0:
		err = fmt.Errorf("--leader-election-lease-duration, --leader-election-renew-deadline and --leader-election-retry-period must not be negative")
	case lease <= renew:
		err = fmt.Errorf("--leader-election-lease-duration (%s) must be longer than --leader-election-renew-deadline (%s)", lease, renew)
	case float64(renew) <= 1.2*float64(retry):
		err = fmt.Errorf("--leader-election-renew-deadline (%s) must be longer than 1.2 × --leader-election-retry-period (%s)", renew, retry)
	}
	if err != nil {
		return nil, nil, nil, &exitError{code: exitUsage, err: err}
	}
	return setOnly(l.leaseDuration), setOnly(l.renewDeadline), setOnly(l.retryPeriod), nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func setOnly(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}
