package v1alpha1

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fieldReader is where code outside schema/ reads a policy field: a non-test Go file of this
// repository (scheduler module included) and a snippet of it that reads the field.
type fieldReader struct{ file, snippet string }

// fieldReaders maps every field of the policy specs, by its YAML path, to the code that acts
// on it. TestEveryPolicyFieldIsRead fails for a field without an entry (a new field nothing
// reads yet), an entry without a field, and a snippet its file no longer holds (the reader
// went away). A field that is accepted but not implemented must be refused by vet: its
// reader is the rejection.
var fieldReaders = map[string]fieldReader{
	"StoragePool.spec.nodeSelector":                     {"controllers/render/render.go", "p.Spec.NodeSelector"},
	"StoragePool.spec.backend.lvm.volumeGroup":          {"agents/agent/backend.go", "b.LVM.VolumeGroup"},
	"StoragePool.spec.backend.lvm.devices":              {"agents/agent/backend.go", "b.LVM.Devices"},
	"StoragePool.spec.backend.lvm.thinPool.name":        {"agents/agent/backend.go", "b.LVM.ThinPool.Name"},
	"StoragePool.spec.backend.lvm.thinPool.sizePercent": {"agents/agent/backend.go", "b.LVM.ThinPool.SizePercent"},
	"StoragePool.spec.backend.lvm.cache.volumeGroup":    {"agents/agent/backend.go", "VolumeGroup: c.VolumeGroup"},
	"StoragePool.spec.backend.lvm.cache.devices":        {"agents/agent/backend.go", "Devices: c.Devices"},
	"StoragePool.spec.backend.lvm.cache.mode":           {"agents/agent/backend.go", "Mode: string(c.Mode)"},
	"StoragePool.spec.backend.lvm.cache.ratioPercent":   {"agents/agent/backend.go", "RatioPercent: int(c.RatioPercent)"},
	"StoragePool.spec.backend.zfs.pool":                 {"agents/agent/backend.go", "b.ZFS.Pool"},
	"StoragePool.spec.backend.zfs.parentDataset":        {"agents/agent/backend.go", "b.ZFS.ParentDataset"},
	"StoragePool.spec.backend.zfs.volBlockSize":         {"agents/agent/backend.go", "b.ZFS.VolBlockSize"},
	"StoragePool.spec.backend.zfs.properties":           {"agents/agent/backend.go", "b.ZFS.Properties"},
	"StoragePool.spec.backend.file.directory":           {"agents/agent/backend.go", "b.File.Directory"},
	"StoragePool.spec.backend.raw.devices":              {"agents/agent/backend.go", "b.Raw.Devices"},
	"StoragePool.spec.backend.raw.partitioning":         {"agents/agent/backend.go", "b.Raw.Partitioning"},
	"StoragePool.spec.reserve":                          {"controllers/render/render.go", "p.Spec.Reserve"},
	"StoragePool.spec.overcommitPercent":                {"controllers/render/render.go", "p.Spec.OvercommitPercent"},
	"StoragePool.spec.driftPolicy":                      {"controllers/render/render.go", "p.Spec.DriftPolicy"},
	"StoragePool.spec.evacuateNodes":                    {"controllers/render/render.go", "p.Spec.EvacuateNodes"},
	"StoragePool.spec.maxParallelMovesPerStore":         {"controllers/diff/moves.go", "p.Spec.MaxParallelMovesPerStore"},
	"Protocol.spec.local":                               {"scheduler/plugin/capacity/new.go", "pr.Spec.Local != nil"},
	"Protocol.spec.nvmeofTcp.port":                      {"controllers/render/render.go", "proto.Spec.NVMeoFTCP.Port"},
	"Protocol.spec.nvmeofTcp.bindCIDR":                  {"controllers/render/render.go", "proto.Spec.NVMeoFTCP.BindCIDR"},
	"Protocol.spec.nvmeofTcp.acl":                       {"agents/agent/drift.go", "p.ACL"},
	"Protocol.spec.nvmeofTcp.maxQueueSize":              {"csi/controller/publish.go", "t.MaxQueueSize"},
	"Protocol.spec.nvmeofTcp.ctrlLossTmo":               {"csi/controller/publish.go", "t.CtrlLossTmo"},
	"Protocol.spec.nvmeofTcp.reconnectDelay":            {"csi/controller/publish.go", "t.ReconnectDelay"},
	"Protocol.spec.nvmeofTcp.auth.mode":                 {"agents/agent/auth.go", "p.Auth.Enabled()"},
	"Protocol.spec.nvmeofTcp.auth.hash":                 {"agents/agent/auth.go", "dhchap.KernelHash(p.Auth.Hash)"},
	"Protocol.spec.nvmeofTcp.auth.dhGroup":              {"agents/agent/auth.go", "dhchap.KernelDHGroup(p.Auth.DHGroup)"},
	"Protocol.spec.nvmeofTcp.auth.bidirectional":        {"csi/controller/publish.go", "t.Auth.Bidirectional"},
	"Protocol.spec.nvmeofTcp.auth.keyGeneration":        {"controllers/nvmeauth/nvmeauth.go", "p.Spec.NVMeoFTCP.Auth.KeyGeneration"},
	"Placement.spec.poolRef.name":                       {"controllers/render/render.go", "pl.Spec.PoolRef.Name"},
	"Placement.spec.protocolRef.name":                   {"controllers/render/render.go", "pl.Spec.ProtocolRef.Name"},
	"Placement.spec.storageClass.name":                  {"controllers/policy/steps.go", "pl.Spec.StorageClass.Name"},
	"Placement.spec.storageClass.reclaimPolicy":         {"controllers/render/render.go", "t.ReclaimPolicy"},
	"Placement.spec.storageClass.volumeBindingMode":     {"controllers/render/render.go", "t.VolumeBindingMode"},
	"Placement.spec.storageClass.allowVolumeExpansion":  {"controllers/render/render.go", "t.AllowVolumeExpansion"},
	"Placement.spec.storageClass.isDefault":             {"controllers/render/render.go", "t.IsDefault"},
	"Placement.spec.overrides.allowed":                  {"internal/overrides/overrides.go", "pl.Spec.Overrides.Allowed"},
	"Placement.spec.attributesClasses":                  {"controllers/render/attributesclass.go", "pl.Spec.AttributesClasses"},
	"Placement.spec.snapshotClass.name":                 {"controllers/render/snapshotclass.go", "u.SetName(t.Name)"},
	"Placement.spec.snapshotClass.deletionPolicy":       {"controllers/render/snapshotclass.go", "t.DeletionPolicy"},
	"Placement.spec.snapshotClass.isDefault":            {"controllers/render/snapshotclass.go", "t.IsDefault"},
	"Placement.spec.snapshotClass.velero":               {"controllers/render/snapshotclass.go", "t.Velero"},
	"Placement.spec.snapshotClass.group":                {"controllers/render/render.go", "SnapshotClass.Group"},
	"Placement.spec.storageClass.replacement":           {"controllers/plan/decide.go", "pl.Spec.StorageClass.Replacement"},
	"Placement.spec.filesystem.fsType":                  {"controllers/render/render.go", "pl.Spec.Filesystem.FSType"},
	"Placement.spec.filesystem.mkfsOptions":             {"csi/controller/controller.go", "fs.MkfsOptions"},
	"Placement.spec.filesystem.mountOptions":            {"controllers/render/render.go", "pl.Spec.Filesystem.MountOptions"},
	"Placement.spec.strategy":                           {"csi/controller/create.go", "placement.Spec.Strategy"},
	"Placement.spec.existingVolumes":                    {"controllers/diff/moves.go", "pl.Spec.ExistingVolumes"},
	"Placement.spec.spreadAcross":                       {"controllers/render/render.go", "pl.Spec.SpreadAcross"},
	"Placement.spec.encryption.provider":                {"csi/controller/key.go", "e.Provider"},
	"Placement.spec.encryption.cipher":                  {"csi/controller/key.go", "e.Cipher"},
	"Placement.spec.encryption.keySize":                 {"csi/controller/key.go", "e.KeySize"},
	"Placement.spec.encryption.keySecret.name":          {"csi/controller/key.go", "e.KeySecret.Name"},
	"Placement.spec.encryption.keySecret.namespace":     {"csi/controller/key.go", "e.KeySecret.Namespace"},
	"Placement.spec.encryption.keyGeneration":           {"csi/controller/rotate.go", "e.KeyGeneration"},
}

