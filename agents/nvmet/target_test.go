package nvmet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

const (
	testDev  = "/dev/vg0/lv1"
	testDev2 = "/dev/vg0/lv2"
	hostA    = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a"
	hostB    = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b"
	hostC    = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000c"
)

var loopback = Endpoint{Address: "127.0.0.1", ServiceID: "4420"}

func volNQN(t testing.TB, id string) string {
	t.Helper()
	n, err := VolumeNQN(id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newTestTarget(t testing.TB) (*Target, *kernelRulesFS) {
	k := newKernelRulesFS(t)
	k.devices[testDev] = true
	k.devices[testDev2] = true
	t.Cleanup(func() { k.checkNoViolations(t) })
	return New(k.root, WithFS(k)), k
}

func mustExport(t testing.TB, tg *Target, spec ExportSpec) Result {
	t.Helper()
	res, err := tg.Export(context.Background(), spec)
	if err != nil {
		t.Fatalf("Export(%s): %v", spec.NQN, err)
	}
	return res
}

// indexOf returns the position of the first op with the prefix, failing when
// absent.
func indexOf(t testing.TB, ops []string, prefix string) int {
	t.Helper()
	for i, o := range ops {
		if strings.HasPrefix(o, prefix) {
			return i
		}
	}
	t.Fatalf("no op %q in %q", prefix, ops)
	return -1
}

func assertOrder(t testing.TB, ops []string, prefixes ...string) {
	t.Helper()
	last := -1
	for _, p := range prefixes {
		i := indexOf(t, ops, p)
		if i < last {
			t.Fatalf("op %q at %d comes before the previous one (at %d): %q", p, i, last, ops)
		}
		last = i
	}
}

func TestExportCreatesTreeInOrder(t *testing.T) {
	tg, k := newTestTarget(t)
	nqn := volNQN(t, "vol-1")
	res := mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: loopback})

	id := DeriveIdentity(nqn)
	s := "subsystems/" + nqn
	ns := s + "/namespaces/1"
	pid := fmt.Sprint(DerivePortID(Port{Transport: "tcp", Family: "ipv4", Address: "127.0.0.1", ServiceID: "4420"}))
	want := map[string]string{
		s + "/attr_allow_any_host":       "1",
		s + "/attr_serial":               id.Serial,
		ns + "/device_path":              testDev,
		ns + "/device_uuid":              id.UUID,
		ns + "/device_nguid":             id.NGUID,
		ns + "/enable":                   "1",
		"ports/" + pid + "/addr_trtype":  "tcp",
		"ports/" + pid + "/addr_adrfam":  "ipv4",
		"ports/" + pid + "/addr_traddr":  "127.0.0.1",
		"ports/" + pid + "/addr_trsvcid": "4420",
	}
	for path, v := range want {
		if got := k.read(path); got != v {
			t.Errorf("%s = %q, want %q", path, got, v)
		}
	}
	if !k.exists("ports/" + pid + "/subsystems/" + nqn) {
		t.Fatal("subsystem not linked into the port")
	}
	if res.Port.ID == 0 || fmt.Sprint(res.Port.ID) != pid || res.Port.Address != "127.0.0.1" {
		t.Fatalf("result port %+v", res.Port)
	}
	// Enable last of the namespace; port configured before the link; the
	// link after the namespace is enabled.
	assertOrder(t, k.opsSnapshot(),
		"mkdir "+s,
		"write "+s+"/attr_serial",
		"write "+s+"/attr_allow_any_host=1",
		"mkdir "+ns,
		"write "+ns+"/device_path",
		"write "+ns+"/device_uuid",
		"write "+ns+"/device_nguid",
		"write "+ns+"/enable=1",
		"mkdir ports/"+pid,
		"write ports/"+pid+"/addr_trsvcid",
		"symlink ports/"+pid+"/subsystems/"+nqn,
	)
	if k.held[testDev] != 1 {
		t.Fatalf("device held %d times", k.held[testDev])
	}
}

