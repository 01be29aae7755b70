package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
)

// VolumeIDPrefix starts every CSI volume id.
const VolumeIDPrefix = "vol-"

// VolumeID returns the CSI volume id (= VolumeState name) of a CreateVolume name: "vol-" and the
// first 40 hex digits of sha256(name). It is 44 bytes of [a-z0-9-], whatever the name holds
// (CSI allows 128 bytes of any UTF-8, CSI spec "Size Limits"), so LV, zvol, file and NQN names
// derived from it always fit their limits.
func VolumeID(csiName string) string {
	sum := sha256.Sum256([]byte(csiName))
	return VolumeIDPrefix + hex.EncodeToString(sum[:])[:40]
}

// IsVolumeID reports whether id has the shape VolumeID returns.
func IsVolumeID(id string) bool {
	if len(id) != len(VolumeIDPrefix)+40 || id[:len(VolumeIDPrefix)] != VolumeIDPrefix {
		return false
	}
	for _, c := range id[len(VolumeIDPrefix):] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// StoreName returns the Store name of a pool on a node: "<pool>.<node>", or
// "<pool>.<first 16 hex digits of sha256(node)>" when that would exceed 253 bytes (the
// DNS-1123 subdomain limit of object names). Look Stores up by the labels plinth.dev/pool and
// plinth.dev/node, never by parsing this name.
func StoreName(pool, node string) string {
	name := pool + "." + node
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(node))
	return pool + "." + hex.EncodeToString(sum[:])[:16]
}

// NameLabelValue returns the value of the plinth.dev/node (or plinth.dev/pool) label for an
// object name. Label values hold at most 63 bytes (Kubernetes validation) while node names
// may hold 253, so a longer name becomes "h-" and the first 40 hex digits of its sha256.
// Selectors must use this function too.
func NameLabelValue(name string) string {
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "h-" + hex.EncodeToString(sum[:])[:40]
}

// AnnotationDraining marks a Store that left the rendered policy set while VolumeStates still
// name it (value "true"; set and cleared by the policy controller). Its agent keeps serving the
// volumes it holds; the CSI controller places no new volume on it and the scheduler plugin
// filters out its node for new claims of its pool; the controller deletes the Store once its
// last volume is gone.
const AnnotationDraining = "plinth.dev/draining"

// IsDraining reports whether the Store takes no new volume: it carries the AnnotationDraining
// mark (it left the policy) or spec.evacuate (its pool evacuates its node). Either way its agent
// keeps serving the volumes it holds, the CSI controller places no new volume on it and the
// scheduler plugin filters its node out for new claims of its pool.
func (s *Store) IsDraining() bool {
	return s.Annotations[AnnotationDraining] == "true" || s.Spec.Evacuate
}

// IsMarkedDraining reports whether the Store carries the AnnotationDraining mark alone: it left
// the rendered policy set and is kept for the volumes it holds.
func (s *Store) IsMarkedDraining() bool { return s.Annotations[AnnotationDraining] == "true" }

// FinalizerVolume is the agent's finalizer on a VolumeState: held until the agent removed the
// volume's export and volume. The CSI controller releases it itself only when the Node of the
// volume's Store no longer exists (the volume left with the node; should the machine return,
// its agent reports what is left as an orphan).
const FinalizerVolume = "plinth.dev/volume"

// AnnotationAdoptedFrom on a VolumeState made by `plinth adopt` holds the Store UID written in
// the identity stamp of the volume it adopts (the Store object of a lost control plane). The
// agent admits the new VolumeState as the volume's next lifecycle, retiring the one its
// fencing mark holds, only while the volume's stamp still names that Store UID
// (docs/design.md "Re-adopting volumes").
const AnnotationAdoptedFrom = "plinth.dev/adopted-from"

// LabelAdopted marks the VolumeStates and PVs `plinth adopt --confirm` created (value "true").
const LabelAdopted = "plinth.dev/adopted"
