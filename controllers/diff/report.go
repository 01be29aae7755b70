package diff

import (
	"fmt"

	"github.com/plinth-storage/plinth/controllers/move"
	"github.com/plinth-storage/plinth/controllers/storageclass"
	"github.com/plinth-storage/plinth/schema/vet"
)

// Exit codes of `plinth diff`, for CI.
const (
	// ExitNoChange: the proposed policy changes nothing.
	ExitNoChange = 0
	// ExitChanges: the proposed policy changes objects, without violations.
	ExitChanges = 1
	// ExitErrors: usage, I/O or API errors, or a proposed set that does not vet or render.
	ExitErrors = 2
	// ExitViolations: the proposed policy would break something (see Violation).
	ExitViolations = 3
)

// Mode of a report.
const (
	// ModeLive compares the proposed set with the live cluster.
	ModeLive = "live"
	// ModeOffline compares the proposed set with another policy tree and a node inventory.
	ModeOffline = "offline"
)

// Actions of a rendered object (ObjectChange.Action).
const (
	// ActionCreate: the object does not exist yet.
	ActionCreate = "create"
	// ActionChange: the object is changed in place (server-side apply).
	ActionChange = "change"
	// ActionReplace: a StorageClass whose immutable fields change is deleted and created again.
	ActionReplace = "replace"
	// ActionPrune: the object left the rendered set and is deleted.
	ActionPrune = "prune"
	// ActionKeep: the object left the rendered set but is kept (in use, draining, or opted out
	// of pruning); Reason says why.
	ActionKeep = "keep"
	// ActionDrift: the live object already differs from what Plinth applied; the controller
	// reports or corrects it whatever this change does, so it does not count as a change.
	ActionDrift = "drift"
)

// Violation rules (Violation.Rule).
const (
	// RuleInsufficientRoom: a pool's new reserve or node selector leaves less room than is
	// already provisioned (on one Store, or in the whole pool once Stores drain).
	RuleInsufficientRoom = "InsufficientRoom"
	// RuleOvercommitExceeded: a thin pool's new overcommitPercent is below what is provisioned.
	RuleOvercommitExceeded = "OvercommitExceeded"
	// RulePrunedClassInUse: a Placement's StorageClass leaves the policy while PVCs use it
	// (the controller keeps it, the Placement stays not Ready).
	RulePrunedClassInUse = "PrunedClassInUse"
	// RuleProtocolChangeExported: the protocol of a pool with exported volumes changes.
	RuleProtocolChangeExported = "ProtocolChangeWithExports"
	// RuleDryRunRejected: the API server rejects the server-side dry-run of a rendered object.
	RuleDryRunRejected = "DryRunRejected"
	// RuleReplacementNotAllowed: a StorageClass's immutable fields change and the Placement's
	// replacement policy forbids replacing it now: the controller keeps the class and the
	// Placement stalls (ReplacementRequired) until the policy or the usage changes.
	RuleReplacementNotAllowed = "ReplacementNotAllowed"
	// RuleOverrideRefused: a Pending PVC of a Placement's class carries override annotations
	// (plinth.dev/mkfs-options, ...) that the proposed Placement refuses, so its provisioning
	// would fail. Bound PVCs keep the overrides frozen into their volumes and are not listed.
	RuleOverrideRefused = "OverrideRefused"
	// RuleAttributesClassInUse: a Placement's tier (VolumeAttributesClass) leaves the policy
	// while PVCs or PVs name it. The controller keeps the class, but the claims are left on a
	// tier no Placement declares: a modification to it is refused, and it must not read as
	// "no limits".
	RuleAttributesClassInUse = "AttributesClassInUse"
	// RuleAuthUnsupported: a Protocol asks for DH-HMAC-CHAP and a storage node of a pool it
	// serves reports (Agent status.capabilities.nvmeAuth) no NVMe target authentication in its
	// kernel: that node would export none of the class's volumes (Agent Stalled,
	// AuthUnsupported). Agents that have not reported yet are not judged.
	RuleAuthUnsupported = "AuthUnsupported"
	// RuleCacheUnsupported: a StoragePool asks for a bcache cache (lvm.cache) and a node it
	// selects reports (Agent status.capabilities.kernelModules) no bcache module: that node's
	// Store would be Stalled (MissingKernelModules) and make no volume, never one without its
	// cache. Agents that have not reported yet are not judged.
	RuleCacheUnsupported = "CacheUnsupported"
	// RuleEncryptionDropped: a Placement that asked for encryption no longer does (or asks
	// for other parameters or another key Secret). Its existing volumes stay as they were
	// made (the policy is frozen in each VolumeState): encrypted, opened with their own
	// keys; only new volumes change, so the class would hold both. Live: counted from the
	// VolumeStates of the Placement; offline: reported without a count.
	RuleEncryptionDropped = "EncryptionDropped"
)