func TestExportIsIdempotent(t *testing.T) {
	tg, k := newTestTarget(t)
	spec := ExportSpec{NQN: volNQN(t, "vol-1"), DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: []string{hostA, hostB}}
	mustExport(t, tg, spec)
	k.resetOps()
	res := mustExport(t, tg, spec)
	if len(res.Changes) != 0 || len(k.opsSnapshot()) != 0 {
		t.Fatalf("second export changed %q (fs ops %q)", res.Changes, k.opsSnapshot())
	}
}

// A crash left the namespace enabled but no port link. Export converges
// without touching the namespace, a second Export is a no-op, EEXIST on the
// link counts as success, and the link is verified after creation.
func TestConvergesAfterCrashWithoutPortLink(t *testing.T) {
	tg, k := newTestTarget(t)
	nqn := volNQN(t, "vol-no-port-link")
	ep := Endpoint{Address: "127.0.0.1", ServiceID: "4420", PortID: 1}
	mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: ep})
	// The crash: namespace enabled, no ports/1/subsystems/N.
	if err := k.Unlink(filepath.Join(k.root, "ports/1/subsystems", nqn)); err != nil {
		t.Fatal(err)
	}
	k.resetOps()

	res := mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: ep})
	if !k.exists("ports/1/subsystems/" + nqn) {
		t.Fatal("link not recreated")
	}
	if want := []string{"symlink ports/1/subsystems/" + nqn}; !slices.Equal(k.opsSnapshot(), want) {
		t.Fatalf("ops %q, want only %q (namespace must stay enabled)", k.opsSnapshot(), want)
	}
	if res.Port.ID != 1 {
		t.Fatalf("port %+v", res.Port)
	}
	k.resetOps()
	if res := mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: ep}); len(res.Changes) != 0 {
		t.Fatalf("second export changed %q", res.Changes)
	}

	// The kernel answers EEXIST for a duplicate link (e.g. created by a
	// concurrent agent between our read and our symlink): success.
	if err := k.Symlink(filepath.Join(k.root, "subsystems", nqn), filepath.Join(k.root, "ports/1/subsystems", nqn)); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("duplicate port link: %v, want EEXIST", err)
	}
	k.inject = func(op, rel, _ string) error {
		if op == "symlink" && strings.HasPrefix(rel, "ports/") {
			return errno("symlink", rel, syscall.EEXIST)
		}
		return nil
	}
	if _, err := tg.Export(context.Background(), ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: ep}); err != nil {
		t.Fatalf("EEXIST on the port link must be success: %v", err)
	}

	// Post-condition: a link that the kernel "accepted" but is not there is
	// an error, never a silent success.
	k.inject = nil
	if err := k.Unlink(filepath.Join(k.root, "ports/1/subsystems", nqn)); err != nil {
		t.Fatal(err)
	}
	lying := &lyingSymlinkFS{kernelRulesFS: k}
	tg2 := New(k.root, WithFS(lying))
	if _, err := tg2.Export(context.Background(), ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: ep}); err == nil {
		t.Fatal("missing link after symlink must fail the post-condition")
	}
}

// lyingSymlinkFS reports success for symlinks without creating them.
type lyingSymlinkFS struct{ *kernelRulesFS }

func (l *lyingSymlinkFS) Symlink(string, string) error { return nil }

