// Package policy is the policy controller: it watches StoragePools, Protocols and Placements
// (synced from Git by Flux or Argo CD), Nodes and the objects it owns, and keeps the cluster
// equal to the render of the whole policy set.
//
// One reconcile handles the whole set, because render is a function of all policies and all
// Nodes (an Agent serves several pools). It follows the shape of Flux's controllers: Reconcile
// reads the set and runs named steps over one scope — vet with the embedded CUE schema (an
// invalid set stalls, nothing is applied or pruned) → render → plan (controllers/plan: the
// server-side dry-run diff of each object, drift, StorageClass replacements, prune verdicts,
// decided without writing) → apply what policy changed and the drift the driftPolicy says to
// correct → replace StorageClasses when the Placement allows it → prune what left the
// inventory ConfigMap (never by labels), never anything in use → write the inventory → read the
// sync revisions. Each step records typed outcomes per policy object; a deferred function
// then patches each policy object's status (kstatus Ready/Reconciling/Stalled, Drifted,
// StoresReady, observedGeneration; setters in policyset_status.go) with a patch helper that
// writes nothing when nothing changed, and emits its events and metrics.
package policy
