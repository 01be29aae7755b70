// Package scheduler is the root of Plinth's scheduler module
// (github.com/plinth-storage/plinth/scheduler), a Go module of its own because
// k8s.io/kubernetes needs the 31 staging replace lines in go.mod.
//
// The module builds, in one `go build` with one set of pins (test/tools/build.sh):
//   - cmd/plinth-scheduler: kube-scheduler with the PlinthCapacity plugin (filter and
//     score nodes by Store capacity, book capacity of pods in flight; docs/design.md,
//     "Flows", 4 "Pod → node");
//   - the test control plane: kube-apiserver, kube-controller-manager, kubectl
//     and etcd, declared as tool lines in go.mod.
//
// The plugin lives in scheduler/plugin/capacity (exporting Name and New; README.md
// there) and meets the rest of Plinth only through the API server and schema/.
// scheduler/test/integration runs it inside the real scheduler.
package scheduler
