// Package adopt is `plinth adopt`: after the control plane (etcd) is lost while the nodes'
// data stays, it matches the volumes the agents list as unclaimed (Store status.unclaimed,
// with their identity stamps, internal/identity) to the claims of the Git checkout and of the
// live cluster, and plans, as plain data, which volumes are adopted (a VolumeState and a
// pre-bound PV each), which are ambiguous and which are orphans; Apply does the plan. The
// planner (Build) is a pure function; Load reads its input; nothing is written before Apply.
// See docs/design.md "Re-adopting volumes" and docs/operations.md "Disaster recovery".
package adopt

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/plinth-storage/plinth/internal/identity"
	"github.com/plinth-storage/plinth/internal/overrides"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Claim is one PVC, from the Git checkout, the live cluster or both.
type Claim struct {
	Namespace, Name string
	// StorageClass is spec.storageClassName ("" when unset).
	StorageClass string
	// RequestBytes is spec.resources.requests.storage in bytes.
	RequestBytes int64
	// VolumeMode is Filesystem (the default) or Block.
	VolumeMode string
	// AccessModes are spec.accessModes.
	AccessModes []corev1.PersistentVolumeAccessMode
	// Annotations are the claim's annotations (per-PVC overrides are among them).
	Annotations map[string]string
	// InGit is true when the checkout holds the claim (File:Line says where).
	InGit bool
	File  string
	Line  int
	// UID, Phase and VolumeName are the live claim's ("" when it is not in the cluster).
	UID        types.UID
	Phase      corev1.PersistentVolumeClaimPhase
	VolumeName string
}

// Key is "namespace/name".
func (c Claim) Key() string { return c.Namespace + "/" + c.Name }

// Candidate is one unclaimed volume a Store lists.
type Candidate struct {
	Store, Node, Pool string
	// StoreUID is the UID of the listing Store object (the current control plane's).
	StoreUID string
	Volume   storev1.UnclaimedVolume
}

// Input is what Build plans from.
type Input struct {
	// Placements, Pools and Protocols are the live policy objects (what CreateVolume would
	// freeze into a new volume now), by name.
	Placements map[string]*policyv1.Placement
	Pools      map[string]*policyv1.StoragePool
	Protocols  map[string]*policyv1.Protocol
	// GitPlacements are the names of the Placements the checkout declares.
	GitPlacements map[string]bool
	// Claims are the claims of the checkout and of the cluster, by Key.
	Claims map[string]*Claim
	// Candidates are the unclaimed volumes every Store lists.
	Candidates []Candidate
	// VolumeStates are the names of the live VolumeStates: a volume named there is claimed
	// already (a Store lists it until its next refresh).
	VolumeStates map[string]bool
	// PVs are the live PVs by name.
	PVs map[string]*corev1.PersistentVolume
	// Omitted are the Stores whose list was cut at storev1.MaxUnclaimed, with the count.
	Omitted map[string]int32
}

// Adoption is one volume re-bound to its claim.
type Adoption struct {
	Claim        string `json:"claim"`
	VolumeID     string `json:"volumeID"`
	Store        string `json:"store"`
	Node         string `json:"node"`
	SizeBytes    int64  `json:"sizeBytes"`
	PV           string `json:"pv"`
	StorageClass string `json:"storageClass"`
	Placement    string `json:"placement"`
	// CreatePV is false when the PV exists already (pointing at this volume).
	CreatePV bool `json:"createPV"`
	// VolumeState and PersistentVolume are the objects Apply creates.
	VolumeState      *storev1.VolumeState     `json:"-"`
	PersistentVolume *corev1.PersistentVolume `json:"-"`
}

// Finding is a volume or claim that is not adopted, and why.
type Finding struct {
	VolumeID string `json:"volumeID,omitempty"`
	Store    string `json:"store,omitempty"`
	Claim    string `json:"claim,omitempty"`
	Reason   string `json:"reason"`
}

