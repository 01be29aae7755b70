// Package controlplane starts a real Kubernetes control plane for tests and for
// `plinth-dev`: etcd and kube-apiserver (and optionally kube-controller-manager,
// the scheduler and CSI sidecars) built from their Go modules by
// `make testbin` (test/tools/build.sh) into bin/.
//
// Everything listens on free loopback ports; the API server serves TLS with a
// certificate that also names 10.0.2.100 (the qemu guest's guestfwd address,
// docs/design.md, "Guest tests"), authorizes with RBAC and signs service-account
// tokens. Certificates are generated in Go for each control plane, so two
// control planes run side by side.
//
// Binaries are found in $PLINTH_TESTBIN, or <module root>/bin when it is
// unset. `plinth-dev` starts one with Start; tests use the testing helpers of
// fortest.go (ForTest, RequireBinaries, Eventually), and benchmarks the readers of
// bench.go (knobs, load, CPU and memory of the processes they measure):
//
//	func TestMain(m *testing.M) { ... cp, err := controlplane.Start(ctx, controlplane.Options{}) ... }
//	func TestX(t *testing.T) { cp := controlplane.ForTest(t, controlplane.Options{ControllerManager: true}) ... }
//
// Stop ends every process the control plane started, by PID.
package controlplane
