// Package csisanity reads the outcome of a csi-sanity run (kubernetes-csi/csi-test, a Ginkgo
// suite) from its Ginkgo JSON report and checks it against what a test expects: the exact
// number of passed specs and the exact names of the skipped ones. A summary line with "0
// Failed" is not enough: a capability the driver stops advertising turns its specs into skips
// and the run still passes.
package csisanity

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Specs and Pending count the specs of the pinned csi-sanity (CSI_SANITY_VERSION in
// test/tools/versions.env, v5.6.0), as its dry run reports them (test/framework/controlplane checks
// them): Specs run, Pending are marked pending in csi-sanity's source and never run (v5.6.0:
// "ListVolumes pagination should detect volumes added between pages..."). A run against a
// driver has Specs = passed + skipped. Moving csi-sanity changes them, and every run's
// expectations with them.
const (
	Specs   = 102
	Pending = 1
)

// ReportFlag is the csi-sanity flag that writes its Ginkgo JSON report to path.
func ReportFlag(path string) string { return "--ginkgo.json-report=" + path }

// Result counts the specs (Ginkgo "It" nodes) of one run by state, with the names of the
// skipped and failed ones (Name).
type Result struct {
	Passed, Skipped, Failed, Pending int
	SkippedSpecs, FailedSpecs        []string
}

// specReport holds the fields of Ginkgo's types.SpecReport (github.com/onsi/ginkgo/v2/types)
// that a Result needs; State and LeafNodeType are serialised as their names.
type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeType            string
	LeafNodeText            string
	State                   string
}

type suiteReport struct {
	SpecReports []specReport
}

// Name is a spec's full text: its containers' texts and its own, joined by single spaces, as
// Ginkgo prints it.
func Name(containers []string, leaf string) string {
	return strings.Join(append(slices.Clone(containers), leaf), " ")
}

// ReadReport reads the JSON report csi-sanity wrote with ReportFlag. Setup and teardown nodes
// (BeforeSuite, AfterSuite...) are not specs and are not counted; any state other than passed,
// skipped or pending (failed, panicked, timedout, aborted, interrupted) counts as failed.
func ReadReport(path string) (Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Result{}, fmt.Errorf("csi-sanity report: %w", err)
	}
	return ParseReport(data)
}

// ParseReport is ReadReport on the report's bytes.
func ParseReport(data []byte) (Result, error) {
	var suites []suiteReport
	if err := json.Unmarshal(data, &suites); err != nil {
		return Result{}, fmt.Errorf("csi-sanity report: not a Ginkgo JSON report: %w", err)
	}
	if len(suites) == 0 {
		return Result{}, errors.New("csi-sanity report: no suite")
	}
	var r Result
	for _, s := range suites {
		for _, sp := range s.SpecReports {
			if sp.LeafNodeType != "It" {
				continue
			}
			name := Name(sp.ContainerHierarchyTexts, sp.LeafNodeText)
			switch sp.State {
			case "passed":
				r.Passed++
			case "skipped":
				r.Skipped++
				r.SkippedSpecs = append(r.SkippedSpecs, name)
			case "pending":
				r.Pending++
			default:
				r.Failed++
				r.FailedSpecs = append(r.FailedSpecs, name+" ("+sp.State+")")
			}
		}
	}
	slices.Sort(r.SkippedSpecs)
	return r, nil
}

// Check returns an error naming every difference between r and what a run must show: no
// failed spec, exactly passed specs passed and pending pending, and exactly the skipped specs
// (names as Name) skipped, in any order.
func (r Result) Check(passed, pending int, skipped []string) error {
	var errs []error
	if r.Failed > 0 {
		errs = append(errs, fmt.Errorf("%d specs failed: %s", r.Failed, strings.Join(r.FailedSpecs, "; ")))
	}
	if r.Pending != pending {
		errs = append(errs, fmt.Errorf("%d specs pending, want %d", r.Pending, pending))
	}
	if r.Passed != passed {
		errs = append(errs, fmt.Errorf("%d specs passed, want %d", r.Passed, passed))
	}
	for _, s := range r.SkippedSpecs {
		if !slices.Contains(skipped, s) {
			errs = append(errs, fmt.Errorf("skipped, not expected to: %q", s))
		}
	}
	for _, s := range skipped {
		if !slices.Contains(r.SkippedSpecs, s) {
			errs = append(errs, fmt.Errorf("expected to skip, did not: %q", s))
		}
	}
	return errors.Join(errs...)
}