// Plan is what adopt would do. Sorted: adoptions by claim, findings by volume id then claim.
type Plan struct {
	Adopt     []Adoption `json:"adopt"`
	Ambiguous []Finding  `json:"ambiguous"`
	Orphan    []Finding  `json:"orphan"`
	// Missing are the claims of the checkout that are not bound and whose volume no Store
	// lists: nothing is created for them (an empty volume would hide the loss).
	Missing  []Finding `json:"missing"`
	Warnings []string  `json:"warnings,omitempty"`
}

// Exit codes of `plinth adopt`.
const (
	ExitNothingToDo = 0
	ExitPending     = 1 // adoptions planned, not done (no --confirm)
	ExitAttention   = 3 // ambiguous volumes or missing volumes: a person decides
)

// ExitCode is the plan's exit status: 3 with ambiguous or missing entries, else 1 with
// adoptions still to do (pending=true), else 0.
func (p *Plan) ExitCode(pending bool) int {
	switch {
	case len(p.Ambiguous) > 0 || len(p.Missing) > 0:
		return ExitAttention
	case pending && len(p.Adopt) > 0:
		return ExitPending
	}
	return ExitNothingToDo
}

// AnnotationProvisionedBy is the PV annotation csi-provisioner sets and reads on deletion
// (reclaim policy Delete calls DeleteVolume only for PVs it provisioned).
const AnnotationProvisionedBy = "pv.kubernetes.io/provisioned-by"

// Volume context keys the node plugin reads at NodeStage (csi/internal/volume contexts.go:
// the contract CreateVolume's answer fills; the adopted PV must carry the same).
const (
	contextKind         = "plinth.dev/protocol-kind"
	contextFSType       = "plinth.dev/fstype"
	contextMkfsOptions  = "plinth.dev/mkfs-options"
	contextMountOptions = "plinth.dev/mount-options"
)