// TestConfigfsOrderingRules: a port is created and addressed before the first link, a live
// port's address is never rewritten (a new port is used), an enabled namespace is disabled
// to change its device, namespace ids 0 and 0xffffffff are refused, and a link whose bind
// fails is an error, not swallowed.
func TestConfigfsOrderingRules(t *testing.T) {
	ctx := context.Background()

	t.Run("1 link into port 7 that does not exist: created and addressed first", func(t *testing.T) {
		tg, k := newTestTarget(t)
		nqn := volNQN(t, "vol-1")
		mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: Endpoint{Address: "127.0.0.1", ServiceID: "4420", PortID: 7}})
		assertOrder(t, k.opsSnapshot(), "mkdir ports/7", "write ports/7/addr_trtype=tcp", "write ports/7/addr_adrfam=ipv4",
			"write ports/7/addr_traddr=127.0.0.1", "write ports/7/addr_trsvcid=4420", "symlink ports/7/subsystems/"+nqn)
	})

	t.Run("2 addr write on a live port is EACCES: never rewritten, a new port is used", func(t *testing.T) {
		tg, k := newTestTarget(t)
		n1, n2 := volNQN(t, "vol-1"), volNQN(t, "vol-2")
		mustExport(t, tg, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: Endpoint{Address: "127.0.0.1", ServiceID: "4420", PortID: 1}})
		mustExport(t, tg, ExportSpec{NQN: n2, DevicePath: testDev2, Endpoint: Endpoint{Address: "127.0.0.1", ServiceID: "4420", PortID: 1}})
		if err := k.WriteAttr(filepath.Join(k.root, "ports/1/addr_trsvcid"), "4421"); !errors.Is(err, syscall.EACCES) {
			t.Fatalf("kernel rule: addr write on enabled port = %v, want EACCES", err)
		}
		// Pinning port 1 to another address while in use: refused.
		_, err := tg.Export(ctx, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: Endpoint{Address: "127.0.0.1", ServiceID: "4421", PortID: 1}})
		if !errors.Is(err, ErrPortInUse) {
			t.Fatalf("explicit live port with another address: %v, want ErrPortInUse", err)
		}
		// Moving n1 to 4421 without a pinned id: a new port, old one keeps n2.
		k.resetOps()
		res := mustExport(t, tg, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: Endpoint{Address: "127.0.0.1", ServiceID: "4421"}})
		for _, o := range k.opsSnapshot() {
			if strings.HasPrefix(o, "write ports/1/") {
				t.Fatalf("live port rewritten: %q", k.opsSnapshot())
			}
		}
		if res.Port.ID == 1 || !k.exists(fmt.Sprintf("ports/%d/subsystems/%s", res.Port.ID, n1)) || k.exists("ports/1/subsystems/"+n1) {
			t.Fatalf("n1 not moved: port %+v ops %q", res.Port, k.opsSnapshot())
		}
		// Moving n2 too empties port 1, which is then removed.
		mustExport(t, tg, ExportSpec{NQN: n2, DevicePath: testDev2, Endpoint: Endpoint{Address: "127.0.0.1", ServiceID: "4421"}})
		if k.exists("ports/1") {
			t.Fatal("port 1 left behind without links")
		}
	})

	t.Run("3 device_path write while enabled is EBUSY: disable, write, enable", func(t *testing.T) {
		tg, k := newTestTarget(t)
		nqn := volNQN(t, "vol-1")
		mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: loopback})
		ns := "subsystems/" + nqn + "/namespaces/1"
		if err := k.WriteAttr(filepath.Join(k.root, ns, "device_path"), testDev2); !errors.Is(err, syscall.EBUSY) {
			t.Fatalf("kernel rule: device_path write while enabled = %v, want EBUSY", err)
		}
		k.resetOps()
		mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev2, Endpoint: loopback})
		want := []string{"write " + ns + "/enable=0", "write " + ns + "/device_path=" + testDev2, "write " + ns + "/enable=1"}
		if !slices.Equal(k.opsSnapshot(), want) {
			t.Fatalf("ops %q, want %q", k.opsSnapshot(), want)
		}
		if k.held[testDev] != 0 || k.held[testDev2] != 1 {
			t.Fatalf("held %v", k.held)
		}
		// Same path: the namespace is not bounced.
		k.resetOps()
		mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev2, Endpoint: loopback})
		if ops := k.opsSnapshot(); len(ops) != 0 {
			t.Fatalf("unchanged path bounced the namespace: %q", ops)
		}
	})

	t.Run("3b enabled between read and write: EBUSY handled", func(t *testing.T) {
		tg, k := newTestTarget(t)
		nqn := volNQN(t, "vol-1")
		ns := filepath.Join(k.root, "subsystems", nqn, "namespaces/1")
		// Pre-create a namespace with another path, disabled.
		mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: loopback})
		if err := k.WriteAttr(filepath.Join(ns, "enable"), "0"); err != nil {
			t.Fatal(err)
		}
		once := false
		k.inject = func(op, rel, _ string) error {
			if op == "write" && strings.HasSuffix(rel, "/device_path") && !once {
				once = true
				return errno("write", rel, syscall.EBUSY)
			}
			return nil
		}
		mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev2, Endpoint: loopback})
		if got := k.read("subsystems/" + nqn + "/namespaces/1/device_path"); got != testDev2 {
			t.Fatalf("device_path %q", got)
		}
	})

	t.Run("4 namespace 0 and 0xffffffff are EINVAL", func(t *testing.T) {
		tg, k := newTestTarget(t)
		nqn := volNQN(t, "vol-1")
		mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: loopback})
		for _, n := range []string{"0", "0xffffffff", "4294967295", "x"} {
			if err := k.Mkdir(filepath.Join(k.root, "subsystems", nqn, "namespaces", n)); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("mkdir namespaces/%s = %v, want EINVAL", n, err)
			}
		}
		if NamespaceID == 0 || NamespaceID == 0xffffffff {
			t.Fatal("NamespaceID must be a valid nsid")
		}
	})

	t.Run("5 link error (EADDRNOTAVAIL) is surfaced", func(t *testing.T) {
		tg, k := newTestTarget(t)
		k.unassigned["192.0.2.10"] = true
		_, err := tg.Export(ctx, ExportSpec{NQN: volNQN(t, "vol-1"), DevicePath: testDev, Endpoint: Endpoint{Address: "192.0.2.10", ServiceID: "4420", PortID: 2}})
		if !errors.Is(err, syscall.EADDRNOTAVAIL) {
			t.Fatalf("err = %v, want EADDRNOTAVAIL", err)
		}
		var ce *ConfigfsError
		if !errors.As(err, &ce) || !strings.HasSuffix(filepath.Dir(filepath.Dir(ce.Path)), "ports/2") {
			t.Fatalf("error does not carry the configfs path: %#v", err)
		}
		if k.exists("ports/2") {
			t.Fatal("unbindable port left behind")
		}
	})
}