// Report is what `plinth diff` prints. Byte sizes are int64 bytes.
type Report struct {
	// Mode is ModeLive or ModeOffline.
	Mode string `json:"mode"`
	// Paths is the proposed policy tree; Against the old one (offline mode only).
	Paths   []string `json:"paths"`
	Against []string `json:"against,omitempty"`
	// Problems are the vet and render problems of the proposed set (or of the --against
	// set, then prefixed so); when there are any, nothing else is filled in.
	Problems []vet.Problem `json:"problems,omitempty"`
	// Policy lists the policy objects that differ from the live (or old) ones.
	Policy []PolicyChange `json:"policy"`
	// Objects lists the rendered objects that are created, changed, replaced, pruned, kept or
	// drifted, in apply order (StorageClass, Agent, Store), then by name.
	Objects []ObjectChange `json:"objects"`
	// Counts counts Objects by action, and the unchanged objects.
	Counts Counts `json:"counts"`
	// Storage is the storage impact.
	Storage StorageImpact `json:"storage"`
	// Violations are what the change would break, sorted by position.
	Violations []Violation `json:"violations"`
}

// Counts are the numbers of rendered objects per action.
type Counts struct {
	Create    int `json:"create"`
	Change    int `json:"change"`
	Replace   int `json:"replace"`
	Prune     int `json:"prune"`
	Keep      int `json:"keep"`
	Drift     int `json:"drift"`
	Unchanged int `json:"unchanged"`
}

// PolicyChange is one policy object (StoragePool, Protocol, Placement) that differs.
type PolicyChange struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Action is ActionCreate, ActionChange or "delete".
	Action string `json:"action"`
	// Fields are the dotted spec paths that differ (ActionChange only), sorted.
	Fields []string `json:"fields,omitempty"`
	// File and Line locate the object in the proposed tree (in the old tree when deleted
	// offline; empty when deleted live).
	File string `json:"file,omitempty"`
	Line int    `json:"line,omitempty"`
}

// ObjectChange is one rendered object that is not unchanged.
type ObjectChange struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Action string `json:"action"`
	// Fields are the dotted paths that differ (change, replace, drift), sorted.
	Fields []string `json:"fields,omitempty"`
	// Reason says why a kept object is kept, or what a replace or prune implies.
	Reason string `json:"reason,omitempty"`
	// Ongoing is true for a kept object that was kept already before this change (a Store
	// already draining, a class whose Placement already left): no change, not counted.
	Ongoing bool `json:"ongoing,omitempty"`
}

// StorageImpact is what the change does to storage.
type StorageImpact struct {
	// Classes are StorageClasses that are replaced, need a replacement that is not allowed,
	// or leave the policy.
	Classes []ClassImpact `json:"classes"`
	// StoresAdded are Stores the proposed policy creates.
	StoresAdded []StoreRef `json:"storesAdded"`
	// StoresRemoved are Stores that leave the policy: drained when they hold volumes (live
	// mode knows; offline mode cannot), deleted otherwise.
	StoresRemoved []StoreRemoval `json:"storesRemoved"`
	// Pools is the capacity per pool before and after (live mode only).
	Pools []PoolCapacity `json:"pools"`
	// SnapshotClasses are VolumeSnapshotClasses the change alters or prunes, with the
	// VolumeSnapshots that name them (live mode).
	SnapshotClasses []SnapshotClassImpact `json:"snapshotClasses,omitempty"`
	// Moves is the plan of the volume moves the proposed policy asks for (StoragePool
	// spec.evacuateNodes, Placement spec.existingVolumes: Move), live mode only; absent when
	// no volume is to move. Blocked moves are violations too. Not carried out yet: see
	// docs/design.md#data-mobility.
	Moves *move.Result `json:"moves,omitempty"`
	// AttributesClasses are the tiers (VolumeAttributesClasses) the change alters or removes,
	// with the claims whose attributes that touches (live mode).
	AttributesClasses []AttributesClassImpact `json:"attributesClasses,omitempty"`
}

