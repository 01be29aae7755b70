// Package render turns a vetted policy set and the node inventory into the objects Plinth
// applies: one StorageClass per Placement, one Agent per node that carries a pool, and one Store
// per (pool, node). Render is a pure function: the same input gives the same objects in the same
// order, so `plinth render`, `plinth diff` and the controller agree byte for byte.
package render