func TestACLHosts(t *testing.T) {
	tg, k := newTestTarget(t)
	n1, n2 := volNQN(t, "vol-1"), volNQN(t, "vol-2")
	s1 := "subsystems/" + n1
	mustExport(t, tg, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: []string{hostA, hostB}})
	if k.read(s1+"/attr_allow_any_host") != "0" || !k.exists(s1+"/allowed_hosts/"+hostA) || !k.exists(s1+"/allowed_hosts/"+hostB) {
		t.Fatal("ACL not applied")
	}
	// Turn an open subsystem into an ACL'd one: allow_any_host=0 first.
	mustExport(t, tg, ExportSpec{NQN: n2, DevicePath: testDev2, Endpoint: loopback})
	k.resetOps()
	mustExport(t, tg, ExportSpec{NQN: n2, DevicePath: testDev2, Endpoint: loopback, ACL: true, Hosts: []string{hostB}})
	assertOrder(t, k.opsSnapshot(), "write subsystems/"+n2+"/attr_allow_any_host=0", "symlink subsystems/"+n2+"/allowed_hosts/"+hostB)

	// Reconcile the set: A removed (and hosts/A pruned), C added, B kept.
	k.resetOps()
	mustExport(t, tg, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: []string{hostB, hostC}})
	if k.exists(s1+"/allowed_hosts/"+hostA) || !k.exists(s1+"/allowed_hosts/"+hostC) || !k.exists(s1+"/allowed_hosts/"+hostB) {
		t.Fatalf("allowed hosts not reconciled: %q", k.opsSnapshot())
	}
	if k.exists("hosts/" + hostA) {
		t.Fatal("unreferenced hosts/A not removed")
	}
	// A revoked host keeps its live controllers unless the subsystem leaves its port: the
	// host link goes first, then the port link is dropped and made again (same port).
	pid := fmt.Sprint(DerivePortID(Port{Transport: "tcp", Family: "ipv4", Address: "127.0.0.1", ServiceID: "4420"}))
	plink := "ports/" + pid + "/subsystems/" + n1
	assertOrder(t, k.opsSnapshot(), "unlink "+s1+"/allowed_hosts/"+hostA, "unlink "+plink, "symlink "+plink)
	if !k.exists(plink) {
		t.Fatal("subsystem not linked into its port again after the revocation")
	}
	// Adding a host alone cuts nobody: no port link touched.
	k.resetOps()
	mustExport(t, tg, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: []string{hostA, hostB, hostC}})
	for _, op := range k.opsSnapshot() {
		if strings.Contains(op, plink) {
			t.Errorf("adding a host touched the port link: %q", k.opsSnapshot())
		}
	}
	mustExport(t, tg, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: []string{hostB, hostC}})
	// ACL off: links removed before allow_any_host=1; hosts/B stays (n2 uses it).
	k.resetOps()
	mustExport(t, tg, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: loopback})
	assertOrder(t, k.opsSnapshot(), "unlink "+s1+"/allowed_hosts/", "write "+s1+"/attr_allow_any_host=1")
	if !k.exists("hosts/"+hostB) || k.exists("hosts/"+hostC) {
		t.Fatalf("host pruning wrong: %q", k.opsSnapshot())
	}

	// The kernel rules the fake enforces.
	if err := k.Symlink(filepath.Join(k.root, "hosts", hostB), filepath.Join(k.root, s1, "allowed_hosts", hostB)); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("host link while allow_any_host=1 = %v, want EINVAL", err)
	}
	if err := k.Symlink(filepath.Join(k.root, "hosts", hostB), filepath.Join(k.root, "subsystems", n2, "allowed_hosts", hostB)); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("duplicate host link = %v, want EEXIST", err)
	}
	if err := k.WriteAttr(filepath.Join(k.root, "subsystems", n2, "attr_allow_any_host"), "1"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("allow_any_host=1 with hosts linked = %v, want EINVAL", err)
	}
}

