package plan

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// AnnotationPrune on a live object Plinth applied changes what happens when it leaves Git:
// PruneValueDisabled keeps it (dropped from the inventory, never deleted), PruneValueForce on a
// StorageClass deletes it even while PVCs use it (the operator's explicit override; reported
// as a PrunedInUse warning saying what will fail).
const AnnotationPrune = "plinth.dev/prune"

// Values of AnnotationPrune.
const (
	PruneValueDisabled = "disabled"
	PruneValueForce    = "force"
)

// pruneDisabled are the prune opt-outs honoured on live objects: the object is dropped from
// the inventory, never deleted. Flux's own opt-out is honoured too, so an
// object a kustomization marked keeps its meaning when Plinth applies it.
var pruneDisabled = map[string]string{
	AnnotationPrune:                     PruneValueDisabled,
	"kustomize.toolkit.fluxcd.io/prune": "disabled",
}

// PruneExclusions returns the opt-outs as fluxcd/pkg/ssa DeleteOptions.Exclusions take them
// (a fresh map: callers may not change the rule).
func PruneExclusions() map[string]string {
	out := make(map[string]string, len(pruneDisabled))
	for k, v := range pruneDisabled {
		out[k] = v
	}
	return out
}

// EffectiveReplacement is the Placement's spec.storageClass.replacement with its default
// applied: "" (and a nil Placement) mean Never.
func EffectiveReplacement(pl *policyv1.Placement) policyv1.Replacement {
	if pl == nil || pl.Spec.StorageClass.Replacement == "" {
		return policyv1.ReplacementNever
	}
	return pl.Spec.StorageClass.Replacement
}

// ReplacementAllowed says whether the controller replaces (deletes, then creates) a
// StorageClass whose immutable fields changed, under replacement policy p and the class's
// usage: pvcs and pvs count the PVCs and PVs whose storageClassName names it. Always
// replaces; IfUnused only an unused class; Never (and "") never.
func ReplacementAllowed(p policyv1.Replacement, pvcs, pvs int) bool {
	switch p {
	case policyv1.ReplacementAlways:
		return true
	case policyv1.ReplacementIfUnused:
		return pvcs == 0 && pvs == 0
	}
	return false
}

// PruneVerdict is what the controller does with an object that left the rendered set but is
// still listed in the inventory: only the inventory makes an object prunable (never its
// labels), and a StorageClass in use is kept unless the operator forces it.
type PruneVerdict string

const (
	// PruneDelete deletes the object.
	PruneDelete PruneVerdict = "Delete"
	// PruneDeleteInUse deletes a StorageClass that PVCs or PVs use, because the live class carries
	// plinth.dev/prune: force (the operator's explicit override); reported as PrunedInUse.
	PruneDeleteInUse PruneVerdict = "DeleteInUse"
	// PruneKeepOptedOut drops the object from the inventory and never deletes it: it carries
	// a prune opt-out (plinth.dev/prune or kustomize.toolkit.fluxcd.io/prune "disabled").
	PruneKeepOptedOut PruneVerdict = "KeepOptedOut"
	// PruneKeepInUse keeps a StorageClass that PVCs or PVs use, in the inventory: deleting a
	// class in use would break expansion of its PVCs.
	PruneKeepInUse PruneVerdict = "KeepInUse"
	// PruneKeepDraining keeps a Store that VolumeStates still name (marked draining), and the
	// Agent of a node that keeps such a Store.
	PruneKeepDraining PruneVerdict = "KeepDraining"
)

// PruneOptedOut reports whether live carries a prune opt-out annotation or label.
func PruneOptedOut(live *unstructured.Unstructured) bool {
	for k, v := range pruneDisabled {
		if live.GetAnnotations()[k] == v || live.GetLabels()[k] == v {
			return true
		}
	}
	return false
}

// DecidePrune decides for live, a stale inventory object as read from the API server. classUsers
// is the number of PVCs plus PVs that name a VolumeAttributesClass (a claim left without its
// tier is never silently unlimited: the class stays until no claim names it), or whose
// storageClassName names a StorageClass — a PV outlives
// its claim (reclaim policy Retain, or a claim deleted first) and still needs its class to
// expand or be re-bound —, volumes the number of VolumeStates on a Store (both ignored for
// other kinds); keptNodes holds the nodes whose Stores were kept draining, so Stores must be
// decided before Agents (inventory.Stale returns them in that order), and the caller records
// a KeepDraining Store's node in keptNodes.
func DecidePrune(live *unstructured.Unstructured, classUsers, volumes int, keptNodes map[string]bool) PruneVerdict {
	if PruneOptedOut(live) {
		return PruneKeepOptedOut
	}
	switch live.GetKind() {
	case "StorageClass", render.AttributesClassKind:
		if classUsers > 0 {
			if live.GetAnnotations()[AnnotationPrune] == PruneValueForce {
				return PruneDeleteInUse
			}
			return PruneKeepInUse
		}
	case "Store":
		if volumes > 0 {
			return PruneKeepDraining
		}
	case "Agent":
		node, _, _ := unstructured.NestedString(live.Object, "spec", "nodeName")
		if keptNodes[node] {
			return PruneKeepDraining
		}
	}
	return PruneDelete
}
