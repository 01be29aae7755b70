package monitoring

import (
	"slices"
	"testing"
)

func TestFallbackOperands(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum(a{x="y"}) or vector(0)`:                                {`sum(a{x="y"})`},
		`(sum(a{p="Failed"}) or vector(0)) + (sum(b) or vector(0))`: {`sum(a{p="Failed"})`, `sum(b)`},
		`count(max by (k) (c{t="Ready"}) == 1) or vector(0)`:        {`count(max by (k) (c{t="Ready"}) == 1)`},
		`sum(rate(d[5m]))`:                                          nil,
		`1 - ((sum(e) or vector(0)) / sum(f))`:                      {`sum(e)`},
	} {
		if got := FallbackOperands(expr); !slices.Equal(got, want) {
			t.Errorf("FallbackOperands(%q) = %q, want %q", expr, got, want)
		}
	}
}

func TestSelectors(t *testing.T) {
	got := Selectors(`count(max by (cluster, kind) (plinth_policy_condition{cluster=~"$cluster", type="Ready"}) == 1) + sum(rate(x_total{a="b"}[5m]))`)
	want := []string{`plinth_policy_condition{cluster=~"$cluster"}`, `x_total{}`}
	if !slices.Equal(got, want) {
		t.Errorf("Selectors = %q, want %q", got, want)
	}
}
