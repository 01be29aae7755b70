// Package upgrade holds the CRD upgrade test: objects written under the CRDs of the last
// release (testdata/crds-v0.1.0, a copy of schema/crd/bases at v0.1.0) must survive an upgrade
// to the CRDs of this tree — read back unchanged, decoded by this tree's Go types, and updated.
//
// When a release changes the CRDs, copy the released schema/crd/bases to
// testdata/crds-<version>, add objects for the new fields to a new objects file and point the
// test at both.
package upgrade