func TestUnexportReleasesDeviceInOrder(t *testing.T) {
	ctx := context.Background()
	tg, k := newTestTarget(t)
	n1, n2 := volNQN(t, "vol-1"), volNQN(t, "vol-2")
	r1 := mustExport(t, tg, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: []string{hostA}})
	mustExport(t, tg, ExportSpec{NQN: n2, DevicePath: testDev2, Endpoint: loopback, ACL: true, Hosts: []string{hostA}})
	pid := fmt.Sprint(r1.Port.ID)

	k.resetOps()
	if err := tg.Unexport(ctx, n1); err != nil {
		t.Fatal(err)
	}
	s1 := "subsystems/" + n1
	want := []string{
		"unlink ports/" + pid + "/subsystems/" + n1,
		"write " + s1 + "/namespaces/1/enable=0",
		"rmdir " + s1 + "/namespaces/1",
		"unlink " + s1 + "/allowed_hosts/" + hostA,
		"rmdir " + s1,
	}
	if !slices.Equal(k.opsSnapshot(), want) {
		t.Fatalf("ops %q\nwant %q", k.opsSnapshot(), want)
	}
	if k.held[testDev] != 0 {
		t.Fatal("device still held after unexport")
	}
	if !k.exists("ports/"+pid) || !k.exists("hosts/"+hostA) {
		t.Fatal("shared port or host removed while still used by another subsystem")
	}
	if err := tg.Unexport(ctx, n2); err != nil {
		t.Fatal(err)
	}
	if k.exists("ports/"+pid) || k.exists("hosts/"+hostA) {
		t.Fatal("port or host left behind after the last subsystem")
	}
	if err := tg.Unexport(ctx, n2); err != nil {
		t.Fatalf("unexport of an absent subsystem: %v", err)
	}
	if ex, err := tg.List(ctx); err != nil || len(ex) != 0 {
		t.Fatalf("List after teardown = %v, %v", ex, err)
	}
}

func TestRevalidateSize(t *testing.T) {
	ctx := context.Background()
	tg, k := newTestTarget(t)
	nqn := volNQN(t, "vol-1")
	mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: loopback})
	if err := tg.RevalidateSize(ctx, nqn); err != nil {
		t.Fatal(err)
	}
	if n := k.revalidations[filepath.Join("subsystems", nqn, "namespaces", "1")]; n != 1 {
		t.Fatalf("revalidations = %d", n)
	}
	if err := k.WriteAttr(filepath.Join(k.root, "subsystems", nqn, "namespaces/1/enable"), "0"); err != nil {
		t.Fatal(err)
	}
	err := tg.RevalidateSize(ctx, nqn)
	var ce *ConfigfsError
	if !errors.Is(err, syscall.EINVAL) || !errors.As(err, &ce) || filepath.Base(ce.Path) != "revalidate_size" {
		t.Fatalf("revalidate on disabled namespace = %v, want EINVAL with path", err)
	}
}

