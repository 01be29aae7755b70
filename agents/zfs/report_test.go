package zfs

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// The testdata files are real output recorded in the qemu guest
// (test/kernel, OpenZFS 2.1.11 on Debian's 6.1 kernel) with the commands the
// backend runs; see testdata/README.md.

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseRecordedList(t *testing.T) {
	ds, err := ParseDatasets(readTestdata(t, "zfs-list-parent.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 4 {
		t.Fatalf("%d rows: %+v", len(ds), ds)
	}
	parent := ds[0]
	if parent.Name != "plinthz/k8s/volumes" || parent.Type != "filesystem" || parent.VolSizeBytes != 0 || parent.AvailableBytes <= 0 || parent.Managed != "" {
		t.Errorf("parent %+v", parent)
	}
	byName := map[string]Dataset{}
	for _, d := range ds[1:] {
		byName[strings.TrimPrefix(d.Name, "plinthz/k8s/volumes/")] = d
	}
	thick, sparse, foreign := byName[backend.VolumeID("rec-thick")], byName[backend.VolumeID("rec-sparse")], byName["foreign"]
	if !thick.IsVolume() || thick.Sparse() || thick.VolSizeBytes != 256<<20 || thick.VolBlockSizeBytes != 16384 ||
		thick.RefReservationBytes <= thick.VolSizeBytes || thick.UsedBytes < thick.RefReservationBytes || thick.Managed != ManagedValue {
		t.Errorf("thick %+v", thick)
	}
	if !sparse.Sparse() || sparse.VolSizeBytes != 4000006144 || sparse.UsedBytes >= sparse.VolSizeBytes || sparse.Managed != ManagedValue {
		t.Errorf("sparse %+v", sparse)
	}
	if foreign.Managed != "" || !foreign.IsVolume() {
		t.Errorf("foreign %+v", foreign)
	}
	// the stamp record.sh set with zfs set (its checksum computed by sha256sum) decodes as
	// this package writes it; an unstamped zvol has none
	id := backend.VolumeID("rec-thick")
	st, err := stampOf(thick, id)
	if err != nil || st == nil || st.VolumeID != id || st.SizeBytes != 256<<20 || st.VolumeMode != "Block" || st.StoreUID != "rec-store" {
		t.Errorf("recorded stamp %+v, %v", st, err)
	} else if line, _ := st.Line(); line != thick.Identity {
		t.Errorf("recorded stamp %q encodes as %q", thick.Identity, line)
	}
	if st, err := stampOf(sparse, backend.VolumeID("rec-sparse")); st != nil || err != nil || sparse.Identity != "" {
		t.Errorf("unstamped zvol: %+v, %v (%q)", st, err, sparse.Identity)
	}
	// The parent's used covers its children, a thick zvol's refreservation included.
	if parent.UsedBytes < thick.UsedBytes+sparse.UsedBytes+foreign.UsedBytes {
		t.Errorf("parent used %d < children", parent.UsedBytes)
	}
	// Capacity from this refresh.
	z, err := New(Config{Pool: "plinthz", ParentDataset: "k8s/volumes", Sparse: true})
	if err != nil {
		t.Fatal(err)
	}
	c := z.capacity(state{parent: parent, children: ds[1:]})
	if c.TotalBytes != parent.UsedBytes+parent.AvailableBytes || c.FreeBytes != parent.AvailableBytes ||
		c.ProvisionedBytes != thick.VolSizeBytes+sparse.VolSizeBytes || !c.Thin || c.DataUsedRatio <= 0 {
		t.Errorf("capacity %+v", c)
	}
	if l := len(z.listed(ds[1:])); l != 2 {
		t.Errorf("%d managed zvols, want 2 (foreign has no %s)", l, PropManaged)
	}
}

func TestParseRecordedPool(t *testing.T) {
	ps, err := ParsePools(readTestdata(t, "zpool-list.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].Name != "plinthz" || ps[0].Health != "ONLINE" || ps[0].SizeBytes <= 0 ||
		ps[0].AllocatedBytes+ps[0].FreeBytes != ps[0].SizeBytes {
		t.Errorf("pools %+v", ps)
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		"a\tvolume\t1\t2\t3\t4\t5\t6\t-",    // too few fields (no identity column)
		"\tvolume\t1\t2\t3\t4\t5\t6\t-",     // no name
		"a\tvolume\tx\t2\t3\t4\t5\t6\t-",    // not a number
		"a\tvolume\t-1\t2\t3\t4\t5\t6\t-",   // negative
		"a\tvolume\t1\t2\t3\t1.5G\t5\t6\t-", // human-readable (no -p)
	} {
		if _, err := ParseDatasets([]byte(in)); err == nil {
			t.Errorf("ParseDatasets(%q): no error", in)
		}
	}
	// a tab in a user property's value lands in the last column, whose stamp is then torn
	if ds, err := ParseDatasets([]byte("a\tvolume\t1\t2\t3\t4\t5\t6\tx\ty\tz\n")); err != nil || ds[0].Managed != "x" || ds[0].Identity != "y\tz" {
		t.Errorf("user property with a tab: %+v %v", ds, err)
	}
	if ds, err := ParseDatasets(nil); err != nil || len(ds) != 0 {
		t.Errorf("empty: %v %v", ds, err)
	}
	for _, in := range []string{"p\t1\t2\t3", "p\t1\t2\tx\tONLINE", "\t1\t2\t3\tONLINE"} {
		if _, err := ParsePools([]byte(in)); err == nil {
			t.Errorf("ParsePools(%q): no error", in)
		}
	}
}

// TestClassifyRecorded: the messages of testdata/stderr.txt, recorded in the
// guest, each prefixed with the typed error classify must give ("-" = none).
func TestClassifyRecorded(t *testing.T) {
	kinds := map[string]error{"-": nil, "NotFound": backend.ErrNotFound, "InUse": backend.ErrInUse,
		"AlreadyExists": backend.ErrAlreadyExists, "InsufficientCapacity": backend.ErrInsufficientCapacity,
		"InvalidArgument": backend.ErrInvalidArgument}
	n := 0
	for _, line := range lines(readTestdata(t, "stderr.txt")) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		kind, msg, ok := strings.Cut(line, "\t")
		want, known := kinds[kind]
		if !ok || !known {
			t.Fatalf("bad testdata line %q", line)
		}
		if got := classify(msg); !errors.Is(got, want) || (want == nil) != (got == nil) {
			t.Errorf("classify(%q) = %v, want %v", msg, got, want)
		}
		n++
	}
	if n < 5 {
		t.Errorf("only %d recorded messages", n)
	}
}

// BenchmarkParseDatasets: one refresh of a parent holding 1000 zvols.
func BenchmarkParseDatasets(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("tank/k8s\tfilesystem\t1000000\t2000000\t24576\t-\t-\t0\t-\n")
	for i := range 1000 {
		sb.WriteString("tank/k8s/" + backend.VolumeID(strings.Repeat("x", i)) + "\tvolume\t12288\t2000000\t12288\t4000006144\t16384\t0\ttrue\n")
	}
	in := []byte(sb.String())
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := ParseDatasets(in); err != nil {
			b.Fatal(err)
		}
	}
}

// SnapshotBytes is zfs usedbysnapshots from used, referenced and refreservation (zfsprops(7)).
func TestDatasetSnapshotBytes(t *testing.T) {
	const mib = int64(1) << 20
	tests := []struct {
		name string
		d    Dataset
		want int64
	}{
		{"sparse, no snapshot", Dataset{UsedBytes: 10 * mib, ReferencedBytes: 10 * mib}, 0},
		{"sparse, 3 MiB held by snapshots", Dataset{UsedBytes: 13 * mib, ReferencedBytes: 10 * mib}, 3 * mib},
		// Thick: 1 GiB refreservation, 10 MiB written, 3 MiB only in snapshots.
		{"thick, snapshots", Dataset{UsedBytes: 1024*mib + 3*mib, ReferencedBytes: 10 * mib, RefReservationBytes: 1024 * mib}, 3 * mib},
		{"thick, written past the refreservation", Dataset{UsedBytes: 30 * mib, ReferencedBytes: 25 * mib, RefReservationBytes: 20 * mib}, 5 * mib},
		{"inconsistent figures clamp at 0", Dataset{UsedBytes: 5 * mib, ReferencedBytes: 10 * mib}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.d.SnapshotBytes(); got != tt.want {
				t.Errorf("SnapshotBytes = %d, want %d", got, tt.want)
			}
		})
	}
}
