package vet

import (
	"fmt"
	"strings"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// scratch holds the buffers of one Combine: a Combiner reuses them, cleared, on its next call.
type scratch struct {
	all                  []vetted
	docs, placements     []*vetted
	invalid              map[string]bool // "Kind/name" of policy documents that failed their schema
	byKind               map[string]map[string]*vetted
	classes, snapClasses map[string]*vetted
	// attrClasses holds each VolumeAttributesClass name with its Placement and list index.
	attrClasses map[string]attrClassAt
}

// attrClassAt is where a VolumeAttributesClass name was first declared.
type attrClassAt struct {
	vd    *vetted
	index int
}

// reset empties sc, keeping what it allocated.
func (sc *scratch) reset() {
	if sc.byKind == nil {
		sc.invalid, sc.classes, sc.snapClasses = map[string]bool{}, map[string]*vetted{}, map[string]*vetted{}
		sc.attrClasses = map[string]attrClassAt{}
		sc.byKind = map[string]map[string]*vetted{"StoragePool": {}, "Protocol": {}, "Placement": {}}
	}
	clear(sc.all[:cap(sc.all)]) // drop the last call's documents and objects
	sc.all, sc.docs, sc.placements = sc.all[:0], sc.docs[:0], sc.placements[:0]
	clear(sc.invalid)
	clear(sc.classes)
	clear(sc.snapClasses)
	clear(sc.attrClasses)
	for _, m := range sc.byKind {
		clear(m)
	}
}

// crossCheck applies the rules that need the whole set, with maps keyed by name (O(n)):
// unique names per kind, references that resolve, unique StorageClass names, at most one
// default class, the local protocol only with WaitForFirstConsumer, and spreadAcross of a local
// Placement only with WaitForFirstConsumer (see spreadProblems), to sc.docs. sc.invalid holds the
// "Kind/name" of documents that failed their schema: a reference to one of them is not
// reported again as missing (its own problems say what is wrong).
func crossCheck(sc *scratch) []Problem {
	docs, invalid := sc.docs, sc.invalid
	var ps []Problem
	byKind := sc.byKind
	for _, vd := range docs {
		m := byKind[vd.doc.Kind]
		if first, dup := m[vd.doc.Name]; dup {
			msg := fmt.Sprintf("duplicate %s %q: first defined at %s", vd.doc.Kind, vd.doc.Name, where(first.doc))
			if vd.doc.Build != "" {
				msg += "; this copy built by kustomization " + vd.doc.Build
			}
			ps = append(ps, at(vd.doc, []string{"metadata", "name"}, msg))
			continue
		}
		m[vd.doc.Name] = vd
		if vd.doc.Kind == "Placement" {
			sc.placements = append(sc.placements, vd)
		}
	}
	ps = append(ps, authAgreement(docs)...)
	classes := sc.classes
	var defaultClass, defaultSnapClass *vetted
	for _, vd := range sc.placements {
		pl := vd.obj.(*policyv1.Placement)
		if _, ok := byKind["StoragePool"][pl.Spec.PoolRef.Name]; !ok && !invalid["StoragePool/"+pl.Spec.PoolRef.Name] {
			ps = append(ps, at(vd.doc, []string{"spec", "poolRef", "name"},
				fmt.Sprintf("StoragePool %q not found in the policy set", pl.Spec.PoolRef.Name)))
		}
		proto, ok := byKind["Protocol"][pl.Spec.ProtocolRef.Name]
		switch {
		case !ok && invalid["Protocol/"+pl.Spec.ProtocolRef.Name]:
			// present but invalid: its own problems say why
		case !ok:
			ps = append(ps, at(vd.doc, []string{"spec", "protocolRef", "name"},
				fmt.Sprintf("Protocol %q not found in the policy set", pl.Spec.ProtocolRef.Name)))
		case proto.obj.(*policyv1.Protocol).Spec.Local != nil &&
			pl.Spec.StorageClass.VolumeBindingMode != "WaitForFirstConsumer":
			ps = append(ps, at(vd.doc, []string{"spec", "storageClass", "volumeBindingMode"},
				fmt.Sprintf("Protocol %q is local: the pod must run on the volume's node, so volumeBindingMode must be WaitForFirstConsumer, not %s",
					pl.Spec.ProtocolRef.Name, pl.Spec.StorageClass.VolumeBindingMode)))
		}
		if first, dup := classes[pl.Spec.StorageClass.Name]; dup {
			ps = append(ps, at(vd.doc, []string{"spec", "storageClass", "name"},
				fmt.Sprintf("StorageClass %q is also rendered by Placement %q at %s", pl.Spec.StorageClass.Name, first.doc.Name, where(first.doc))))
		} else {
			classes[pl.Spec.StorageClass.Name] = vd
		}
		if pl.Spec.SpreadAcross != "" {
			ps = append(ps, spreadProblems(vd, pl, proto, ok)...)
		}
		// plinth-keys holds Plinth's own volume keys, which the CSI controller reads and copies
		// into restores (docs/design.md#volume-encryption): an operator's Secret there would be
		// taken for one of them.
		if e := pl.Spec.Encryption; e != nil && e.KeySecret != nil && e.KeySecret.Namespace == policyv1.VolumeKeyNamespace {
			ps = append(ps, at(vd.doc, []string{"spec", "encryption", "keySecret", "namespace"},
				fmt.Sprintf("namespace %s holds Plinth's own volume keys only: put the operator's Secret in another namespace, or drop keySecret for a key per volume", policyv1.VolumeKeyNamespace)))
		}
		// bcache sizes its device from the backing LV at registration: the agent refuses to grow a
		// cached volume, so a class that lets PVCs grow would only produce failed resizes.
		if pool, ok := byKind["StoragePool"][pl.Spec.PoolRef.Name]; ok && pl.Spec.StorageClass.AllowVolumeExpansion {
			if lvm := pool.obj.(*policyv1.StoragePool).Spec.Backend.LVM; lvm != nil && lvm.Cache != nil {
				ps = append(ps, at(vd.doc, []string{"spec", "storageClass", "allowVolumeExpansion"},
					fmt.Sprintf("StoragePool %q has a bcache cache (lvm.cache): cached volumes do not grow; set allowVolumeExpansion to false", pl.Spec.PoolRef.Name)))
			}
		}
		var snapProblems []Problem
		snapProblems, defaultSnapClass = sc.snapshotClassProblems(vd, pl, defaultSnapClass)
		ps = append(ps, snapProblems...)
		ps = append(ps, sc.attributesClassProblems(vd, pl)...)
		if pl.Spec.StorageClass.IsDefault {
			if defaultClass != nil {
				ps = append(ps, at(vd.doc, []string{"spec", "storageClass", "isDefault"},
					fmt.Sprintf("Placement %q at %s is already the default StorageClass; at most one may be", defaultClass.doc.Name, where(defaultClass.doc))))
			} else {
				defaultClass = vd
			}
		}
	}
	return ps
}

// spreadProblems checks a Placement that sets spreadAcross. For a local Protocol the
// plinth-scheduler plugin spreads the volumes while it schedules their pod (the pod's node is
// the volume's), so the class needs WaitForFirstConsumer: with Immediate the volume is
// provisioned before any pod is scheduled. An NVMe-oF volume is placed on a storage node by
// CreateVolume, which spreads it with either binding mode (docs/design.md, "Spreading remote
// volumes"): nothing to refuse.
func spreadProblems(vd *vetted, pl *policyv1.Placement, proto *vetted, protoFound bool) []Problem {
	if protoFound && proto.obj.(*policyv1.Protocol).Spec.NVMeoFTCP != nil {
		return nil
	}
	if pl.Spec.StorageClass.VolumeBindingMode == "Immediate" {
		return []Problem{at(vd.doc, []string{"spec", "spreadAcross"},
			fmt.Sprintf("spreadAcross %s needs storageClass.volumeBindingMode WaitForFirstConsumer with a local Protocol: with Immediate a volume is provisioned before its pod is scheduled, so nothing can spread it",
				pl.Spec.SpreadAcross))}
	}
	return nil
}

func at(d *Document, path []string, msg string) Problem {
	p := Problem{File: d.File, Line: d.Line, Column: d.Column, Kind: d.Kind, Name: d.Name,
		Field: strings.Join(path, "."), Message: msg}
	src := d
	if d.source != nil {
		src = d.source
	}
	if l, c, ok := fieldPos(src.syntax(), path); ok {
		p.Line, p.Column = l, c
	}
	return p
}

// whereField is "file:line" of the field at path of d.
func whereField(d *Document, path ...string) string {
	file, line, _ := d.Position(path...)
	return fmt.Sprintf("%s:%d", file, line)
}

func where(d *Document) string {
	if d.Build != "" {
		return fmt.Sprintf("%s:%d (built by kustomization %s)", d.File, d.Line, d.Build)
	}
	return fmt.Sprintf("%s:%d", d.File, d.Line)
}

// Position returns where the field at path (dotted segments such as "spec", "reserve") of d
// is written: the file and the 1-based line and column, in the source file for documents
// built by kustomize. When the field is absent it is the nearest enclosing field that is
// written, or the document's start.
func (d *Document) Position(path ...string) (file string, line, column int) {
	p := at(d, path, "")
	return p.File, p.Line, p.Column
}

// authAgreement: every Protocol with DH-HMAC-CHAP names the same hash, dhGroup and
// keyGeneration. The kernel's target keeps one setting per host entry
// (hosts/<hostnqn>/dhchap_hash, dhchap_dhgroup), shared by every subsystem that allows the host,
// and the controller makes one secret per host whose length follows the hash: two settings would overwrite each other. One keyGeneration, because
// the host has one key: a rotation asked by one Protocol rotates it for all.
func authAgreement(docs []*vetted) []Problem {
	var ps []Problem
	var first *vetted
	for _, vd := range docs {
		p, ok := vd.obj.(*policyv1.Protocol)
		if !ok || p.Spec.NVMeoFTCP == nil || !p.Spec.NVMeoFTCP.Auth.Enabled() {
			continue
		}
		if first == nil {
			first = vd
			continue
		}
		a, b := first.obj.(*policyv1.Protocol).Spec.NVMeoFTCP.Auth, p.Spec.NVMeoFTCP.Auth
		hash := func(h string) string {
			if h == "" {
				return "sha256"
			}
			return h
		}
		group := func(g string) string {
			if g == "" {
				return "null"
			}
			return g
		}
		if hash(a.Hash) != hash(b.Hash) || group(a.DHGroup) != group(b.DHGroup) {
			ps = append(ps, at(vd.doc, []string{"spec", "nvmeofTcp", "auth"},
				fmt.Sprintf("Protocol %q at %s authenticates with hash %s and dhGroup %s, this one with %s and %s: every Protocol with DHHMACCHAP must use the same (the kernel keeps one setting per host)",
					first.doc.Name, where(first.doc), hash(a.Hash), group(a.DHGroup), hash(b.Hash), group(b.DHGroup))))
		}
		if a.KeyGeneration != b.KeyGeneration {
			// an unset keyGeneration points at the auth block that would hold it
			ps = append(ps, at(vd.doc, []string{"spec", "nvmeofTcp", "auth", "keyGeneration"},
				fmt.Sprintf("Protocol %q at %s has keyGeneration %d, this one %d: every Protocol with DHHMACCHAP must name the same (a host has one key; rotate by raising it in all of them)",
					first.doc.Name, where(first.doc), a.KeyGeneration, b.KeyGeneration)))
		}
	}
	return ps
}

// snapshotClassProblems checks the VolumeSnapshotClass Placement pl (of document vd) asks
// for: its name rendered once, at most one default (defaultClass is the default so far; the
// returned one is the default after pl), and a pool whose volumes take snapshots.
func (sc *scratch) snapshotClassProblems(vd *vetted, pl *policyv1.Placement, defaultClass *vetted) ([]Problem, *vetted) {
	cls := pl.Spec.SnapshotClass
	if cls == nil {
		return nil, defaultClass
	}
	var ps []Problem
	if first, dup := sc.snapClasses[cls.Name]; dup {
		ps = append(ps, at(vd.doc, []string{"spec", "snapshotClass", "name"},
			fmt.Sprintf("VolumeSnapshotClass %q is also rendered by Placement %q at %s", cls.Name, first.doc.Name, where(first.doc))))
	} else {
		sc.snapClasses[cls.Name] = vd
	}
	if cls.IsDefault {
		if defaultClass != nil {
			ps = append(ps, at(vd.doc, []string{"spec", "snapshotClass", "isDefault"},
				fmt.Sprintf("Placement %q at %s is already the default VolumeSnapshotClass; at most one may be", defaultClass.doc.Name, where(defaultClass.doc))))
		} else {
			defaultClass = vd
		}
	}
	// Thick LVM LVs and raw volumes have no snapshots (the CSI driver refuses them): a class for them
	// would only produce VolumeSnapshots that never become ready.
	if pool, ok := sc.byKind["StoragePool"][pl.Spec.PoolRef.Name]; ok {
		if lvm := pool.obj.(*policyv1.StoragePool).Spec.Backend.LVM; lvm != nil && lvm.ThinPool == nil {
			ps = append(ps, at(vd.doc, []string{"spec", "snapshotClass"},
				fmt.Sprintf("StoragePool %q is LVM without a thin pool: its volumes take no snapshots; declare lvm.thinPool or remove snapshotClass", pl.Spec.PoolRef.Name)))
		}
		if pool.obj.(*policyv1.StoragePool).Spec.Backend.Raw != nil {
			ps = append(ps, at(vd.doc, []string{"spec", "snapshotClass"},
				fmt.Sprintf("StoragePool %q is raw: partitions and whole disks take no snapshots; remove snapshotClass", pl.Spec.PoolRef.Name)))
		}
	}
	return ps, defaultClass
}

// attributesClassProblems checks the VolumeAttributesClasses (tiers) Placement pl (of document
// vd) declares: each name declared once across the set, each tier limiting something.
func (sc *scratch) attributesClassProblems(vd *vetted, pl *policyv1.Placement) []Problem {
	var ps []Problem
	// A VolumeAttributesClass is cluster-wide: two tiers of one name would render one object
	// with two sets of limits, and the CSI driver could not tell which Placement allows it.
	for i := range pl.Spec.AttributesClasses {
		name := pl.Spec.AttributesClasses[i].Name
		if first, dup := sc.attrClasses[name]; dup {
			ps = append(ps, at(vd.doc, []string{"spec", "attributesClasses", fmt.Sprint(i), "name"},
				fmt.Sprintf("VolumeAttributesClass %q is also declared by Placement %q at %s", name, first.vd.doc.Name,
					whereField(first.vd.doc, "spec", "attributesClasses", fmt.Sprint(first.index), "name"))))
			continue
		}
		sc.attrClasses[name] = attrClassAt{vd, i}
		// The CRD's CEL rule on IOLimits says the same: a tier that limits nothing is the
		// same as no class, and reads as a mistake.
		if pl.Spec.AttributesClasses[i].Limits.Empty() {
			ps = append(ps, at(vd.doc, []string{"spec", "attributesClasses", fmt.Sprint(i), "limits"},
				"set at least one of readIOPS, writeIOPS, readBytesPerSecond, writeBytesPerSecond (a claim without a class is unlimited)"))
		}
	}
	return ps
}
