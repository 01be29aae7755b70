// Package scheduler is the root of Plinth's scheduler module
// (github.com/plinth-storage/plinth/scheduler), a Go module of its own because
// k8s.io/kubernetes needs the 31 staging replace lines in go.mod.
//
// The module builds, in one `go build` with one set of pins (test/tools/build.sh):
//   - cmd/plinth-scheduler: kube-scheduler; the PlinthCapacity plugin (filter and
//     score nodes by Store capacity, DESIGN.md flow 4) is added here by a later issue;
//   - the test control plane: kube-apiserver, kube-controller-manager, kubectl
//     and etcd, declared as tool lines in go.mod.
//
// The plugin will live in scheduler/plugin (exporting Name and New) and meet the
// rest of Plinth only through the API server and schema/.
package scheduler
