package adopt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/plinth-storage/plinth/internal/identity"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

const lostStore = "uid-of-the-lost-store"

func policies() (*policyv1.Placement, *policyv1.StoragePool, *policyv1.Protocol) {
	pl := &policyv1.Placement{}
	pl.Name = "fast"
	pl.Spec.PoolRef.Name, pl.Spec.ProtocolRef.Name = "files", "local"
	pl.Spec.StorageClass.Name = "plinth-fast"
	pool := &policyv1.StoragePool{}
	pool.Name = "files"
	pool.Spec.Backend.File = &policyv1.FileBackend{Directory: "/var/lib/plinth/volumes"}
	proto := &policyv1.Protocol{}
	proto.Name = "local"
	proto.Spec.Local = &policyv1.LocalProtocol{}
	return pl, pool, proto
}

// world is a cluster after the loss: the policies synced again, one Store listing volumes.
type world struct{ in Input }

func newWorld() *world {
	pl, pool, proto := policies()
	return &world{in: Input{
		Placements: map[string]*policyv1.Placement{pl.Name: pl}, Pools: map[string]*policyv1.StoragePool{pool.Name: pool},
		Protocols: map[string]*policyv1.Protocol{proto.Name: proto}, GitPlacements: map[string]bool{pl.Name: true},
		Claims: map[string]*Claim{}, VolumeStates: map[string]bool{}, PVs: map[string]*corev1.PersistentVolume{}, Omitted: map[string]int32{},
	}}
}

// stamped lists a volume stamped with claim ns/name of size bytes under the lost Store.
func (w *world) stamped(t testing.TB, pvName, ns, name string, size int64, edit func(*identity.Stamp)) string {
	pl, pool, proto := policies()
	digest, err := identity.PolicyDigest(Frozen(pl, pool, proto, "ext4"))
	if err != nil {
		t.Fatal(err)
	}
	s := identity.Stamp{VolumeID: storev1.VolumeID(pvName), PVCNamespace: ns, PVCName: name, PVCUID: "uid-" + name, PVName: pvName,
		StorageClass: "plinth-fast", Placement: "fast", SizeBytes: size, Filesystem: "ext4", VolumeMode: "Filesystem",
		PolicyDigest: digest, StoreUID: lostStore}
	if edit != nil {
		edit(&s)
	}
	line, err := s.Line()
	if err != nil {
		t.Fatal(err)
	}
	w.in.Candidates = append(w.in.Candidates, Candidate{Store: "files.node-a", Node: "node-a", Pool: "files", StoreUID: "uid-now",
		Volume: storev1.UnclaimedVolume{VolumeID: s.VolumeID, SizeBytes: size, Stamp: line}})
	return s.VolumeID
}

func (w *world) claim(ns, name string, size int64) *Claim {
	c := &Claim{Namespace: ns, Name: name, StorageClass: "plinth-fast", RequestBytes: size, InGit: true, File: "apps/db.yaml", Line: 3}
	w.in.Claims[c.Key()] = c
	return c
}

func reasons(fs []Finding) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.VolumeID+"|"+f.Claim+"|"+f.Reason)
	}
	return strings.Join(out, "\n")
}

