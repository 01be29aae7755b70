package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/nvmet"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func addrs(cidrs ...string) AddrLister {
	return func() ([]net.Addr, error) {
		var out []net.Addr
		for _, c := range cidrs {
			ip, n, err := net.ParseCIDR(c)
			if err != nil {
				return nil, err
			}
			n.IP = ip
			out = append(out, n)
		}
		return out, nil
	}
}

func TestSelectAddress(t *testing.T) {
	list := addrs("127.0.0.1/8", "10.0.2.15/24", "10.20.3.4/16", "fd00::5/64")
	for _, tc := range []struct{ cidr, want, err string }{
		{"10.20.0.0/16", "10.20.3.4", ""},
		{"10.0.0.0/8", "10.0.2.15", ""}, // the first inside, in kernel order
		{"127.0.0.0/8", "127.0.0.1", ""},
		{"fd00::/64", "fd00::5", ""},
		{"192.168.0.0/16", "", "no address of this node is inside bindCIDR 192.168.0.0/16"},
		{"10.20.0.0", "", "bindCIDR"},
	} {
		got, err := SelectAddress(tc.cidr, list)
		if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("SelectAddress(%q) = %q, %v; want %q, %q", tc.cidr, got, err, tc.want, tc.err)
		}
	}
}

func TestProbe(t *testing.T) {
	root := t.TempDir()
	o := Options{NodeName: "n1", HostNQNFile: filepath.Join(root, "hostnqn"),
		SysRoot: filepath.Join(root, "sys"), ProcRoot: filepath.Join(root, "proc"), DevRoot: filepath.Join(root, "dev"),
		LookPath: func(string) (string, error) { return "", errors.New("absent") }}
	if err := o.defaults(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"sys/module/nvmet", "sys/module/dm_thin_pool", "proc", "dev"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "proc/modules"), []byte("nvme_tcp 45056 0 - Live 0x0\n"), 0o644)
	os.WriteFile(filepath.Join(root, "dev/loop-control"), nil, 0o644)

	ni := o.probe()
	if ni.HostNQN != "" || !strings.Contains(ni.HostNQNError, "hostnqn") {
		t.Errorf("missing host NQN file: %+v", ni)
	}
	if want := []string{"nvmet", "nvme_tcp", "dm_thin_pool"}; !reflect.DeepEqual(ni.Modules, want) {
		t.Errorf("modules %v, want %v", ni.Modules, want)
	}
	if want := []string{"nvmet_tcp", "bcache"}; !reflect.DeepEqual(ni.Missing, want) {
		t.Errorf("missing %v, want %v", ni.Missing, want)
	}
	if want := []string{"file"}; !reflect.DeepEqual(ni.Backends, want) {
		t.Errorf("backends %v, want %v", ni.Backends, want)
	}
	// raw needs all three of sfdisk, partx and wipefs
	have := map[string]bool{"sfdisk": true, "partx": true}
	o.LookPath = func(c string) (string, error) {
		if have[c] {
			return "/usr/sbin/" + c, nil
		}
		return "", errors.New("absent")
	}
	if ni := o.probe(); !reflect.DeepEqual(ni.Backends, []string{"file"}) {
		t.Errorf("backends without wipefs %v, want [file]", ni.Backends)
	}
	have["wipefs"] = true
	if ni := o.probe(); !reflect.DeepEqual(ni.Backends, []string{"file", "raw"}) {
		t.Errorf("backends with sfdisk, partx and wipefs %v, want [file raw]", ni.Backends)
	}
	nqn := "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001"
	os.WriteFile(o.HostNQNFile, []byte(nqn+"\n"), 0o644)
	if ni := o.probe(); ni.HostNQN != nqn || ni.HostNQNError != "" {
		t.Errorf("host NQN %q (%s), want %q", ni.HostNQN, ni.HostNQNError, nqn)
	}
	os.WriteFile(o.HostNQNFile, []byte("not an nqn\n"), 0o644)
	if ni := o.probe(); ni.HostNQN != "" || ni.HostNQNError == "" {
		t.Errorf("invalid host NQN accepted: %+v", ni)
	}
}

const (
	volID = "vol-0123456789abcdef0123456789abcdef01234567"
	hostA = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000a"
	hostB = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000b"
)

