package main

import (
	"strings"
	"testing"
)

// Rounds of a benchmark (go test's "name#01" repeats) are one key, shown as their median; the
// ratio is of the medians.
func TestTableMedianOfRounds(t *testing.T) {
	out := `BenchmarkPVCBurst/floor-2         	       1	80000000000 ns/op	        80.00 apiserver-cpu-ms/vol
BenchmarkPVCBurst/plinth-2        	       1	90000000000 ns/op	       120.0 apiserver-cpu-ms/vol
BenchmarkPVCBurst/plinth#01-2     	       1	90000000000 ns/op	       100.0 apiserver-cpu-ms/vol
BenchmarkPVCBurst/floor#01-2      	       1	80000000000 ns/op	        90.00 apiserver-cpu-ms/vol
BenchmarkPVCBurst/floor#02-2      	       1	80000000000 ns/op	        85.00 apiserver-cpu-ms/vol
BenchmarkPVCBurst/plinth#02-2     	       1	90000000000 ns/op	       110.0 apiserver-cpu-ms/vol
BenchmarkPVCBurst/plinth#02-2     	       1	90000000000 ns/op	        17.00 apiserver-req/vol
`
	res := results{}
	if err := parse(strings.NewReader(out), res); err != nil {
		t.Fatal(err)
	}
	if got := res["BenchmarkPVCBurst/plinth apiserver-cpu-ms/vol"]; len(got) != 3 || got[0] != 120 || got[2] != 110 {
		t.Errorf("plinth samples %v, want [120 100 110]", got)
	}
	if v, n, ok := res.median("BenchmarkPVCBurst/floor apiserver-cpu-ms/vol"); !ok || n != 3 || v != 85 {
		t.Errorf("floor median %v of %d (%v), want 85 of 3", v, n, ok)
	}
	tab := table(res)
	want := "| PVC burst: API server CPU per volume (the agent-idle window left out), ms | 110 (median of 3) | 85.00 (median of 3) (no-op CSI floor) | 1.29× | ≤ 1.15× floor |"
	if !strings.Contains(tab, want) {
		t.Errorf("table lacks\n%s\nin\n%s", want, tab)
	}
	if !strings.Contains(tab, "| PVC burst: API requests per volume (create + delete) | 17.00 | not measured (no-op CSI floor) | — |") {
		t.Errorf("a single run is shown without a median note and its missing floor as not measured:\n%s", tab)
	}
}

func TestMedianEvenCount(t *testing.T) {
	res := results{"k": {4, 1, 3, 2}}
	if v, n, ok := res.median("k"); !ok || n != 4 || v != 2.5 {
		t.Errorf("median %v of %d (%v), want 2.5 of 4", v, n, ok)
	}
	if _, _, ok := res.median("absent"); ok {
		t.Error("median of no values is ok")
	}
}
