package policy

import (
	"github.com/plinth-storage/plinth/controllers/plan"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Condition types beyond kstatus's Ready, Reconciling and Stalled (fluxcd/pkg/apis/meta).
const (
	// DriftedCondition is True while a rendered API object differs from policy by a hand
	// edit or deletion.
	DriftedCondition = "Drifted"
	// StoresReadyCondition says whether the pool's Stores report Ready; it never gates Ready.
	StoresReadyCondition = "StoresReady"
	// SyncedCondition says whether the revision the sync tool (Flux, Argo CD) last applied is
	// the newest it tried: False when it refused a newer revision, so the object in the
	// cluster, and what Plinth rendered from it, is older than Git. Absent when no sync tool
	// applied the object. It never gates Ready.
	SyncedCondition = "Synced"
	// EvacuatingCondition is True on a StoragePool whose spec.evacuateNodes selects some of
	// its Stores (rendered with spec.evacuate: they take no new volume); absent otherwise. It
	// never gates Ready.
	EvacuatingCondition = "Evacuating"
)

// Reasons, PascalCase.
const (
	// ReasonApplied surfaces when the rendered objects of the policy object are applied.
	ReasonApplied = "Applied"
	// ReasonInvalidPolicy surfaces when the CUE schema or render rejects the policy object.
	ReasonInvalidPolicy = "InvalidPolicy"
	// ReasonPolicySetInvalid surfaces on valid objects of a set that has an invalid one:
	// nothing is applied until the set is valid.
	ReasonPolicySetInvalid = "PolicySetInvalid"
	// ReasonReplacementRequired surfaces when a StorageClass's immutable fields changed and
	// the Placement's replacement policy does not allow replacing it now.
	ReasonReplacementRequired = "ReplacementRequired"
	// ReasonReplacementInProgress surfaces while the old StorageClass is going away.
	ReasonReplacementInProgress = "ReplacementInProgress"
	// ReasonReplaced surfaces after a StorageClass was deleted and created again.
	ReasonReplaced = "Replaced"
	// ReasonInUse surfaces on a Placement removed from Git whose StorageClass PVCs still use.
	ReasonInUse = "InUse"
	// ReasonApplyFailed surfaces when the API server refused an apply, delete or dry-run.
	ReasonApplyFailed = "ApplyFailed"
	// ReasonDriftDetected surfaces with Drifted=True.
	ReasonDriftDetected = "DriftDetected"
	// ReasonDriftCorrected surfaces with Drifted=False after Plinth reverted a drift.
	ReasonDriftCorrected = "DriftCorrected"
	// ReasonNoDrift surfaces with Drifted=False.
	ReasonNoDrift = "NoDrift"
	// ReasonStoresReady, ReasonStoresNotReady and ReasonStoresUnknown go with StoresReady.
	ReasonStoresReady    = "StoresReady"
	ReasonStoresNotReady = "StoresNotReady"
	ReasonStoresUnknown  = "StoresNotReported"
	// ReasonRevisionApplied surfaces with Synced=True: the sync tool applied the newest
	// revision it tried.
	ReasonRevisionApplied = "RevisionApplied"
	// ReasonRevisionPending surfaces with Synced=Unknown while the sync tool has applied no
	// revision yet (its first apply is in progress).
	ReasonRevisionPending = "RevisionPending"
	// ReasonRevisionRefused surfaces with Synced=False when the sync tool tried a newer
	// revision and did not apply it (a Flux Kustomization whose lastAttemptedRevision is not
	// its lastAppliedRevision while its Ready is False; an Argo CD sync that failed): the
	// message names the revision applied, the one refused and the sync tool's reason.
	ReasonRevisionRefused = "RevisionRefused"
	// ReasonMovesNotExecuted surfaces with Evacuating=True until the move executor
	// (controllers/moveexec, in the CSI controller) reports the moves' progress under its own
	// reasons: the evacuated Stores take no new volume, nothing is moved or deleted yet
	// (plinth diff shows the plan; docs/design.md#data-mobility).
	ReasonMovesNotExecuted = "MovesNotExecuted"
	// ReasonPruned surfaces as an event when an object left Git and was deleted.
	ReasonPruned = "Pruned"
	// ReasonDraining surfaces as an event when a Store that left Git still holds volumes.
	ReasonDraining = "Draining"
)

// AnnotationDraining marks a Store that left the rendered set while it still holds volumes
// (VolumeStates name it): the agent keeps serving its volumes, no new ones are placed on it,
// and Plinth deletes the Store once the last volume is gone. Value "true". Defined with the
// Store type, which the CSI driver and the scheduler plugin read.
const AnnotationDraining = storev1.AnnotationDraining

// AnnotationPrune on a live object Plinth applied changes what happens when it leaves Git
// (plan.AnnotationPrune: the rule lives with the prune decision).
const AnnotationPrune = plan.AnnotationPrune

// Values of AnnotationPrune: PruneValueDisabled keeps the object, PruneValueForce deletes a
// StorageClass in use (plan.PruneValueDisabled, plan.PruneValueForce).
const (
	PruneValueDisabled = plan.PruneValueDisabled
	PruneValueForce    = plan.PruneValueForce
)

// ReasonPrunedInUse surfaces as a warning event when a StorageClass in use was deleted because
// an operator set AnnotationPrune to PruneValueForce on it.
const ReasonPrunedInUse = "PrunedInUse"