func TestPlanSortsEveryVolumeIntoOneList(t *testing.T) {
	w := newWorld()
	const gib = 1 << 30
	ok := w.stamped(t, "pvc-ok", "shop", "db-0", gib, nil)
	w.claim("shop", "db-0", gib)
	// ambiguous
	torn := storev1.VolumeID("pvc-torn")
	w.in.Candidates = append(w.in.Candidates, Candidate{Store: "files.node-a", Node: "node-a", Pool: "files", StoreUID: "uid-now",
		Volume: storev1.UnclaimedVolume{VolumeID: torn, SizeBytes: gib, StampError: "torn identity stamp: record does not end in a newline"}})
	newer := storev1.VolumeID("pvc-newer")
	w.in.Candidates = append(w.in.Candidates, Candidate{Store: "files.node-a", Node: "node-a", Pool: "files", StoreUID: "uid-now",
		Volume: storev1.UnclaimedVolume{VolumeID: newer, SizeBytes: gib, Stamp: "v=2;vol=" + newer}})
	twinA := w.stamped(t, "pvc-twin-a", "shop", "twin", gib, nil)
	twinB := w.stamped(t, "pvc-twin-b", "shop", "twin", gib, nil)
	w.claim("shop", "twin", gib)
	big := w.stamped(t, "pvc-small", "shop", "big", gib, nil)
	w.claim("shop", "big", 2*gib)
	other := w.stamped(t, "pvc-other-class", "shop", "other", gib, nil)
	w.claim("shop", "other", gib).StorageClass = "slow"
	bound := w.stamped(t, "pvc-was", "shop", "rebound", gib, nil)
	c := w.claim("shop", "rebound", gib)
	c.Phase, c.VolumeName = corev1.ClaimBound, "pvc-new-empty"
	edited := w.stamped(t, "pvc-edited", "shop", "edited", gib, func(s *identity.Stamp) { s.PolicyDigest = strings.Repeat("0", 32) })
	w.claim("shop", "edited", gib)
	// orphans
	nobody := w.stamped(t, "pvc-nobody", "gone", "data", gib, nil)
	unbound := w.stamped(t, "pvc-unbound", "", "", gib, func(s *identity.Stamp) { s.PVCUID, s.PVName, s.StorageClass = "", "", "" })
	bare := storev1.VolumeID("pvc-bare")
	w.in.Candidates = append(w.in.Candidates, Candidate{Store: "files.node-a", Node: "node-a", Pool: "files", StoreUID: "uid-now",
		Volume: storev1.UnclaimedVolume{VolumeID: bare, SizeBytes: gib}})
	// missing: a claim of the checkout, no volume
	w.claim("shop", "lost-0", gib)

	p := Build(w.in)
	if len(p.Adopt) != 1 || p.Adopt[0].VolumeID != ok || p.Adopt[0].Claim != "shop/db-0" || !p.Adopt[0].CreatePV {
		t.Fatalf("adopt = %+v", p.Adopt)
	}
	wantAmbiguous := map[string]string{torn: "unreadable", newer: "unknown identity stamp version", twinA: "2 volumes are stamped",
		twinB: "2 volumes are stamped", big: "asks for 2147483648 bytes", other: `StorageClass "slow"`, bound: "bound to PV pvc-new-empty",
		edited: "differs from the one the volume was made with"}
	if len(p.Ambiguous) != len(wantAmbiguous) {
		t.Errorf("ambiguous:\n%s", reasons(p.Ambiguous))
	}
	for _, f := range p.Ambiguous {
		if !strings.Contains(f.Reason, wantAmbiguous[f.VolumeID]) {
			t.Errorf("ambiguous %s: %q, want it to say %q", f.VolumeID, f.Reason, wantAmbiguous[f.VolumeID])
		}
	}
	wantOrphan := map[string]string{nobody: "no PVC gone/data", unbound: "names no claim", bare: "no identity stamp"}
	if len(p.Orphan) != len(wantOrphan) {
		t.Errorf("orphan:\n%s", reasons(p.Orphan))
	}
	for _, f := range p.Orphan {
		if !strings.Contains(f.Reason, wantOrphan[f.VolumeID]) {
			t.Errorf("orphan %s: %q", f.VolumeID, f.Reason)
		}
	}
	if len(p.Missing) != 1 || p.Missing[0].Claim != "shop/lost-0" || !strings.Contains(p.Missing[0].Reason, "apps/db.yaml:3") {
		t.Errorf("missing = %+v", p.Missing)
	}
	if p.ExitCode(true) != ExitAttention {
		t.Errorf("exit %d with ambiguous volumes", p.ExitCode(true))
	}

	// the objects: the VolumeState hands the old lifecycle over, the PV is pre-bound
	a := p.Adopt[0]
	vs, pv := a.VolumeState, a.PersistentVolume
	if vs.Annotations[storev1.AnnotationAdoptedFrom] != lostStore || vs.Spec.StoreName != "files.node-a" || vs.Spec.CSIName != "pvc-ok" ||
		vs.Spec.CapacityBytes != gib || vs.Labels[policyv1.LabelNode] != "node-a" || vs.Finalizers[0] != storev1.FinalizerVolume {
		t.Errorf("VolumeState %+v", vs)
	}
	if pv.Name != "pvc-ok" || pv.Spec.ClaimRef.Namespace != "shop" || pv.Spec.ClaimRef.Name != "db-0" || pv.Spec.CSI.VolumeHandle != ok ||
		pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0] != "node-a" || pv.Annotations[AnnotationProvisionedBy] != policyv1.DriverName {
		t.Errorf("PV %+v", pv)
	}

	// formats: the counts line in each, JSON decodes
	for _, f := range []string{FormatText, FormatMarkdown, FormatJSON} {
		var b bytes.Buffer
		if err := Write(&b, &Report{Plan: p}, f); err != nil {
			t.Fatal(err)
		}
		if f == FormatJSON {
			var back Report
			if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back.Plan.Adopt) != 1 || len(back.Plan.Ambiguous) != len(wantAmbiguous) {
				t.Errorf("JSON %s: %v", b.String(), err)
			}
			continue
		}
		if !strings.Contains(b.String(), fmt.Sprintf("plan: adopt 1 / ambiguous %d / orphan 3 / missing 1", len(wantAmbiguous))) {
			t.Errorf("%s:\n%s", f, b.String())
		}
	}
}

