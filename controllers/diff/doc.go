// Package diff answers what a proposed storage policy change will do before it merges: the
// engine of `plinth diff`.
//
// Live compares a policy tree (files, folders, kustomize overlays, loaded and vetted by
// schema/vet and rendered by controllers/render exactly as `plinth vet` and `plinth render`
// do) with the cluster: each rendered object goes through the server-side dry-run of
// fluxcd/pkg/ssa under the controller's field manager (the machinery of the controller's drift
// detection), StorageClasses whose immutable fields change are classified by
// controllers/storageclass with the Placement's replacement policy, and pruning is predicted
// from the controller's inventory ConfigMap (controllers/inventory) with the controller's
// rules — nothing in use is pruned: StorageClasses with PVCs and Stores with volumes are kept.
// It adds the storage impact (PVCs and PVs of affected classes, Stores added and drained with
// their volumes, capacity per pool before → after) and violations positioned at the policy
// field that causes them, and the plan of the volume moves the tree asks for
// (StoragePool evacuateNodes, Placement existingVolumes: Move; controllers/move), from the live
// VolumeStates, PVs, VolumeAttachments and VolumeSnapshotStates. Offline compares two trees
// for one node inventory, without usage.
//
// Both modes are load → plan → format: the Plan is controllers/plan's, the one the controller
// executes, so the report cannot predict by rules the controller does not follow.
//
// Nothing is written to the cluster. Report.ExitCode gives the CI exit status; Write prints
// text, JSON or markdown (for a pull-request comment).
package diff