// AttributesClassImpact is one VolumeAttributesClass the change affects, with the claims that
// name it (spec.volumeAttributesClassName, status.currentVolumeAttributesClassName or the
// target of a modification under way).
type AttributesClassImpact struct {
	Name      string `json:"name"`
	Placement string `json:"placement,omitempty"`
	// Action is ActionChange (its limits change), ActionPrune or ActionKeep (left the policy,
	// kept because claims name it).
	Action string `json:"action"`
	// Fields are the dotted paths that change (ActionChange).
	Fields []string `json:"fields,omitempty"`
	// Claims are "<namespace>/<name>" of the PVCs that name the class, sorted.
	Claims []string `json:"claims,omitempty"`
	// Outcome says in words what happens to those claims.
	Outcome string `json:"outcome"`
}

// SnapshotClassImpact is one VolumeSnapshotClass the change affects. Neither a change nor a
// prune touches existing snapshots: each VolumeSnapshotContent carries its own driver and
// deletion policy, so existing snapshots stay restorable and deletable; what changes is how
// new VolumeSnapshots of the class are taken, or (pruned) that they fail until a class of that
// name exists again.
type SnapshotClassImpact struct {
	Name      string `json:"name"`
	Placement string `json:"placement,omitempty"`
	// Action is ActionChange or ActionPrune.
	Action string `json:"action"`
	// Fields are the dotted paths that change (ActionChange).
	Fields []string `json:"fields,omitempty"`
	// Outcome says in words what happens to the class's snapshots.
	Outcome string `json:"outcome"`
	// Snapshots are the VolumeSnapshots whose spec.volumeSnapshotClassName is this class
	// (live; empty where the cluster has no snapshot.storage.k8s.io API).
	Snapshots []Snapshot `json:"snapshots,omitempty"`
}

// Snapshot is a VolumeSnapshot.
type Snapshot struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Source is the PVC it was taken of (spec.source.persistentVolumeClaimName), or
	// "content <name>" for a pre-provisioned snapshot.
	Source     string `json:"source,omitempty"`
	ReadyToUse bool   `json:"readyToUse"`
}

// ClassImpact is one StorageClass the change affects.
type ClassImpact struct {
	Name      string `json:"name"`
	Placement string `json:"placement,omitempty"`
	// Action is ActionReplace (immutable fields change), ActionPrune or ActionKeep (left the
	// policy, kept in use).
	Action string `json:"action"`
	// Changes are the immutable field changes (replacement only).
	Changes []storageclass.Change `json:"changes,omitempty"`
	// Replacement is the Placement's replacement policy and Allowed whether it lets the
	// controller replace the class now; AllowedKnown is false offline for IfUnused.
	Replacement  string `json:"replacement,omitempty"`
	Allowed      bool   `json:"allowed"`
	AllowedKnown bool   `json:"allowedKnown"`
	// Outcome says in words what the controller will do.
	Outcome string `json:"outcome"`
	// Default is true when the live class is the cluster's default StorageClass
	// (storageclass.kubernetes.io/is-default-class: "true"): while it is gone, PVCs that name
	// no class get none.
	Default bool `json:"default,omitempty"`
	// Claims and Volumes are the PVCs and PVs whose storageClassName is this class (live).
	Claims  []Claim `json:"claims,omitempty"`
	Volumes []PV    `json:"volumes,omitempty"`
}

// Claim is a PVC.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// SizeBytes is status.capacity.storage, or the request while unbound.
	SizeBytes int64  `json:"sizeBytes"`
	Phase     string `json:"phase"`
	Volume    string `json:"volume,omitempty"`
}

// PV is a PersistentVolume.
type PV struct {
	Name      string `json:"name"`
	SizeBytes int64  `json:"sizeBytes"`
	// Claim is "namespace/name" of the bound PVC.
	Claim string `json:"claim,omitempty"`
}

// StoreRef names a Store.
type StoreRef struct {
	Name string `json:"name"`
	Pool string `json:"pool"`
	Node string `json:"node"`
}