// After --confirm the VolumeStates exist while the Stores still list the volumes until their
// next refresh: the plan is empty.
func TestSecondRunFindsNothingToDo(t *testing.T) {
	w := newWorld()
	id := w.stamped(t, "pvc-ok", "shop", "db-0", 1<<30, nil)
	w.claim("shop", "db-0", 1<<30)
	if p := Build(w.in); len(p.Adopt) != 1 || p.ExitCode(true) != ExitPending {
		t.Fatalf("first plan %+v", p)
	}
	w.in.VolumeStates[id] = true
	w.in.Claims["shop/db-0"].Phase, w.in.Claims["shop/db-0"].VolumeName = corev1.ClaimBound, "pvc-ok"
	p := Build(w.in)
	if len(p.Adopt)+len(p.Ambiguous)+len(p.Orphan)+len(p.Missing) != 0 || p.ExitCode(true) != ExitNothingToDo {
		t.Fatalf("second plan %+v", p)
	}
}

// A volume stamped under the current Store object lost its VolumeState in this control plane
// (deleted while its node was away): not a re-adoption, whatever claim it names.
func TestVolumeOfThisControlPlaneIsNotAdopted(t *testing.T) {
	w := newWorld()
	w.stamped(t, "pvc-ok", "shop", "db-0", 1<<30, func(s *identity.Stamp) { s.StoreUID = "uid-now" })
	w.claim("shop", "db-0", 1<<30)
	p := Build(w.in)
	if len(p.Adopt) != 0 || len(p.Orphan) != 1 || !strings.Contains(p.Orphan[0].Reason, "current Store object") {
		t.Fatalf("plan %+v", p)
	}
}

// BenchmarkPlan10000 plans 10,000 claims, each with its stamped volume.
func BenchmarkPlan10000(b *testing.B) {
	w := newWorld()
	for i := range 10000 {
		name := fmt.Sprintf("data-%d", i)
		w.stamped(b, "pvc-"+name, "shop", name, 1<<30, nil)
		w.claim("shop", name, 1<<30)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if p := Build(w.in); len(p.Adopt) != 10000 {
			b.Fatalf("%d adopted", len(p.Adopt))
		}
	}
}