// Build plans the adoption. Each candidate lands in exactly one list (or is skipped when a
// VolumeState names it already):
//   - orphan: no stamp, a stamp naming no claim, or a claim in neither Git nor the cluster;
//   - ambiguous: a torn or unknown-version stamp, the same volume listed twice, two volumes
//     stamped with one claim, a claim bound to another volume, a StorageClass, size, volume
//     mode or policy (digest) that differs from the stamp, a PV of that name for another
//     volume, a claim whose overrides its Placement refuses, or an encrypted class (not
//     adopted yet); a claim's allowed overrides are frozen as CreateVolume freezes them and
//     must give the stamp's digest;
//   - adopt: everything matches.
//
// A claim of the checkout that is not bound and that no candidate names is Missing.
func Build(in Input) *Plan {
	p := &Plan{}
	for store, n := range in.Omitted {
		p.Warnings = append(p.Warnings, fmt.Sprintf("Store %s lists only %d unclaimed volumes; %d more are not in this plan: run adopt again after this one", store, storev1.MaxUnclaimed, n))
	}
	seen := map[string]int{}
	for _, c := range in.Candidates {
		seen[c.Volume.VolumeID]++
	}
	byClaim := map[string][]Candidate{}
	digests := map[string]string{} // policy digest by Placement and fsType: one per class
	stamps := map[string]identity.Stamp{}
	for _, c := range in.Candidates {
		id := c.Volume.VolumeID
		if in.VolumeStates[id] {
			continue
		}
		f := Finding{VolumeID: id, Store: c.Store}
		if seen[id] > 1 {
			f.Reason = fmt.Sprintf("listed by %d Stores (two Stores share a directory or VG?)", seen[id])
			p.Ambiguous = append(p.Ambiguous, f)
			continue
		}
		if c.Volume.StampError != "" {
			f.Reason = "identity stamp unreadable: " + c.Volume.StampError
			p.Ambiguous = append(p.Ambiguous, f)
			continue
		}
		if c.Volume.Stamp == "" {
			f.Reason = "no identity stamp (made before stamps, and never stamped)"
			p.Orphan = append(p.Orphan, f)
			continue
		}
		st, err := identity.ParseLine(c.Volume.Stamp)
		switch {
		case err != nil:
			f.Reason = "identity stamp unreadable: " + err.Error()
			p.Ambiguous = append(p.Ambiguous, f)
			continue
		case st.VolumeID != id:
			f.Reason = fmt.Sprintf("identity stamp names volume %s", st.VolumeID)
			p.Ambiguous = append(p.Ambiguous, f)
			continue
		case st.StoreUID == c.StoreUID:
			f.Reason = "stamped under the current Store object: its VolumeState of this control plane was deleted (driftPolicy decides), not a lost one"
			p.Orphan = append(p.Orphan, f)
			continue
		case !st.Bound():
			f.Reason = "identity stamp names no claim (its PV never existed)"
			p.Orphan = append(p.Orphan, f)
			continue
		}
		key := st.PVCNamespace + "/" + st.PVCName
		if in.Claims[key] == nil {
			f.Claim, f.Reason = key, "no PVC "+key+" in the checkout or the cluster"
			p.Orphan = append(p.Orphan, f)
			continue
		}
		stamps[id] = st
		byClaim[key] = append(byClaim[key], c)
	}
	for key, cands := range byClaim {
		claim := in.Claims[key]
		if len(cands) > 1 {
			var ids []string
			for _, c := range cands {
				ids = append(ids, c.Volume.VolumeID)
			}
			for _, c := range cands {
				p.Ambiguous = append(p.Ambiguous, Finding{VolumeID: c.Volume.VolumeID, Store: c.Store, Claim: key,
					Reason: fmt.Sprintf("%d volumes are stamped with claim %s: %s", len(cands), key, strings.Join(ids, ", "))})
			}
			continue
		}
		c := cands[0]
		a, reason := adoption(in, digests, claim, c, stamps[c.Volume.VolumeID])
		if reason != "" {
			p.Ambiguous = append(p.Ambiguous, Finding{VolumeID: c.Volume.VolumeID, Store: c.Store, Claim: key, Reason: reason})
			continue
		}
		p.Adopt = append(p.Adopt, *a)
	}
	for key, claim := range in.Claims {
		if !claim.InGit || claim.Phase == corev1.ClaimBound || len(byClaim[key]) > 0 {
			continue
		}
		where := ""
		if claim.File != "" {
			where = fmt.Sprintf(" (%s:%d)", claim.File, claim.Line)
		}
		p.Missing = append(p.Missing, Finding{Claim: key, Reason: "no Store lists a volume stamped with this claim" + where + "; nothing is created in its place"})
	}
	sort.Slice(p.Adopt, func(i, j int) bool { return p.Adopt[i].Claim < p.Adopt[j].Claim })
	for _, l := range [][]Finding{p.Ambiguous, p.Orphan, p.Missing} {
		sort.Slice(l, func(i, j int) bool {
			if l[i].VolumeID != l[j].VolumeID {
				return l[i].VolumeID < l[j].VolumeID
			}
			return l[i].Claim < l[j].Claim
		})
	}
	sort.Strings(p.Warnings)
	return p
}