// StoreRemoval is a Store that leaves the policy.
type StoreRemoval struct {
	StoreRef
	// Drains is true when the Store holds volumes: the controller keeps it, marked draining,
	// until the last volume is gone. Offline it is unknown and false.
	Drains bool `json:"drains"`
	// Volumes are the VolumeStates on the Store (live mode).
	Volumes []Volume `json:"volumes,omitempty"`
	// ProvisionedBytes is the Store's status.capacity.provisioned (live mode).
	ProvisionedBytes int64 `json:"provisionedBytes,omitempty"`
}

// Volume is a VolumeState.
type Volume struct {
	// ID is the VolumeState name (the CSI volume id).
	ID        string `json:"id"`
	SizeBytes int64  `json:"sizeBytes"`
	Phase     string `json:"phase,omitempty"`
	// Exported is true when the volume is exported over NVMe-oF (status.export set).
	Exported bool `json:"exported,omitempty"`
	// PV and Claim ("namespace/name") are the PersistentVolume whose CSI volume handle is ID
	// and its claim.
	PV    string `json:"pv,omitempty"`
	Claim string `json:"claim,omitempty"`
}

// PoolCapacity is a pool's capacity summed over its Stores, before and after the change.
type PoolCapacity struct {
	Pool string `json:"pool"`
	// StoresBefore and StoresAfter count the pool's Stores (after: the rendered ones).
	StoresBefore int `json:"storesBefore"`
	StoresAfter  int `json:"storesAfter"`
	// Before and After sum status.capacity of the Stores; After recomputes allocatable with
	// the new reserve on each Store's reported total, and counts only rendered Stores.
	Before Capacity `json:"before"`
	After  Capacity `json:"after"`
	// DrainingBytes is provisioned on Stores that drain after the change.
	DrainingBytes int64 `json:"drainingBytes"`
	// Unreported counts rendered Stores without a reported capacity (new, or no agent yet).
	Unreported int `json:"unreported"`
}

// Capacity in bytes.
type Capacity struct {
	Allocatable int64 `json:"allocatable"`
	Provisioned int64 `json:"provisioned"`
	// Limit is what may be provisioned: allocatable × overcommitPercent/100 on thin
	// backends, allocatable otherwise.
	Limit int64 `json:"limit"`
}

// Violation is one thing the change would break, with the policy position that causes it.
type Violation struct {
	Rule string `json:"rule"`
	// File, Line and Column locate the policy field (Line 0 when the object left the tree).
	File   string `json:"file"`
	Line   int    `json:"line"`
	Column int    `json:"column"`
	// Object is "Kind/name" of the policy object; Field the dotted path in it.
	Object  string `json:"object"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// String is "FILE:LINE:COL: Kind/name: field: Rule: message", as plinth vet prints problems.
func (v Violation) String() string {
	s := v.File
	if v.Line > 0 {
		s += fmt.Sprintf(":%d:%d", v.Line, v.Column)
	}
	s += ": " + v.Object + ": "
	if v.Field != "" {
		s += v.Field + ": "
	}
	return s + v.Rule + ": " + v.Message
}

// ExitCode is the exit status the report asks for: ExitErrors with problems, ExitViolations
// with violations, ExitChanges when a policy object or rendered object changes (drift alone
// is no change), ExitNoChange otherwise.
func (r *Report) ExitCode() int {
	switch {
	case len(r.Problems) > 0:
		return ExitErrors
	case len(r.Violations) > 0:
		return ExitViolations
	case r.Changed():
		return ExitChanges
	}
	return ExitNoChange
}

// Changed reports whether any policy object or rendered object changes.
func (r *Report) Changed() bool {
	c := r.Counts
	return len(r.Policy) > 0 || c.Create+c.Change+c.Replace+c.Prune+c.Keep > 0
}

func (r *Report) count() {
	r.Counts = Counts{Unchanged: r.Counts.Unchanged}
	for _, o := range r.Objects {
		switch o.Action {
		case ActionCreate:
			r.Counts.Create++
		case ActionChange:
			r.Counts.Change++
		case ActionReplace:
			r.Counts.Replace++
		case ActionPrune:
			r.Counts.Prune++
		case ActionKeep:
			if !o.Ongoing {
				r.Counts.Keep++
			}
		case ActionDrift:
			r.Counts.Drift++
		}
	}
}