func TestStableIdentityReplacesKernelDefaults(t *testing.T) {
	tg, k := newTestTarget(t)
	nqn := volNQN(t, "vol-1")
	ns := filepath.Join(k.root, "subsystems", nqn, "namespaces", "1")
	// Someone (an older agent, an admin) enabled the namespace with the
	// kernel's random uuid and zero nguid.
	for _, step := range []func() error{
		func() error { return k.Mkdir(filepath.Join(k.root, "subsystems", nqn)) },
		func() error { return k.Mkdir(ns) },
		func() error { return k.WriteAttr(filepath.Join(ns, "device_path"), testDev) },
		func() error { return k.WriteAttr(filepath.Join(ns, "enable"), "1") },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	mustExport(t, tg, ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: loopback})
	id := DeriveIdentity(nqn)
	if k.read("subsystems/"+nqn+"/namespaces/1/device_uuid") != id.UUID || k.read("subsystems/"+nqn+"/namespaces/1/enable") != "1" {
		t.Fatal("identity not converged")
	}
}

func TestSerialFrozenAfterDiscovery(t *testing.T) {
	tg, k := newTestTarget(t)
	nqn := volNQN(t, "vol-1")
	if err := k.Mkdir(filepath.Join(k.root, "subsystems", nqn)); err != nil {
		t.Fatal(err)
	}
	k.discovered[nqn] = true // a host identified it with the random serial
	_, err := tg.Export(context.Background(), ExportSpec{NQN: nqn, DevicePath: testDev, Endpoint: loopback})
	if !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "attr_serial") {
		t.Fatalf("err = %v, want EINVAL on attr_serial", err)
	}
}

