package nvmet

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
)

// FuzzExportInspect writes arbitrary export specs (an NQN, a device path, an address and TCP
// port, host NQNs: what the agent takes from a VolumeState) into the configfs tree of
// kernelRulesFS and reads them back. Properties: no panic; a spec validateSpec refuses is an
// ErrInvalidNQN or ErrInvalidSpec error and touches nothing; an accepted spec exports without
// breaking a kernel rule, Inspect reads back exactly the subsystem, access list, namespace and
// port written, and a second Export changes nothing.
func FuzzExportInspect(f *testing.F) {
	f.Add("nqn.2026-01.dev.plinth:vol-1", testDev, "127.0.0.1", "4420", false, "")
	f.Add("nqn.2026-01.dev.plinth:vol-2", "/dev/zvol/tank/v/vol-2", "fd00::1", "4421", true, "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427")
	f.Add("nqn.2026-01.dev.plinth:vol-3", "/dev/x", "::ffff:10.0.0.1", "04420", true, "nqn.2026-01.io.example:host a")
	f.Add("nqn.2026-01.dev.plinth:../x", "relative", "host.example", "0", false, "nqn.2026-01.io.example:h")
	f.Fuzz(func(t *testing.T, nqn, dev, addr, svc string, acl bool, host string) {
		k := newKernelRulesFS(t)
		k.devices[dev] = true
		tg := New(k.root, WithFS(k))
		spec := ExportSpec{NQN: nqn, DevicePath: dev, Endpoint: Endpoint{Address: addr, ServiceID: svc}, ACL: acl}
		if acl && host != "" {
			spec.Hosts = []string{host}
		}
		ctx := context.Background()
		family, verr := validateSpec(spec)
		_, err := tg.Export(ctx, spec)
		if verr != nil {
			if err == nil || !(errors.Is(err, ErrInvalidNQN) || errors.Is(err, ErrInvalidSpec)) {
				t.Fatalf("Export of invalid spec %+v: %v, want ErrInvalidNQN or ErrInvalidSpec (%v)", spec, err, verr)
			}
			if ops := k.opsSnapshot(); len(ops) != 0 {
				t.Fatalf("Export of invalid spec %+v changed configfs: %v", spec, ops)
			}
			return
		}
		if err != nil {
			t.Fatalf("Export(%+v): %v", spec, err)
		}
		k.checkNoViolations(t)
		got, err := tg.Inspect(ctx, nqn)
		if err != nil {
			t.Fatalf("Inspect(%s): %v", nqn, err)
		}
		if got.NQN != nqn || got.Serial != DeriveIdentity(nqn).Serial || got.AllowAnyHost == acl || !slices.Equal(got.Hosts, spec.Hosts) {
			t.Fatalf("Inspect(%s) = %+v after Export(%+v)", nqn, got, spec)
		}
		id := DeriveIdentity(nqn)
		wantNS := []Namespace{{ID: NamespaceID, DevicePath: dev, UUID: id.UUID, NGUID: id.NGUID, Enabled: true}}
		if !reflect.DeepEqual(got.Namespaces, wantNS) {
			t.Fatalf("namespaces %+v, want %+v", got.Namespaces, wantNS)
		}
		want := Port{Transport: TransportTCP, Family: family, Address: addr, ServiceID: svc}
		if len(got.Ports) != 1 || !got.Ports[0].sameAddress(want) {
			t.Fatalf("ports %+v, want one listening on %+v", got.Ports, want)
		}
		res, err := tg.Export(ctx, spec)
		if err != nil || len(res.Changes) != 0 {
			t.Fatalf("second Export(%+v): changes %v, %v", spec, res.Changes, err)
		}
	})
}
