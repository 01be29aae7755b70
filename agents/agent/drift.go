package agent

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/nvmet"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Drift kinds and reasons (DriftItem.Kind / DriftItem.Reason).
const (
	KindLogicalVolume = "LogicalVolume"
	KindExport        = "Export"
	KindVolumeGroup   = "VolumeGroup"
	KindThinPool      = "ThinPool"
	// KindDataset is a ZFS pool's parent dataset (or the pool itself) that holds the zvols.
	KindDataset = "Dataset"
	// KindDirectory is the file backend's directory.
	KindDirectory = "Directory"
	// KindDisk is a raw backend's disk.
	KindDisk = "Disk"

	DriftMissing       = "Missing"
	DriftResized       = "Resized"
	DriftOrphan        = "Orphan"
	DriftMisconfigured = "Misconfigured"
	DriftACLDiffers    = "ACLDiffers"
	// DriftAuthDiffers: a host entry's DH-HMAC-CHAP setting is not its Secret's.
	DriftAuthDiffers = "AuthDiffers"
)

// desiredExport is the export a VolumeState asks for.
type desiredExport struct {
	spec nvmet.ExportSpec
	port int32
}

// exportOf returns the export a nvmeofTcp VolumeState wants: NQN from the
// volume id, the node address inside the frozen protocol's bindCIDR, its
// port (default 4420) and, with ACL (default on), the host NQNs of the
// publications (sorted, unique, empty ones skipped).
func exportOf(vs *storev1.VolumeState, devicePath string, addrs AddrLister) (desiredExport, error) {
	p := vs.Spec.Policy.ProtocolSpec.NVMeoFTCP
	nqn, err := nvmet.VolumeNQN(vs.Name)
	if err != nil {
		return desiredExport{}, err
	}
	addr, err := SelectAddress(p.BindCIDR, addrs)
	if err != nil {
		return desiredExport{}, err
	}
	port := p.Port
	if port == 0 {
		port = 4420
	}
	acl := p.ACL == nil || *p.ACL
	var hosts []string
	if acl {
		seen := map[string]bool{}
		for _, pub := range vs.Spec.Publications {
			if pub.HostNQN != "" && !seen[pub.HostNQN] {
				seen[pub.HostNQN] = true
				hosts = append(hosts, pub.HostNQN)
			}
		}
		sort.Strings(hosts)
	}
	return desiredExport{port: port, spec: nvmet.ExportSpec{
		NQN: nqn, DevicePath: devicePath, ACL: acl, Hosts: hosts,
		Endpoint: nvmet.Endpoint{Address: addr, ServiceID: strconv.Itoa(int(port))},
	}}, nil
}

