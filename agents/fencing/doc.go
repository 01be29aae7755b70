// Package fencing keeps the node agent's durable per-volume marks and decides
// whether a piece of work on a volume may run (the pillar-csi invariant in a
// level-triggered design; the mark is a contract of docs/design.md,
// "Contracts between the parts", VolumeState).
//
// A mark records, for one volume id, the lifecycle (the VolumeState UID) the
// node acts for, the highest metadata.generation acted on (guards create,
// expand, delete) and the highest spec.publicationGeneration acted on (guards
// export ACL changes). Work from an older generation, an older publication
// generation or a retired lifecycle is refused with a *Rejection; a
// VolumeState deleted and recreated under the same name is a new lifecycle,
// admitted only once the old one released the volume.
//
// Marks live in <dir>/<volume id>.json, written with temp file + fsync +
// rename + directory fsync, so a crash leaves either the old or the new mark.
// A mark that does not parse is ErrCorrupt: an error, never a guess.
package fencing