// A claim with per-PVC overrides is adopted when its Placement allows them and they, frozen as
// CreateVolume freezes them, give the stamp's policy digest; other overrides than the volume
// was made with, or overrides the Placement refuses, leave it ambiguous.
func TestClaimWithOverridesAdoptedWhenTheDigestAgrees(t *testing.T) {
	w := newWorld()
	pl := w.in.Placements["fast"]
	pl.Spec.Overrides = &policyv1.Overrides{Allowed: []policyv1.OverrideParameter{policyv1.OverrideMountOptions, policyv1.OverrideStrategy}}
	mountAnn := policyv1.OverrideAnnotations[policyv1.OverrideMountOptions]
	strategyAnn := policyv1.OverrideAnnotations[policyv1.OverrideStrategy]
	// the digest CreateVolume froze for a claim setting mount options opts (or, with opts "",
	// strategy Spreadout: placement only, but the annotation is frozen too)
	made := func(opts string) string {
		_, pool, proto := policies()
		f := Frozen(pl, pool, proto, "ext4")
		if opts == "" {
			f.Overrides = map[string]string{strategyAnn: "Spreadout"}
		} else {
			f.Filesystem.MountOptions = append(f.Filesystem.MountOptions, strings.Split(opts, ",")...)
			f.Overrides = map[string]string{mountAnn: opts}
		}
		d, err := identity.PolicyDigest(f)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	const gib = 1 << 30
	same := w.stamped(t, "pvc-same", "shop", "same", gib, func(s *identity.Stamp) { s.PolicyDigest = made("noatime") })
	w.claim("shop", "same", gib).Annotations = map[string]string{mountAnn: "noatime"}
	changed := w.stamped(t, "pvc-changed", "shop", "changed", gib, func(s *identity.Stamp) { s.PolicyDigest = made("noatime") })
	w.claim("shop", "changed", gib).Annotations = map[string]string{mountAnn: "nodiscard"}
	dropped := w.stamped(t, "pvc-dropped", "shop", "dropped", gib, func(s *identity.Stamp) { s.PolicyDigest = made("noatime") })
	w.claim("shop", "dropped", gib)
	refused := w.stamped(t, "pvc-refused", "shop", "refused", gib, nil)
	w.claim("shop", "refused", gib).Annotations = map[string]string{policyv1.OverrideAnnotations[policyv1.OverrideMkfsOptions]: "-m 0"}
	placed := w.stamped(t, "pvc-placed", "shop", "placed", gib, func(s *identity.Stamp) { s.PolicyDigest = made("") })
	w.claim("shop", "placed", gib).Annotations = map[string]string{strategyAnn: "Spreadout"}

	p := Build(w.in)
	got := map[string]bool{}
	for _, a := range p.Adopt {
		got[a.VolumeID] = true
		if a.VolumeID == same && (a.VolumeState.Spec.Policy.Overrides[mountAnn] != "noatime" ||
			a.PersistentVolume.Spec.CSI.VolumeAttributes[contextMountOptions] != `["noatime"]`) {
			t.Errorf("adopted VolumeState policy %+v, PV context %v: the override is not frozen", a.VolumeState.Spec.Policy, a.PersistentVolume.Spec.CSI.VolumeAttributes)
		}
	}
	if len(p.Adopt) != 2 || !got[same] || !got[placed] {
		t.Errorf("adopt %+v, want %s and %s\nambiguous:\n%s", p.Adopt, same, placed, reasons(p.Ambiguous))
	}
	want := map[string]string{changed: "and the claim's overrides) differs", dropped: "differs from the one the volume was made with",
		refused: "overrides are refused by Placement fast"}
	if len(p.Ambiguous) != len(want) {
		t.Errorf("ambiguous:\n%s", reasons(p.Ambiguous))
	}
	for _, f := range p.Ambiguous {
		if !strings.Contains(f.Reason, want[f.VolumeID]) {
			t.Errorf("ambiguous %s: %q, want it to say %q", f.VolumeID, f.Reason, want[f.VolumeID])
		}
	}
}
