// Package agent is the node agent (`plinth agent --node NAME`): a
// controller-runtime manager scoped to one node that converges the kernel
// (LVM, ZFS or file volumes, the nvmet NVMe-oF target) toward the node's Agent,
// Stores and VolumeStates, and reports what it sees back as status and
// Prometheus metrics (docs/design.md, "Flows", 2 "Objects → kernel").
//
// Scope: the cache holds only this node's objects — the Agent by name
// (field selector metadata.name), Stores and VolumeStates by the label
// plinth.dev/node = NameLabelValue(node) — so an agent never caches the
// cluster.
//
// Three reconcilers:
//
//   - Agent: host NQN (/etc/nvme/hostnqn), the address inside
//     spec.nvmeof.bindCIDR, kernel modules and backends present, version and
//     heartbeat; conditions say what is missing.
//   - Store: ensures the backend (a VG and thin pool only on declared empty
//     devices), observes it with one vgs+lvs pair per refresh, publishes
//     capacity (docs/design.md, "Capacity"), compares the kernel with the
//     VolumeStates (missing/resized LV, missing or misconfigured export,
//     orphan LV, missing VG) and wakes the drifted VolumeStates.
//   - VolumeState: fenced (package fencing) create, expand, export (allowed
//     hosts = host NQNs of spec.publications), unexport and delete; status
//     phase, device path, export, actual size, Ready (reason
//     InsufficientCapacity when there is no room), Drifted; the finalizer
//     FinalizerVolume is released only after the export and the volume are gone.
//
// Drift is corrected only when the Store's driftPolicy is Correct; orphan
// volumes are reported, never deleted.
package agent
