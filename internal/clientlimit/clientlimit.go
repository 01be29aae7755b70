// Package clientlimit decides the client-side rate limit of a Plinth process's connection to
// the Kubernetes API server, the way Flux's controllers decide theirs.
//
// client-go limits every REST client with a token bucket (rest.Config QPS and Burst; a
// controller-runtime client keeps one bucket per resource type). That bucket protects an API
// server that cannot protect itself. An API server running API Priority and Fairness (APF, on
// by default since Kubernetes 1.20) queues and sheds requests per priority level and flow
// itself, so a client-side bucket there only adds latency: a burst of writes larger than the
// bucket waits for tokens while the server sits idle. fluxcd/pkg/runtime/client
// (GetConfigOrDie) therefore asks the server once, at start, whether APF is on (a HEAD
// /livez/ping whose answer carries APF's X-Kubernetes-PF-* headers, fluxcd/cli-utils
// flowcontrol.IsEnabled) and, when it is, runs with no client-side limiter (QPS and Burst -1).
//
// Plinth does the same with one difference: limits the operator gave explicitly
// (--kube-api-qps or --kube-api-burst) are always kept, where Flux ignores them under APF. A
// probe that fails keeps the default limits: a limited client is slower, never wrong.
package clientlimit

import (
	"context"
	"fmt"
	"time"

	"github.com/fluxcd/cli-utils/pkg/flowcontrol"
	"k8s.io/client-go/rest"
)

// Mode says how Apply set the limits.
type Mode string

const (
	// ModeExplicit: the operator gave --kube-api-qps or --kube-api-burst; both values are kept
	// and the API server is not asked.
	ModeExplicit Mode = "explicit"
	// ModeServerSide: the API server runs API Priority and Fairness; the client has no
	// client-side limiter (QPS and Burst -1).
	ModeServerSide Mode = "apf"
	// ModeDefault: the API server does not run APF, or the probe failed; the default limits
	// are kept.
	ModeDefault Mode = "default"
)

// ProbeTimeout bounds the one request Apply makes.
const ProbeTimeout = 10 * time.Second

// Probe answers whether the API server behind cfg runs API Priority and Fairness.
// flowcontrol.IsEnabled is the real one; tests count calls with their own.
type Probe func(ctx context.Context, cfg *rest.Config) (bool, error)

// Limits are the client-side limits of one process: QPS in requests per second and Burst in
// requests, as rest.Config takes them, and whether the operator set either flag.
type Limits struct {
	QPS      float32
	Burst    int
	Explicit bool
}

// Apply sets cfg.QPS and cfg.Burst from l and the API server's answer, and returns how it
// decided. With l.Explicit it sets l's values without asking the server. Otherwise it asks
// the server once through probe (nil: flowcontrol.IsEnabled, bounded by ProbeTimeout): when
// APF is on it sets QPS and Burst to -1 (client-go then builds no rate limiter); when it is off
// it sets l's values. A probe error also sets l's values and is returned beside ModeDefault
// for the caller to log — it never stops the process.
func Apply(ctx context.Context, cfg *rest.Config, l Limits, probe Probe) (Mode, error) {
	cfg.QPS, cfg.Burst = l.QPS, l.Burst
	if l.Explicit {
		return ModeExplicit, nil
	}
	if probe == nil {
		probe = flowcontrol.IsEnabled
	}
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	enabled, err := probe(ctx, cfg)
	if err != nil {
		return ModeDefault, fmt.Errorf("asking the API server whether API Priority and Fairness is on (keeping --kube-api-qps %g, --kube-api-burst %d): %w", l.QPS, l.Burst, err)
	}
	if !enabled {
		return ModeDefault, nil
	}
	cfg.QPS, cfg.Burst = -1, -1
	return ModeServerSide, nil
}