// adoption checks candidate c, stamped st, against claim and builds its objects; a non-empty
// reason says why it is ambiguous instead. digests caches the policy digests.
func adoption(in Input, digests map[string]string, claim *Claim, c Candidate, st identity.Stamp) (*Adoption, string) {
	if claim.VolumeName != "" && claim.VolumeName != st.PVName {
		return nil, fmt.Sprintf("PVC %s is bound to PV %s, the volume is stamped with PV %s", claim.Key(), claim.VolumeName, st.PVName)
	}
	if claim.StorageClass != st.StorageClass {
		return nil, fmt.Sprintf("PVC %s asks for StorageClass %q, the volume was made by %q", claim.Key(), claim.StorageClass, st.StorageClass)
	}
	mode := claim.VolumeMode
	if mode == "" {
		mode = string(corev1.PersistentVolumeFilesystem)
	}
	if mode != st.VolumeMode {
		return nil, fmt.Sprintf("PVC %s asks for volumeMode %s, the volume is %s", claim.Key(), mode, st.VolumeMode)
	}
	if claim.RequestBytes > st.SizeBytes {
		return nil, fmt.Sprintf("PVC %s asks for %d bytes, the volume holds %d", claim.Key(), claim.RequestBytes, st.SizeBytes)
	}
	if !in.GitPlacements[st.Placement] {
		return nil, fmt.Sprintf("Placement %s of the volume is not in the checkout", st.Placement)
	}
	pl := in.Placements[st.Placement]
	if pl == nil {
		return nil, fmt.Sprintf("Placement %s is not in the cluster yet: sync the policies first", st.Placement)
	}
	if pl.Spec.StorageClass.Name != st.StorageClass {
		return nil, fmt.Sprintf("Placement %s renders StorageClass %s, the volume was made by %s", pl.Name, pl.Spec.StorageClass.Name, st.StorageClass)
	}
	if pl.Spec.PoolRef.Name != c.Pool {
		return nil, fmt.Sprintf("Placement %s uses pool %s, the volume is on a Store of pool %s", pl.Name, pl.Spec.PoolRef.Name, c.Pool)
	}
	if pl.Spec.Encryption != nil {
		return nil, fmt.Sprintf("Placement %s encrypts its volumes: their key Secrets went with the control plane; encrypted volumes are not adopted yet", pl.Name)
	}
	pool, proto := in.Pools[pl.Spec.PoolRef.Name], in.Protocols[pl.Spec.ProtocolRef.Name]
	if pool == nil || proto == nil {
		return nil, fmt.Sprintf("pool %s or protocol %s of Placement %s is not in the cluster yet", pl.Spec.PoolRef.Name, pl.Spec.ProtocolRef.Name, pl.Name)
	}
	frozen := Frozen(pl, pool, proto, st.Filesystem)
	// per-PVC overrides, judged as CreateVolume judges them, frozen as it freezes them: the
	// stamp's digest then says whether the claim in Git overrides what the volume was made with
	ov, err := overrides.Parse(claim.Annotations, pl, frozen.Filesystem.FSType)
	if err != nil {
		return nil, fmt.Sprintf("PVC %s: its overrides are refused by Placement %s: %v", claim.Key(), pl.Name, err)
	}
	var digest string
	if ov == nil {
		dk := pl.Name + "/" + st.Filesystem
		var ok bool
		if digest, ok = digests[dk]; !ok {
			if digest, err = identity.PolicyDigest(frozen); err != nil {
				return nil, err.Error()
			}
			digests[dk] = digest
		}
	} else {
		var strategy policyv1.Strategy // placement only: not frozen
		ov.Apply(&frozen.Filesystem, &strategy)
		frozen.Overrides = ov.Annotations
		if digest, err = identity.PolicyDigest(frozen); err != nil {
			return nil, err.Error()
		}
	}
	if digest != st.PolicyDigest {
		with := ""
		if ov != nil {
			with = " and the claim's overrides"
		}
		return nil, fmt.Sprintf("the policy of Placement %s (with its pool and protocol%s) differs from the one the volume was made with (digest %s, volume %s)", pl.Name, with, digest, st.PolicyDigest)
	}
	a := &Adoption{Claim: claim.Key(), VolumeID: st.VolumeID, Store: c.Store, Node: c.Node, SizeBytes: st.SizeBytes,
		PV: st.PVName, StorageClass: st.StorageClass, Placement: pl.Name, CreatePV: true}
	if pv := in.PVs[st.PVName]; pv != nil {
		if pv.Spec.CSI == nil || pv.Spec.CSI.VolumeHandle != st.VolumeID {
			return nil, fmt.Sprintf("PV %s exists for another volume", st.PVName)
		}
		a.CreatePV = false
	}
	a.VolumeState = volumeState(c, st, frozen)
	if a.CreatePV {
		a.PersistentVolume = persistentVolume(claim, c, st, pl, proto, frozen.Filesystem)
	}
	return a, ""
}

// Frozen is the policy CreateVolume freezes into a clear volume without per-PVC overrides of
// Placement pl (adoption adds a claim's overrides with internal/overrides, as CreateVolume does) (csi/controller newVolumeState): names, the pool's backend, the protocol and
// the filesystem with fsType (the stamp's; "" for a Block volume keeps the Placement's, or
// ext4).
func Frozen(pl *policyv1.Placement, pool *policyv1.StoragePool, proto *policyv1.Protocol, fsType string) storev1.FrozenPolicy {
	fs := pl.Spec.Filesystem
	if fsType != "" {
		fs.FSType = fsType
	}
	if fs.FSType == "" {
		fs.FSType = "ext4"
	}
	return storev1.FrozenPolicy{Placement: pl.Name, Pool: pool.Name, Protocol: proto.Name,
		Backend: pool.Spec.Backend, ProtocolSpec: proto.Spec, Filesystem: fs}
}

