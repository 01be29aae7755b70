package zfs

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/identity"
)

func testStamp(id string) identity.Stamp {
	return identity.Stamp{VolumeID: id, PVCNamespace: "shop", PVCName: "db-0", PVCUID: "u-1", PVName: "pvc-u-1",
		StorageClass: "plinth-zfs", Placement: "zfs", SizeBytes: 1 << 30, Filesystem: "ext4", VolumeMode: "Filesystem",
		PolicyDigest: "00112233445566778899aabbccddeeff", StoreUID: "store-1"}
}

// A stamp is one `zfs set` of one property, read back from the refresh's one `zfs list`; an
// unchanged stamp runs nothing; a stamp naming another volume, or an unknown version, is
// reported as unreadable, never as the zvol's.
func TestStampIsOnePropertyReadByTheList(t *testing.T) {
	ctx := context.Background()
	f := newFake("tank/k8s/volumes", 20<<30)
	z := newTestZFS(t, f, Config{VolBlockSize: 16 << 10, Sparse: true})
	id, other := backend.VolumeID("a"), backend.VolumeID("b")
	for _, v := range []string{id, other} {
		if _, err := z.Create(ctx, v, 1<<30); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := z.ReadStamp(ctx, id); got != nil || err != nil {
		t.Fatalf("fresh zvol: stamp %+v, %v", got, err)
	}
	s := testStamp(id)
	line, _ := s.Line()
	f.calls = nil
	if err := z.Stamp(ctx, s); err != nil {
		t.Fatal(err)
	}
	want := "zfs set " + PropIdentity + "=" + line + " tank/k8s/volumes/" + id
	if len(f.calls) != 2 || f.calls[1] != want {
		t.Fatalf("calls %q, want a zfs list then %q", f.calls, want)
	}
	f.calls = nil
	if err := z.Stamp(ctx, s); err != nil || len(f.calls) != 1 {
		t.Fatalf("same stamp again: %v, calls %q (want one zfs list, no set)", err, f.calls)
	}
	f.calls = nil
	_, vols, err := z.Observe(ctx)
	if err != nil || len(f.calls) != 1 {
		t.Fatalf("Observe: %v, calls %q", err, f.calls)
	}
	for _, v := range vols {
		switch v.ID {
		case id:
			if v.Stamp == nil || *v.Stamp != s || v.StampErr != nil {
				t.Errorf("listed stamp %+v, %v; want %+v", v.Stamp, v.StampErr, s)
			}
		case other:
			if v.Stamp != nil || v.StampErr != nil {
				t.Errorf("unstamped zvol listed with %+v, %v", v.Stamp, v.StampErr)
			}
		}
	}
	if got, err := z.ReadStamp(ctx, id); err != nil || got == nil || *got != s {
		t.Errorf("ReadStamp = %+v, %v", got, err)
	}

	// another volume's stamp (inherited from the parent, copied by hand), a newer version
	f.vols["tank/k8s/volumes/"+other].Identity = line
	if got, err := z.ReadStamp(ctx, other); got != nil || !errors.Is(err, identity.ErrTorn) {
		t.Errorf("stamp of another volume: %+v, %v; want ErrTorn", got, err)
	}
	f.vols["tank/k8s/volumes/"+other].Identity = strings.Replace(line, "v=1", "v=2", 1)
	if got, err := z.ReadStamp(ctx, other); got != nil || !errors.Is(err, identity.ErrUnknownVersion) {
		t.Errorf("newer stamp: %+v, %v; want ErrUnknownVersion", got, err)
	}
	// a stamp cannot be written onto a zvol that is not there, nor an invalid one
	if err := z.Stamp(ctx, testStamp(backend.VolumeID("absent"))); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("absent zvol: %v", err)
	}
	bad := testStamp(id)
	bad.PVCUID = ""
	if err := z.Stamp(ctx, bad); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("half a claim: %v", err)
	}
	// the policy may not set the stamp's property
	if _, err := New(Config{Pool: "tank", Properties: map[string]string{PropIdentity: "x"}}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("policy property %s accepted: %v", PropIdentity, err)
	}
}
