package csisanity

import (
	"strings"
	"testing"
)

// A report as Ginkgo v2 writes it (trimmed to the fields read, plus one it ignores).
const report = `[{"SuiteDescription":"CSI Driver Test Suite","SpecReports":[
 {"ContainerHierarchyTexts":null,"LeafNodeType":"BeforeSuite","LeafNodeText":"","State":"passed"},
 {"ContainerHierarchyTexts":["Controller Service [Controller Server]","CreateVolume"],"LeafNodeType":"It","LeafNodeText":"should work","State":"passed","RunTime":12},
 {"ContainerHierarchyTexts":["Controller Service [Controller Server]","ListSnapshots"],"LeafNodeType":"It","LeafNodeText":"should return snapshots","State":"skipped"},
 {"ContainerHierarchyTexts":["Node Service"],"LeafNodeType":"It","LeafNodeText":"should stage","State":"timedout"}
]}]`

func TestParseAndCheck(t *testing.T) {
	r, err := ParseReport([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	if r.Passed != 1 || r.Skipped != 1 || r.Failed != 1 || r.Pending != 0 {
		t.Errorf("counts %+v", r)
	}
	skip := "Controller Service [Controller Server] ListSnapshots should return snapshots"
	if len(r.SkippedSpecs) != 1 || r.SkippedSpecs[0] != skip {
		t.Errorf("skipped %q", r.SkippedSpecs)
	}
	err = r.Check(1, 0, []string{skip})
	if err == nil || !strings.Contains(err.Error(), "Node Service should stage (timedout)") {
		t.Errorf("Check of a run with a timed-out spec: %v", err)
	}
	r.Failed, r.FailedSpecs = 0, nil
	if err := r.Check(1, 0, []string{skip}); err != nil {
		t.Errorf("Check of the expected run: %v", err)
	}
	err = r.Check(2, 0, []string{"Other spec"})
	for _, want := range []string{"1 specs passed, want 2", "skipped, not expected to: \"" + skip, "expected to skip, did not: \"Other spec\""} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check: %v, want %q", err, want)
		}
	}
}

func TestParseBadReport(t *testing.T) {
	for _, in := range []string{"", "{}", "[]", "[{\"SpecReports\":"} {
		if _, err := ParseReport([]byte(in)); err == nil {
			t.Errorf("ParseReport(%q): no error", in)
		}
	}
}
