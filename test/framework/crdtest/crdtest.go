// Package crdtest gives tests a control plane with Plinth's CRDs installed. It is apart from
// controlplane so that the modules importing controlplane (the scheduler's) do not link
// controller-runtime's envtest.
package crdtest

import (
	"fmt"
	"path/filepath"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// Install installs Plinth's CRDs (schema/crd/bases of the module, found by
// controlplane.ModuleRoot) into cp and returns once the API server serves them
// (envtest.InstallCRDs); an error names the folder.
func Install(cp *controlplane.ControlPlane) error {
	root, err := controlplane.ModuleRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "schema", "crd", "bases")
	if _, err := envtest.InstallCRDs(cp.Admin.Config, envtest.CRDInstallOptions{Paths: []string{dir}, ErrorIfPathMissing: true}); err != nil {
		return fmt.Errorf("install the CRDs of %s: %w", dir, err)
	}
	return nil
}

// ControlPlane is controlplane.ForTest with Plinth's CRDs installed (Install); a failure to
// install them fails t.
func ControlPlane(t testing.TB, opts controlplane.Options) *controlplane.ControlPlane {
	t.Helper()
	cp := controlplane.ForTest(t, opts)
	if err := Install(cp); err != nil {
		t.Fatal(err)
	}
	return cp
}
