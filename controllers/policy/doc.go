// Package policy is the policy controller: it watches StoragePools, Protocols and Placements
// (synced from Git by Flux or Argo CD), Nodes and the objects it owns, and keeps the cluster
// equal to the render of the whole policy set.
//
// One reconcile handles the whole set, because render is a function of all policies and all
// Nodes (an Agent serves several pools). It follows the shape of Flux's kustomize-controller:
// list → vet with the embedded CUE schema (an invalid set stalls, nothing is applied or
// pruned) → render → server-side dry-run diff of each object against the live one
// (fluxcd/pkg/ssa, one field manager) → apply what policy changed and the drift the
// driftPolicy says to correct → replace StorageClasses whose immutable fields changed when
// the Placement allows it (B35, B36) → prune what left the inventory ConfigMap, never
// anything in use (B38, B39) → write the inventory → patch each policy object's status
// (kstatus Ready/Reconciling/Stalled, Drifted, StoresReady, observedGeneration) with a patch
// helper that writes nothing when nothing changed.
package policy
