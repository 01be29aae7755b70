// Package plan decides what a reconcile of the policy set does, without doing any of it: Make
// takes the rendered objects, the previous inventory, the vetted policies and a Source that
// reads the live cluster (reads and server-side dry-runs only) and returns a Plan — the
// objects to apply and why (created, changed by policy, drift to correct), the drift to report,
// the StorageClasses whose immutable fields change with whether their Placement's replacement
// policy allows replacing them now, and the verdict on each object that left the render
// (chosen from the inventory, never by labels; kept while in use).
//
// The policy controller executes a Plan; `plinth diff` formats one. Both build it with Make and
// the rules here (EffectiveReplacement, ReplacementAllowed, DecidePrune, CorrectDrift), so a
// rule cannot change for one and not the other. Cluster is the Source of a live cluster;
// the offline diff passes the old tree's render instead.
package plan