func nvmeVS() *storev1.VolumeState {
	vs := &storev1.VolumeState{}
	vs.Name = volID
	vs.Spec.Policy.ProtocolSpec.NVMeoFTCP = &policyv1.NVMeoFTCPProtocol{BindCIDR: "127.0.0.0/8"}
	vs.Spec.Publications = []storev1.Publication{{NodeName: "b", HostNQN: hostB}, {NodeName: "a", HostNQN: hostA}, {NodeName: "a2", HostNQN: hostA}, {NodeName: "local"}}
	return vs
}

func TestExportOf(t *testing.T) {
	want, err := exportOf(nvmeVS(), "/dev/vg/x", addrs("127.0.0.1/8"))
	if err != nil {
		t.Fatal(err)
	}
	nqn, _ := nvmet.VolumeNQN(volID)
	if want.spec.NQN != nqn || want.port != 4420 || want.spec.Endpoint.ServiceID != "4420" || want.spec.Endpoint.Address != "127.0.0.1" ||
		!want.spec.ACL || !reflect.DeepEqual(want.spec.Hosts, []string{hostA, hostB}) {
		t.Errorf("exportOf = %+v", want)
	}
	vs := nvmeVS()
	off := false
	vs.Spec.Policy.ProtocolSpec.NVMeoFTCP.ACL = &off
	vs.Spec.Policy.ProtocolSpec.NVMeoFTCP.Port = 4421
	if got, _ := exportOf(vs, "/dev/x", addrs("127.0.0.1/8")); got.spec.ACL || got.spec.Hosts != nil || got.port != 4421 {
		t.Errorf("ACL off: %+v", got)
	}
}

func TestExportDrift(t *testing.T) {
	want, _ := exportOf(nvmeVS(), "/dev/vg/x", addrs("127.0.0.1/8"))
	good := nvmet.Export{NQN: want.spec.NQN, Hosts: []string{hostA, hostB},
		Namespaces: []nvmet.Namespace{{ID: 1, DevicePath: "/dev/vg/x", Enabled: true}},
		Ports:      []nvmet.Port{{ID: 7, Transport: "tcp", Family: "ipv4", Address: "127.0.0.1", ServiceID: "4420"}}}
	if d := exportDrift(want.spec, &good); d != nil {
		t.Fatalf("matching export drifted: %+v", d)
	}
	mod := func(f func(e *nvmet.Export)) *nvmet.Export {
		e := good
		e.Namespaces = append([]nvmet.Namespace(nil), good.Namespaces...)
		e.Ports = append([]nvmet.Port(nil), good.Ports...)
		f(&e)
		return &e
	}
	for name, tc := range map[string]struct {
		got    *nvmet.Export
		reason string
	}{
		"missing":        {nil, DriftMissing},
		"no namespace":   {mod(func(e *nvmet.Export) { e.Namespaces = nil }), DriftMisconfigured},
		"other device":   {mod(func(e *nvmet.Export) { e.Namespaces[0].DevicePath = "/dev/other" }), DriftMisconfigured},
		"disabled":       {mod(func(e *nvmet.Export) { e.Namespaces[0].Enabled = false }), DriftMisconfigured},
		"unlinked":       {mod(func(e *nvmet.Export) { e.Ports = nil }), DriftMisconfigured},
		"other port":     {mod(func(e *nvmet.Export) { e.Ports[0].ServiceID = "4421" }), DriftMisconfigured},
		"allow any host": {mod(func(e *nvmet.Export) { e.AllowAnyHost = true; e.Hosts = nil }), DriftACLDiffers},
		"extra host":     {mod(func(e *nvmet.Export) { e.Hosts = []string{hostA} }), DriftACLDiffers},
		"two ports": {mod(func(e *nvmet.Export) {
			e.Ports = append(e.Ports, nvmet.Port{ID: 8, Transport: "tcp", Address: "10.0.0.1", ServiceID: "4420"})
		}), DriftMisconfigured},
	} {
		d := exportDrift(want.spec, tc.got)
		if d == nil || d.Reason != tc.reason || d.Kind != KindExport || d.Message == "" {
			t.Errorf("%s: drift %+v, want reason %s", name, d, tc.reason)
		}
	}
}

func TestVolumeDrift(t *testing.T) {
	vs := nvmeVS()
	if d := volumeDrift(vs, nil); d != nil {
		t.Errorf("never created volume drifted: %+v", d)
	}
	vs.Status.ActualBytes = 8 << 20
	if d := volumeDrift(vs, nil); d == nil || d.Reason != DriftMissing {
		t.Errorf("missing: %+v", d)
	}
	if d := volumeDrift(vs, &backend.Volume{SizeBytes: 4 << 20}); d == nil || d.Reason != DriftResized {
		t.Errorf("shrunk: %+v", d)
	}
	if d := volumeDrift(vs, &backend.Volume{SizeBytes: 12 << 20}); d != nil {
		t.Errorf("grown by an expansion: %+v", d)
	}
}

