// Package csi is Plinth's CSI driver csi.plinth.dev (CSI spec v1.13). It wires the services
// together and serves them: the Identity service (identity.go), the Controller service
// (package csi/controller), which talks only to the API server — it writes VolumeState objects
// and waits, by watching them through an informer, until the node agent has filled in their
// status — and the Node service (package csi/node), which connects NVMe-oF/TCP subsystems or
// uses local devices, formats blank devices, mounts, and keeps atomic stage records so unstage
// works after restarts (package csi/stage).
//
// Under the services lies the volume layer (csi/internal/volume): a handle per operation
// holding the per-volume lock (a second operation on a busy volume gets ABORTED, CSI spec
// "Concurrency"), the informer subscription and the VolumeState, and typed errors. The services
// return those errors; the interceptor maps them to gRPC codes, in one place (rpcError,
// errors.go). docs/design.md, "CSI driver layout", draws the map.
//
// Run serves the services for one mode (controller, node or all) on a unix socket with a
// logging interceptor (method at V(2), payload with secrets stripped at V(5)), and the metric
// plinth_csi_operation_duration_seconds{method,code}.
package csi