func volumeState(c Candidate, st identity.Stamp, frozen storev1.FrozenPolicy) *storev1.VolumeState {
	return &storev1.VolumeState{
		TypeMeta: metav1.TypeMeta{APIVersion: storev1.GroupVersion.String(), Kind: "VolumeState"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        st.VolumeID,
			Finalizers:  []string{storev1.FinalizerVolume},
			Labels:      map[string]string{policyv1.LabelPool: storev1.NameLabelValue(c.Pool), policyv1.LabelNode: storev1.NameLabelValue(c.Node), storev1.LabelAdopted: "true"},
			Annotations: map[string]string{storev1.AnnotationAdoptedFrom: st.StoreUID},
		},
		Spec: storev1.VolumeStateSpec{CSIName: st.PVName, StoreName: c.Store, CapacityBytes: st.SizeBytes,
			VolumeMode: st.VolumeMode, Policy: frozen},
	}
}

// persistentVolume is the PV csi-provisioner would have made for the volume, pre-bound to
// claim (with its UID when it exists in the cluster; without, the PV controller binds the
// claim of that name when it arrives).
func persistentVolume(claim *Claim, c Candidate, st identity.Stamp, pl *policyv1.Placement, proto *policyv1.Protocol, frozen policyv1.Filesystem) *corev1.PersistentVolume {
	// the volume context holds the frozen filesystem (with the claim's overrides), as
	// CreateVolume answers it; the PV's mountOptions are the class's, as csi-provisioner copies
	fs := pl.Spec.Filesystem
	mkfs, mnt := jsonList(frozen.MkfsOptions), jsonList(frozen.MountOptions)
	kind := "local"
	affinity := corev1.NodeSelectorRequirement{Key: policyv1.TopologyKeyNode, Operator: corev1.NodeSelectorOpIn, Values: []string{c.Node}}
	if proto.Spec.NVMeoFTCP != nil {
		kind = "nvmeofTcp"
		affinity = corev1.NodeSelectorRequirement{Key: policyv1.LabelNVMeInitiator, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}
	}
	reclaim := corev1.PersistentVolumeReclaimPolicy(pl.Spec.StorageClass.ReclaimPolicy)
	if reclaim == "" {
		reclaim = corev1.PersistentVolumeReclaimDelete
	}
	modes := claim.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	mode := corev1.PersistentVolumeMode(st.VolumeMode)
	pv := &corev1.PersistentVolume{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        st.PVName,
			Labels:      map[string]string{storev1.LabelAdopted: "true"},
			Annotations: map[string]string{AnnotationProvisionedBy: policyv1.DriverName},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(st.SizeBytes, resource.BinarySI)},
			AccessModes:                   modes,
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              st.StorageClass,
			VolumeMode:                    &mode,
			MountOptions:                  append([]string(nil), fs.MountOptions...),
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: policyv1.DriverName, VolumeHandle: st.VolumeID, FSType: st.Filesystem,
				VolumeAttributes: map[string]string{contextKind: kind, contextFSType: frozenFS(st), contextMkfsOptions: mkfs, contextMountOptions: mnt},
			}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{affinity}}}}},
		},
	}
	if len(pv.Spec.MountOptions) == 0 {
		pv.Spec.MountOptions = nil
	}
	return pv
}

// frozenFS is the fsType of the volume context: the stamp's, ext4 for a Block volume (as
// CreateVolume fills it from the frozen filesystem).
func frozenFS(st identity.Stamp) string {
	if st.Filesystem == "" {
		return "ext4"
	}
	return st.Filesystem
}

// jsonList is the JSON encoding of l ("null" for none), as csiVolume marshals it.
func jsonList(l []string) string {
	b, _ := json.Marshal(l) // a []string always encodes
	return string(b)
}
