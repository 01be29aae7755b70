// Package move plans volume moves between Stores: which volumes leave a Store a pool
// evacuates (StoragePool spec.evacuateNodes) or follow their Placement to a new pool
// (Placement spec.existingVolumes: Move), which Store each goes to, how many bytes each copy
// carries, how long it is estimated to take, what its consumer sees, and the capacity of each
// pool before and after. It is a pure function of what the caller read (Plan); `plinth diff`
// prints its result (controllers/diff), and the executor of moves (not written yet,
// docs/design.md#data-mobility) is to carry out the same plan.
package move
