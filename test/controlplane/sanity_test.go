package controlplane_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/test/controlplane"
)

// TestCSISanityBinaryRuns proves the csi-sanity build; the CSI driver issue
// runs it against Plinth's driver.
func TestCSISanityBinaryRuns(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinCSISanity)
	path, err := controlplane.BinaryPath("", controlplane.BinCSISanity)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, "--csi.endpoint=/nonexistent.sock", "--ginkgo.dry-run", "--ginkgo.no-color").CombinedOutput()
	if err != nil {
		t.Fatalf("csi-sanity --ginkgo.dry-run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "Ran ") && !strings.Contains(string(out), "Passed") {
		t.Errorf("csi-sanity dry run printed no summary:\n%s", out)
	}
	if want := controlplane.PinnedVersions()["CSI_SANITY_VERSION"]; want != "" {
		out, _ := exec.Command(path, "--version").CombinedOutput()
		if !strings.Contains(string(out), want) {
			t.Errorf("csi-sanity --version: %q, want %s", out, want)
		}
	}
}