// exportDrift compares an observed export (nil when the subsystem is
// absent) with the desired one; nil when they match.
func exportDrift(want nvmet.ExportSpec, got *nvmet.Export) *storev1.DriftItem {
	item := func(reason, format string, args ...any) *storev1.DriftItem {
		return &storev1.DriftItem{Kind: KindExport, Name: want.NQN, Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	if got == nil {
		return item(DriftMissing, "nvmet subsystem %s is missing", want.NQN)
	}
	var ns *nvmet.Namespace
	for i := range got.Namespaces {
		if got.Namespaces[i].ID == nvmet.NamespaceID {
			ns = &got.Namespaces[i]
		}
	}
	switch {
	case ns == nil:
		return item(DriftMisconfigured, "nvmet subsystem %s has no namespace %d", want.NQN, nvmet.NamespaceID)
	case want.DevicePath != "" && ns.DevicePath != want.DevicePath:
		return item(DriftMisconfigured, "namespace %d of %s points at %q, not %s", nvmet.NamespaceID, want.NQN, ns.DevicePath, want.DevicePath)
	case !ns.Enabled:
		return item(DriftMisconfigured, "namespace %d of %s is disabled", nvmet.NamespaceID, want.NQN)
	}
	linked := false
	for _, p := range got.Ports {
		if p.Address == want.Endpoint.Address && p.ServiceID == want.Endpoint.ServiceID && p.Transport == nvmet.TransportTCP {
			linked = true
		}
	}
	if !linked || len(got.Ports) != 1 {
		var where []string
		for _, p := range got.Ports {
			where = append(where, p.Address+":"+p.ServiceID)
		}
		return item(DriftMisconfigured, "%s is linked to ports %v, want only %s:%s", want.NQN, where, want.Endpoint.Address, want.Endpoint.ServiceID)
	}
	if got.AllowAnyHost == want.ACL {
		return item(DriftACLDiffers, "%s has attr_allow_any_host=%v, want ACL %v", want.NQN, got.AllowAnyHost, want.ACL)
	}
	if fmt.Sprint(got.Hosts) != fmt.Sprint(nonNil(want.Hosts)) {
		return item(DriftACLDiffers, "%s allows hosts %v, want %v", want.NQN, got.Hosts, want.Hosts)
	}
	for _, h := range want.Hosts {
		if a, ok := want.HostAuth[h]; ok && !nvmet.AuthMatches(a, got.HostAuth[h]) {
			// names the host, never a key
			return item(DriftAuthDiffers, "host %s of %s has not the DH-HMAC-CHAP setting of its Secret", h, want.NQN)
		}
	}
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// volumeDrift compares the volume the backend reports (nil when absent)
// with what the VolumeState's status says was created.
func volumeDrift(vs *storev1.VolumeState, vol *backend.Volume) *storev1.DriftItem {
	if vs.Status.ActualBytes == 0 {
		return nil // never created: nothing to drift from
	}
	if vol == nil {
		return &storev1.DriftItem{Kind: KindLogicalVolume, Name: vs.Name, Reason: DriftMissing,
			Message: fmt.Sprintf("volume %s of %d bytes is missing", vs.Name, vs.Status.ActualBytes)}
	}
	if vol.SizeBytes < vs.Status.ActualBytes {
		return &storev1.DriftItem{Kind: KindLogicalVolume, Name: vs.Name, Reason: DriftResized,
			Message: fmt.Sprintf("volume %s has %d bytes, %d were created", vs.Name, vol.SizeBytes, vs.Status.ActualBytes)}
	}
	return nil
}

// isNVMeoF reports whether the volume's frozen protocol is NVMe-oF/TCP.
func isNVMeoF(vs *storev1.VolumeState) bool { return vs.Spec.Policy.ProtocolSpec.NVMeoFTCP != nil }

// storeMissing is the drift item of a Store whose backing object vanished after it was ensured
// (err wraps backend.ErrNotFound): the VG or thin pool (LVM), the pool's parent dataset (ZFS),
// the directory (file) or the disks (raw), by the names the Store declares.
func storeMissing(b policyv1.Backend, err error) storev1.DriftItem {
	item := storev1.DriftItem{Reason: DriftMissing, Message: err.Error()}
	switch {
	case b.LVM != nil:
		item.Kind, item.Name = KindVolumeGroup, b.LVM.VolumeGroup
		if strings.Contains(err.Error(), "thin pool") && b.LVM.ThinPool != nil {
			item.Kind, item.Name = KindThinPool, b.LVM.ThinPool.Name
		}
		if strings.HasPrefix(err.Error(), "cache: ") && b.LVM.Cache != nil {
			item.Name = b.LVM.Cache.VolumeGroup // the fast VG of the cache LVs
		}
	case b.ZFS != nil:
		item.Kind, item.Name = KindDataset, b.ZFS.Pool
		if b.ZFS.ParentDataset != "" {
			item.Name += "/" + b.ZFS.ParentDataset
		}
	case b.File != nil:
		item.Kind, item.Name = KindDirectory, b.File.Directory
	case b.Raw != nil:
		item.Kind, item.Name = KindDisk, strings.Join(b.Raw.Devices, ",")
	}
	return item
}
