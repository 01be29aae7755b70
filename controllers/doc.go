// Package controllers holds the fleet layer's control loop and its parts; this file is their
// map.
//
// How a policy change flows. Flux or Argo CD syncs StoragePools, Protocols and Placements from
// Git. The policy reconciler (controllers/policy) handles the whole set in one request: it
// vets it with the embedded CUE schema (schema/vet; an invalid set changes nothing, and a
// reference to an object that has not arrived yet waits without a warning), renders it for
// the cluster's Nodes (controllers/render, a pure function), and asks controllers/plan for a
// Plan: from the rendered objects, the live objects read through a client, the inventory the
// last reconcile recorded (controllers/inventory), the policies and the usage of classes and
// Stores, the plan says — as plain data, writing nothing — which objects are created or
// changed, which drifted and whether their driftPolicy reverts them, which StorageClasses need
// a replacement and whether their Placement allows it (controllers/storageclass), and what
// happens to every object that left the render (deleted, kept in use, kept draining, opted
// out). The reconciler then does the plan in named steps (apply, replace, prune, record the
// inventory) and writes each policy object's status, events and metrics once, at the end.
// `plinth diff` (controllers/diff) loads a proposed tree, makes the same Plan against the live
// cluster (or against the old tree's render offline) and formats it, so what the diff
// predicts and what the controller does come from one set of rules.
//
// Packages: render (policy → objects), plan (deciding), policy (doing: the reconciler, its
// status and metrics), diff (`plinth diff`), inventory (the record prune trusts), drift
// (comparing live objects with rendered ones), storageclass (immutable fields and
// replacement).
package controllers