func TestExportValidation(t *testing.T) {
	tg, k := newTestTarget(t)
	good := ExportSpec{NQN: volNQN(t, "vol-1"), DevicePath: testDev, Endpoint: loopback}
	tests := []struct {
		name   string
		mutate func(*ExportSpec)
		want   error
	}{
		{"224-byte NQN rejected before mkdir", func(s *ExportSpec) { s.NQN = "nqn.2026-01.dev.plinth:" + strings.Repeat("x", 224-23) }, ErrInvalidNQN},
		{"relative device", func(s *ExportSpec) { s.DevicePath = "vg0/lv1" }, ErrInvalidSpec},
		{"hostname address", func(s *ExportSpec) { s.Endpoint.Address = "node-1" }, ErrInvalidSpec},
		{"service id 0", func(s *ExportSpec) { s.Endpoint.ServiceID = "0" }, ErrInvalidSpec},
		{"service id text", func(s *ExportSpec) { s.Endpoint.ServiceID = "nvme" }, ErrInvalidSpec},
		{"hosts without ACL", func(s *ExportSpec) { s.Hosts = []string{hostA} }, ErrInvalidSpec},
		{"bad host NQN", func(s *ExportSpec) { s.ACL, s.Hosts = true, []string{"iqn.2026-01.x:y"} }, ErrInvalidNQN},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good
			tt.mutate(&s)
			if _, err := tg.Export(context.Background(), s); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	if ops := k.opsSnapshot(); len(ops) != 0 {
		t.Fatalf("invalid specs reached configfs: %q", ops)
	}
	// IPv6 endpoints get adrfam ipv6.
	res := mustExport(t, tg, ExportSpec{NQN: good.NQN, DevicePath: testDev, Endpoint: Endpoint{Address: "::1", ServiceID: "4420"}})
	if res.Port.Family != "ipv6" {
		t.Fatalf("family %q", res.Port.Family)
	}
}

func TestConcurrentExports(t *testing.T) {
	ctx := context.Background()
	tg, k := newTestTarget(t)
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	// Register every device before any export runs: the fake's device map is not
	// safe for a write while exports read it.
	for i := range n {
		k.devices[fmt.Sprintf("/dev/vg0/c%d", i)] = true
	}
	for i := range n {
		dev := fmt.Sprintf("/dev/vg0/c%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := tg.Export(ctx, ExportSpec{NQN: volNQN(t, fmt.Sprintf("vol-c%d", i)), DevicePath: dev, Endpoint: loopback, ACL: true, Hosts: []string{hostA}})
			errs <- err
		}()
	}
	// The same subsystem exported concurrently with two host sets: the result
	// is exactly one of them, never a mix.
	same := volNQN(t, "vol-same")
	sets := [][]string{{hostA, hostB}, {hostC}}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := tg.Export(ctx, ExportSpec{NQN: same, DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: sets[i%2]})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	list, err := tg.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n+1 {
		t.Fatalf("%d subsystems, want %d", len(list), n+1)
	}
	var portID uint16
	for _, e := range list {
		if len(e.Ports) != 1 || len(e.Namespaces) != 1 || !e.Namespaces[0].Enabled {
			t.Fatalf("export %s incomplete: %+v", e.NQN, e)
		}
		if portID == 0 {
			portID = e.Ports[0].ID
		}
		if e.Ports[0].ID != portID {
			t.Fatalf("exports on one address use several ports: %+v", list)
		}
		if e.NQN == same && !slices.Equal(e.Hosts, sets[0]) && !slices.Equal(e.Hosts, sets[1]) {
			t.Fatalf("lost update: hosts %q", e.Hosts)
		}
	}
	ports, _ := k.ReadDir(filepath.Join(k.root, "ports"))
	if len(ports) != 1 {
		t.Fatalf("ports %q, want one shared port", ports)
	}
}

func TestListAndInspect(t *testing.T) {
	ctx := context.Background()
	tg, _ := newTestTarget(t)
	n1, n2 := volNQN(t, "vol-1"), volNQN(t, "vol-2")
	mustExport(t, tg, ExportSpec{NQN: n2, DevicePath: testDev2, Endpoint: loopback, ACL: true, Hosts: []string{hostB, hostA}})
	r := mustExport(t, tg, ExportSpec{NQN: n1, DevicePath: testDev, Endpoint: loopback})
	got, err := tg.Inspect(ctx, n2)
	if err != nil {
		t.Fatal(err)
	}
	id := DeriveIdentity(n2)
	want := Export{
		NQN: n2, Serial: id.Serial, AllowAnyHost: false, Hosts: []string{hostA, hostB},
		Namespaces: []Namespace{{ID: 1, DevicePath: testDev2, UUID: id.UUID, NGUID: id.NGUID, Enabled: true}},
		Ports:      []Port{r.Port},
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("Inspect\n got %+v\nwant %+v", got, want)
	}
	list, err := tg.List(ctx)
	if err != nil || len(list) != 2 || list[0].NQN != n1 || !list[0].AllowAnyHost {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if _, err := tg.Inspect(ctx, volNQN(t, "vol-nope")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Inspect absent = %v", err)
	}
}

func TestLockHonoursContext(t *testing.T) {
	var km keyedMutex
	unlock, err := km.lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := km.lock(ctx, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("lock on cancelled ctx = %v", err)
	}
	if u2, err := km.lock(context.Background(), "b"); err != nil {
		t.Fatal(err)
	} else {
		u2()
	}
	unlock()
	if len(km.m) != 0 {
		t.Fatalf("lock entries leaked: %v", km.m)
	}
}

func TestConfigfsErrorWrapsPathAndErrno(t *testing.T) {
	err := wrap("write", "/x/enable", &fs.PathError{Op: "open", Path: "/x/enable", Err: syscall.EBUSY})
	var ce *ConfigfsError
	if !errors.As(err, &ce) || ce.Path != "/x/enable" || !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("%#v", err)
	}
	if got := err.Error(); got != "nvmet configfs write /x/enable: device or resource busy" {
		t.Fatalf("message %q", got)
	}
}
