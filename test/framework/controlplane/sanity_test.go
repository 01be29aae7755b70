package controlplane_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/test/csisanity"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// TestCSISanityBinaryRuns proves the csi-sanity build; the CSI driver issue
// runs it against Plinth's driver.
func TestCSISanityBinaryRuns(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinCSISanity)
	path, err := controlplane.BinaryPath("", controlplane.BinCSISanity)
	if err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(t.TempDir(), "report.json")
	out, err := exec.Command(path, "--csi.endpoint=/nonexistent.sock", "--ginkgo.dry-run", "--ginkgo.no-color", csisanity.ReportFlag(report)).CombinedOutput()
	if err != nil {
		t.Fatalf("csi-sanity --ginkgo.dry-run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "Ran ") && !strings.Contains(string(out), "Passed") {
		t.Errorf("csi-sanity dry run printed no summary:\n%s", out)
	}
	// A dry run reports every spec passed without running it: their number is the suite's.
	res, err := csisanity.ReadReport(report)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Check(csisanity.Specs, csisanity.Pending, nil); err != nil {
		t.Errorf("csi-sanity's dry run: %v (csisanity.Specs is the pinned version's spec count)", err)
	}
	if want := controlplane.PinnedVersions()["CSI_SANITY_VERSION"]; want != "" {
		out, _ := exec.Command(path, "--version").CombinedOutput()
		if !strings.Contains(string(out), want) {
			t.Errorf("csi-sanity --version: %q, want %s", out, want)
		}
	}
}