// policyFields lists the YAML paths of the leaf fields of t under prefix: structs are walked
// (through pointers), a struct without fields (a presence flag such as local: {}) and any other
// type is a leaf; Kubernetes' own types (metav1.LabelSelector) are leaves too.
func policyFields(prefix string, t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.NumField() == 0 || t.PkgPath() != reflect.TypeFor[PlacementSpec]().PkgPath() {
		return []string{prefix}
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out = append(out, policyFields(prefix+"."+name, f.Type)...)
	}
	return out
}

// TestEveryPolicyFieldIsRead: a policy field a user can write and nothing reads promises what
// Plinth does not do. Every field needs an entry in fieldReaders, and its reader must still be
// there.
func TestEveryPolicyFieldIsRead(t *testing.T) {
	var fields []string
	for kind, spec := range map[string]reflect.Type{
		"StoragePool": reflect.TypeFor[StoragePoolSpec](),
		"Protocol":    reflect.TypeFor[ProtocolSpec](),
		"Placement":   reflect.TypeFor[PlacementSpec](),
	} {
		fields = append(fields, policyFields(kind+".spec", spec)...)
	}
	sort.Strings(fields)
	if len(fields) < 30 {
		t.Fatalf("found %d fields, want the 33 or more of the three specs: %q", len(fields), fields)
	}
	if got := policyFields("x", reflect.TypeFor[metav1.LabelSelector]()); len(got) != 1 {
		t.Fatalf("a Kubernetes type was walked: %q", got)
	}
	root := filepath.Join("..", "..", "..")
	seen := map[string]bool{}
	for _, f := range fields {
		seen[f] = true
		r, ok := fieldReaders[f]
		if !ok {
			t.Errorf("policy field %s: no code reads it (add its reader to fieldReaders, or make vet refuse it until it is implemented)", f)
			continue
		}
		if strings.HasSuffix(r.file, "_test.go") || strings.HasPrefix(r.file, "schema/policy/") {
			t.Errorf("policy field %s: reader %s must be product code outside the API types", f, r.file)
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, r.file))
		if err != nil {
			t.Errorf("policy field %s: reader %v", f, err)
			continue
		}
		if !strings.Contains(string(data), r.snippet) {
			t.Errorf("policy field %s: %s no longer holds %q: find what reads the field now", f, r.file, r.snippet)
		}
	}
	for f := range fieldReaders {
		if !seen[f] {
			t.Errorf("fieldReaders names %s, which is not a field of the policy specs", f)
		}
	}
}
