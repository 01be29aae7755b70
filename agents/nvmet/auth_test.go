package nvmet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

const (
	keyA  = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
	keyA2 = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:"
	ctrlA = "DHHC-1:00:aMEiHojvnlvfsiyqrYhzNfZsEEQ+uy63oD7L7AZE8b+GHLP0:"
)

// An export with authentication writes each host's settings and key into its host entry
// before the host is linked into allowed_hosts, never shows a key in its changes, converges a
// changed key on a host already linked, and reads the entry back in Inspect.
func TestExportWithHostAuth(t *testing.T) {
	tg, k := newTestTarget(t)
	k.auth = true
	n := volNQN(t, "vol-auth")
	spec := ExportSpec{NQN: n, DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: []string{hostA},
		HostAuth: map[string]HostAuth{hostA: {Key: keyA, CtrlKey: ctrlA, Hash: "hmac(sha384)", DHGroup: "ffdhe2048"}}}
	res := mustExport(t, tg, spec)
	for _, c := range res.Changes {
		if strings.Contains(c, "DHHC-1") {
			t.Errorf("a change shows a secret: %s", c)
		}
	}
	assertOrder(t, k.opsSnapshot(), "write hosts/"+hostA+"/dhchap_hash=hmac(sha384)", "write hosts/"+hostA+"/dhchap_dhgroup=ffdhe2048",
		"write hosts/"+hostA+"/dhchap_ctrl_key=", "write hosts/"+hostA+"/dhchap_key=", "symlink subsystems/"+n+"/allowed_hosts/"+hostA)
	if got := k.read("hosts/" + hostA + "/dhchap_key"); got != keyA {
		t.Errorf("dhchap_key = %q", got)
	}
	e, err := tg.Inspect(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	if !AuthMatches(spec.HostAuth[hostA], e.HostAuth[hostA]) {
		t.Error("Inspect: the host entry does not match what was written")
	}
	// unchanged: no write at all
	k.resetOps()
	if res := mustExport(t, tg, spec); len(res.Changes) != 0 {
		t.Errorf("second export changed %q", res.Changes)
	}
	// a new key (rotation) on the linked host: written, nothing else touched
	spec.HostAuth = map[string]HostAuth{hostA: {Key: keyA2, CtrlKey: ctrlA, Hash: "hmac(sha384)", DHGroup: "ffdhe2048"}}
	k.resetOps()
	res = mustExport(t, tg, spec)
	if len(res.Changes) != 1 || !strings.HasSuffix(res.Changes[0], "/dhchap_key=<secret>") {
		t.Errorf("rotation changes %q, want only the key", res.Changes)
	}
	if got := k.read("hosts/" + hostA + "/dhchap_key"); got != keyA2 {
		t.Errorf("dhchap_key after rotation = %q", got)
	}
}

// On a kernel without target authentication the export fails before the host is linked: a
// volume that asks for authentication is never served without it.
func TestExportWithHostAuthUnsupported(t *testing.T) {
	tg, k := newTestTarget(t)
	n := volNQN(t, "vol-auth")
	_, err := tg.Export(context.Background(), ExportSpec{NQN: n, DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: []string{hostA},
		HostAuth: map[string]HostAuth{hostA: {Key: keyA}}})
	if !errors.Is(err, ErrAuthUnsupported) {
		t.Fatalf("export = %v, want ErrAuthUnsupported", err)
	}
	if k.exists("subsystems/" + n + "/allowed_hosts/" + hostA) {
		t.Error("the host was allowed without authentication")
	}
	if k.exists("hosts/" + hostA) {
		t.Error("the host entry made for the key was left behind")
	}
	pid := fmt.Sprint(DerivePortID(Port{Transport: "tcp", Family: "ipv4", Address: "127.0.0.1", ServiceID: "4420"}))
	if k.exists("ports/" + pid + "/subsystems/" + n) {
		t.Error("the subsystem was linked into its port")
	}
}

func TestExportHostAuthValidation(t *testing.T) {
	tg, _ := newTestTarget(t)
	n := volNQN(t, "vol-auth")
	for name, spec := range map[string]ExportSpec{
		"without ACL":      {NQN: n, DevicePath: testDev, Endpoint: loopback, HostAuth: map[string]HostAuth{}},
		"host without key": {NQN: n, DevicePath: testDev, Endpoint: loopback, ACL: true, Hosts: []string{hostA}, HostAuth: map[string]HostAuth{hostB: {Key: keyA}}},
	} {
		if _, err := tg.Export(context.Background(), spec); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: %v, want ErrInvalidSpec", name, err)
		}
	}
}
