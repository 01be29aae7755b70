package clientlimit

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

func TestApply(t *testing.T) {
	errDown := errors.New("connection refused")
	for _, tc := range []struct {
		name       string
		limits     Limits
		apf        bool
		probeErr   error
		wantMode   Mode
		wantQPS    float32
		wantBurst  int
		wantProbes int
		wantErr    bool
	}{
		{name: "explicit limits are kept under APF", limits: Limits{QPS: 20, Burst: 40, Explicit: true}, apf: true,
			wantMode: ModeExplicit, wantQPS: 20, wantBurst: 40, wantProbes: 0},
		{name: "explicit limits are kept without APF", limits: Limits{QPS: 20, Burst: 40, Explicit: true},
			wantMode: ModeExplicit, wantQPS: 20, wantBurst: 40, wantProbes: 0},
		{name: "defaults under APF: no client-side limiter", limits: Limits{QPS: 50, Burst: 300}, apf: true,
			wantMode: ModeServerSide, wantQPS: -1, wantBurst: -1, wantProbes: 1},
		{name: "defaults without APF are kept", limits: Limits{QPS: 50, Burst: 300},
			wantMode: ModeDefault, wantQPS: 50, wantBurst: 300, wantProbes: 1},
		{name: "a failed probe keeps the defaults and says why", limits: Limits{QPS: 50, Burst: 300}, probeErr: errDown,
			wantMode: ModeDefault, wantQPS: 50, wantBurst: 300, wantProbes: 1, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			probes := 0
			probe := func(ctx context.Context, cfg *rest.Config) (bool, error) {
				probes++
				if _, ok := ctx.Deadline(); !ok {
					t.Error("the probe runs without a deadline")
				}
				return tc.apf, tc.probeErr
			}
			cfg := &rest.Config{Host: "https://127.0.0.1:6443", QPS: 5, Burst: 10}
			mode, err := Apply(context.Background(), cfg, tc.limits, probe)
			if mode != tc.wantMode || cfg.QPS != tc.wantQPS || cfg.Burst != tc.wantBurst || probes != tc.wantProbes {
				t.Errorf("got mode %q, QPS %g, burst %d, %d probes; want %q, %g, %d, %d probes",
					mode, cfg.QPS, cfg.Burst, probes, tc.wantMode, tc.wantQPS, tc.wantBurst, tc.wantProbes)
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error: %v", err, tc.wantErr)
			}
			if err != nil && (!errors.Is(err, errDown) || !strings.Contains(err.Error(), "--kube-api-qps 50")) {
				t.Errorf("error %q does not wrap the probe's error and name the limits kept", err)
			}
		})
	}
}