func TestNewBackendKinds(t *testing.T) {
	store := func(b policyv1.Backend) *storev1.Store {
		s := &storev1.Store{}
		s.Name = "p.n"
		s.Spec.Backend = b
		return s
	}
	for _, tc := range []struct {
		b    policyv1.Backend
		want string
	}{
		{policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "vg0", ThinPool: &policyv1.ThinPool{Name: "tp"}}}, "*lvm.LVM"},
		{policyv1.Backend{File: &policyv1.FileBackend{Directory: t.TempDir()}}, "*file.File"},
		{policyv1.Backend{ZFS: &policyv1.ZFSBackend{Pool: "tank", ParentDataset: "k8s/volumes", VolBlockSize: "16K"}}, "*zfs.ZFS"},
	} {
		be, err := newBackend(store(tc.b), 0, "", nil)
		if err != nil || reflect.TypeOf(be).String() != tc.want {
			t.Errorf("newBackend(%s) = %T, %v; want %s", tc.b.Kind(), be, err, tc.want)
		}
	}
	if _, err := newBackend(store(policyv1.Backend{}), 0, "", nil); err == nil {
		t.Error("a Store without backend built a backend")
	}
	// an LVM cache on a node whose sysfs has no bcache: Ensure refuses before any command,
	// with the error the Store controller reports as Stalled, MissingKernelModules
	cached := policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "hdd", Cache: &policyv1.LVMCache{VolumeGroup: "ssd", Mode: policyv1.CacheModeWriteback, RatioPercent: 20}}}
	be, err := newBackend(store(cached), 0, t.TempDir(), func(name string, _ []string, _ time.Duration, _ error) { t.Errorf("ran %s", name) })
	if err != nil {
		t.Fatal(err)
	}
	if err := be.(ensurer).Ensure(t.Context()); !errors.Is(err, backend.ErrMissingKernelModule) {
		t.Errorf("Ensure of a cached store without bcache: %v, want ErrMissingKernelModule", err)
	}
	// the policy's values reach the backend: a bad mode is refused by lvm.New
	cached.LVM.Cache.Mode = "writeahead"
	if _, err := newBackend(store(cached), 0, "", nil); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("cache mode writeahead: %v", err)
	}
}

// A Store whose backing object vanished names it by its backend's own term and name.
func TestStoreMissingNamesTheBackendObject(t *testing.T) {
	missing := fmt.Errorf("gone: %w", backend.ErrNotFound)
	thinGone := fmt.Errorf("thin pool vg0/pool0: %w", backend.ErrNotFound)
	for _, tt := range []struct {
		name       string
		b          policyv1.Backend
		err        error
		kind, item string
	}{
		{"vg", policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "vg0", ThinPool: &policyv1.ThinPool{Name: "pool0"}}}, missing, KindVolumeGroup, "vg0"},
		{"thin pool", policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "vg0", ThinPool: &policyv1.ThinPool{Name: "pool0"}}}, thinGone, KindThinPool, "pool0"},
		{"zfs", policyv1.Backend{ZFS: &policyv1.ZFSBackend{Pool: "tank", ParentDataset: "k8s/vols"}}, missing, KindDataset, "tank/k8s/vols"},
		{"file", policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth"}}, missing, KindDirectory, "/var/lib/plinth"},
		{"raw", policyv1.Backend{Raw: &policyv1.RawBackend{Devices: []string{"/dev/vdb", "/dev/vdc"}}}, missing, KindDisk, "/dev/vdb,/dev/vdc"},
		{"cache vg", policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: "hdd", Cache: &policyv1.LVMCache{VolumeGroup: "ssd"}}}, fmt.Errorf("cache: volume group ssd: %w", backend.ErrNotFound), KindVolumeGroup, "ssd"},
	} {
		got := storeMissing(tt.b, tt.err)
		if got.Kind != tt.kind || got.Name != tt.item || got.Reason != DriftMissing || got.Message != tt.err.Error() {
			t.Errorf("%s: %+v, want kind %s name %s", tt.name, got, tt.kind, tt.item)
		}
	}
}
