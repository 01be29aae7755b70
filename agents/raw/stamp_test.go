package raw

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/identity"
)

func testStamp(id string) identity.Stamp {
	return identity.Stamp{VolumeID: id, PVCNamespace: "shop", PVCName: "db-0", PVCUID: "u-1", PVName: "pvc-u-1",
		StorageClass: "plinth-raw", Placement: "raw", SizeBytes: 1 << 20, VolumeMode: "Block",
		PolicyDigest: "00112233445566778899aabbccddeeff", StoreUID: "store-1"}
}

func stampOfListed(t *testing.T, r *Raw, id string) backend.Volume {
	t.Helper()
	vols, err := r.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if v.ID == id {
			return v
		}
	}
	t.Fatalf("%s not listed", id)
	return backend.Volume{}
}

// The stamp lives in the disk's stamp area, one slot per partition number: written whole
// once (an unchanged stamp writes nothing), listed by Observe with one read per disk, torn
// when a byte changes, when the slot names another volume (a deleted partition's) or when a
// partition lies inside the area, and cleared when the volume is deleted.
func TestStampSlots(t *testing.T) {
	ctx := context.Background()
	f, cfg := newFake(t, map[string]int64{"/dev/null": 100 << 20})
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := vid(1), vid(2)
	for _, id := range []string{a, b} {
		if _, err := r.Create(ctx, id, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if v := stampOfListed(t, r, a); v.Stamp != nil || v.StampErr != nil {
		t.Fatalf("fresh volume: %+v, %v", v.Stamp, v.StampErr)
	}
	s := testStamp(a)
	if err := r.Stamp(ctx, s); err != nil {
		t.Fatal(err)
	}
	if f.opens[os.O_RDWR] != 1 {
		t.Fatalf("%d opens for writing, want 1", f.opens[os.O_RDWR])
	}
	if err := r.Stamp(ctx, s); err != nil || f.opens[os.O_RDWR] != 1 {
		t.Fatalf("same stamp again: %v, %d opens for writing (want no write)", err, f.opens[os.O_RDWR])
	}
	reads := f.opens[os.O_RDONLY]
	if v := stampOfListed(t, r, a); v.Stamp == nil || *v.Stamp != s || v.StampErr != nil {
		t.Fatalf("listed %+v, %v; want %+v", v.Stamp, v.StampErr, s)
	}
	if n := f.opens[os.O_RDONLY] - reads; n != 1 {
		t.Errorf("List opened the disk %d times, want once", n)
	}
	if got, err := r.ReadStamp(ctx, a); err != nil || got == nil || *got != s {
		t.Errorf("ReadStamp = %+v, %v", got, err)
	}
	// the slot on the disk: the magic line, the record, zeros
	img, _ := os.ReadFile(f.images["/dev/null"])
	text, _ := s.Text()
	slot := img[StampAreaOffset : StampAreaOffset+StampSlotBytes]
	if !strings.HasPrefix(string(slot), StampMagic+text) || strings.Trim(string(slot[len(StampMagic)+len(text):]), "\x00") != "" {
		t.Fatalf("slot 1 holds %q", strings.TrimRight(string(slot), "\x00"))
	}
	// a byte changed on the disk
	fh, _ := os.OpenFile(f.images["/dev/null"], os.O_RDWR, 0)
	fh.WriteAt([]byte("X"), StampAreaOffset+int64(len(StampMagic))+8)
	if v := stampOfListed(t, r, a); v.Stamp != nil || !errors.Is(v.StampErr, identity.ErrTorn) {
		t.Errorf("changed byte: %+v, %v; want ErrTorn", v.Stamp, v.StampErr)
	}
	// slot 2 holding a's stamp (left by a deleted partition of that number)
	fh.WriteAt([]byte(StampMagic+text), StampAreaOffset+StampSlotBytes)
	fh.Close()
	if v := stampOfListed(t, r, b); v.Stamp != nil || !errors.Is(v.StampErr, identity.ErrTorn) {
		t.Errorf("another volume's slot: %+v, %v; want ErrTorn", v.Stamp, v.StampErr)
	}
	if err := r.Stamp(ctx, testStamp(b)); err != nil {
		t.Fatal(err)
	}
	if v := stampOfListed(t, r, b); v.Stamp == nil || v.Stamp.VolumeID != b {
		t.Errorf("restamped: %+v, %v", v.Stamp, v.StampErr)
	}
	// deletion clears the slot
	if err := r.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	img, _ = os.ReadFile(f.images["/dev/null"])
	if strings.Trim(string(img[StampAreaOffset+StampSlotBytes:StampAreaOffset+2*StampSlotBytes]), "\x00") != "" {
		t.Error("slot 2 not cleared by Delete")
	}
	// errors
	if err := r.Stamp(ctx, testStamp(vid(9))); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("absent volume: %v", err)
	}
	bad := testStamp(a)
	bad.PVCUID = ""
	if err := r.Stamp(ctx, bad); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("half a claim: %v", err)
	}
	// a partition inside the area (a GPT made by another tool): no stamps on that disk
	tb := f.tables["/dev/null"]
	tb.Partitions[0].Start = 64
	if v := stampOfListed(t, r, a); v.Stamp != nil || v.StampErr == nil || !strings.Contains(v.StampErr.Error(), "inside the stamp area") {
		t.Errorf("partition in the area: %+v, %v", v.Stamp, v.StampErr)
	}
	if err := r.Stamp(ctx, s); err == nil {
		t.Error("stamped a disk whose partition lies in the stamp area")
	}
}

func TestDecodeSlot(t *testing.T) {
	id := vid(1)
	text, _ := testStamp(id).Text()
	full := func(b string) []byte { s := make([]byte, StampSlotBytes); copy(s, b); return s }
	for name, c := range map[string]struct {
		slot []byte
		want error
	}{
		"zeros":             {full(""), nil},
		"no magic":          {full(text), identity.ErrTorn},
		"cut short":         {full(StampMagic + text[:len(text)/2]), identity.ErrTorn},
		"bytes after a NUL": {append(full(StampMagic + text)[:StampSlotBytes-1], 'x'), identity.ErrTorn},
		"newer version":     {full(StampMagic + strings.Replace(text, "v=1\n", "v=2\n", 1)), identity.ErrUnknownVersion},
	} {
		got, err := decodeSlot(c.slot, id)
		if c.want == nil && (got != nil || err != nil) || c.want != nil && (got != nil || !errors.Is(err, c.want)) {
			t.Errorf("%s: %+v, %v; want %v", name, got, err, c.want)
		}
	}
}
