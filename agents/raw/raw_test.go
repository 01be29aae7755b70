package raw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

func TestNames(t *testing.T) {
	for i := range 200 {
		id := backend.VolumeID(fmt.Sprintf("name-%d", i))
		name, err := PartitionName(id)
		if err != nil {
			t.Fatal(err)
		}
		guid, _ := PartitionGUID(id)
		// GPT names hold 36 UTF-16 units
		if len(name) != 36 || !regexp.MustCompile(`^[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}$`).MatchString(guid) {
			t.Fatalf("%s: name %q guid %q", id, name, guid)
		}
		if got, ok := VolumeIDOf(name, guid); !ok || got != id {
			t.Fatalf("VolumeIDOf(%q, %q) = %q, %v; want %s", name, guid, got, ok, id)
		}
		if got, ok := VolumeIDOf(name, strings.ToLower(guid)); !ok || got != id {
			t.Fatalf("lower-case GUID: %q, %v", got, ok)
		}
	}
	other, _ := PartitionGUID(backend.VolumeID("other"))
	name, _ := PartitionName(backend.VolumeID("name-1"))
	for _, c := range []struct{ name, guid string }{
		{name, other},            // digits the two share disagree
		{"data", other},          // not a volume name
		{name, "not-a-guid"},     // not a GUID
		{name[:35] + "G", other}, // not hex
	} {
		if id, ok := VolumeIDOf(c.name, c.guid); ok {
			t.Errorf("VolumeIDOf(%q, %q) = %q, want not Plinth's", c.name, c.guid, id)
		}
	}
	if _, err := PartitionName("vol-x"); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("PartitionName of a malformed id: %v", err)
	}
}

// The JSON of testdata was recorded from sfdisk 2.38.1 on a 96 MiB loop device: one Plinth
// partition (11 MiB at 1 MiB) and one of another (4 MiB at 21 MiB).
func TestParseTable(t *testing.T) {
	b, err := os.ReadFile("testdata/sfdisk-two.json")
	if err != nil {
		t.Fatal(err)
	}
	tb, err := parseTable(b)
	if err != nil {
		t.Fatal(err)
	}
	if tb.Label != "gpt" || tb.SectorSize != 512 || tb.FirstLBA != 2048 || tb.LastLBA != 196574 || len(tb.Partitions) != 2 {
		t.Fatalf("table %+v", tb)
	}
	p, q := tb.Partitions[0], tb.Partitions[1]
	if id, ok := p.mine(); !ok || id != backend.VolumeID("pvc-raw-1") || p.Number != 1 {
		t.Fatalf("first partition: %+v → %q, %v", p, id, ok)
	}
	if _, ok := q.mine(); ok || q.Number != 2 {
		t.Fatalf("second partition is not Plinth's: %+v", q)
	}
	// free: 12..21 MiB and 25 MiB..95 MiB (the last whole MiB before the backup GPT)
	want := []gap{{12 << 11, 9 << 11}, {25 << 11, 70 << 11}}
	if got := tb.gaps(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("gaps = %v, want %v", got, want)
	}
	if got := tb.after(p); got != 9<<11 {
		t.Fatalf("room after the first partition: %d sectors, want 9 MiB", got)
	}
	if got := tb.usable(); got != 94<<11 {
		t.Fatalf("usable: %d sectors, want 94 MiB", got)
	}
	for _, bad := range []string{``, `{}`, `{"partitiontable":{"unit":"bytes"}}`, `{"partitiontable":{"partitions":[{"node":"/dev/sdx"}]}}`} {
		if _, err := parseTable([]byte(bad)); err == nil {
			t.Errorf("parseTable(%q): no error", bad)
		}
	}
}

// FuzzParseTable: whatever sfdisk prints, parsing never panics, and what it accepts has
// numbered partitions sorted by start and free regions inside the usable area.
func FuzzParseTable(f *testing.F) {
	b, _ := os.ReadFile("testdata/sfdisk-two.json")
	f.Add(b)
	f.Add([]byte(`{"partitiontable":{"label":"gpt","firstlba":34,"lastlba":100,"sectorsize":4096}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tb, err := parseTable(data)
		if err != nil {
			return
		}
		for i, p := range tb.Partitions {
			if p.Number <= 0 || (i > 0 && tb.Partitions[i-1].Start > p.Start) {
				t.Fatalf("partitions %+v", tb.Partitions)
			}
		}
		if tb.SectorSize > AlignBytes || tb.LastLBA-tb.FirstLBA > 1<<40 {
			return // gaps of absurd tables are not checked
		}
		for _, g := range tb.gaps() {
			if g.Size <= 0 || g.Start < tb.FirstLBA || g.Start+g.Size > tb.LastLBA+1 {
				t.Fatalf("gap %+v outside [%d, %d]", g, tb.FirstLBA, tb.LastLBA)
			}
		}
	})
}

// fakeDisks stands in for sfdisk, partx, wipefs and blkid over in-memory GPTs and a fake
// sysfs tree (real runs: host_test.go on loop devices, and the guest suites).
type fakeDisks struct {
	t      *testing.T
	sys    string
	tables map[string]*table // by device
	calls  []string
	busy   map[string]bool // partition nodes partx -d refuses
	// images stand in for the disks' bytes (the identity stamp area): a sparse file per
	// device; opens counts OpenDevice calls by flag (os.O_RDONLY, os.O_RDWR).
	images map[string]string
	opens  map[int]int
}

func newFake(t *testing.T, devs map[string]int64) (*fakeDisks, Config) {
	sys := t.TempDir()
	f := &fakeDisks{t: t, sys: sys, tables: map[string]*table{}, busy: map[string]bool{}, images: map[string]string{}, opens: map[int]int{}}
	var list []string
	for dev, size := range devs {
		img := filepath.Join(sys, filepath.Base(dev)+".img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, size); err != nil {
			t.Fatal(err)
		}
		f.images[dev] = img
		if err := os.MkdirAll(filepath.Join(sys, "class", "block", filepath.Base(dev)), 0o755); err != nil {
			t.Fatal(err)
		}
		f.tables[dev] = &table{Label: "gpt", Device: dev, Unit: "sectors", FirstLBA: 2048, LastLBA: size/512 - 34, SectorSize: 512}
		list = append(list, dev)
	}
	return f, Config{Devices: list, SysDir: sys, Run: f.run, OpenDevice: f.open}
}

func (f *fakeDisks) open(dev string, flag int) (*os.File, error) {
	f.opens[flag]++
	return os.OpenFile(f.images[dev], flag, 0)
}

func (f *fakeDisks) run(_ context.Context, stdin []byte, name string, args ...string) ([]byte, []byte, int, error) {
	f.calls = append(f.calls, name+" "+strings.Join(args, " "))
	dev := args[len(args)-1]
	switch name {
	case "sfdisk":
		if args[0] == "--json" {
			b, _ := json.Marshal(map[string]any{"partitiontable": f.tables[dev]})
			return b, nil, 0, nil
		}
		if args[len(args)-3] == "--delete" {
			dev = args[len(args)-2]
			n, _ := strconv.Atoi(args[len(args)-1])
			tb := f.tables[dev]
			for i, p := range tb.Partitions {
				if p.Number == n {
					tb.Partitions = append(tb.Partitions[:i], tb.Partitions[i+1:]...)
					return nil, nil, 0, nil
				}
			}
			return nil, []byte("no partition"), 1, nil
		}
		kv := map[string]string{}
		for _, field := range strings.Split(strings.TrimSpace(string(stdin)), ", ") {
			k, v, _ := strings.Cut(field, "=")
			kv[k] = strings.Trim(v, `"`)
		}
		num := func(k string) int64 { n, _ := strconv.ParseInt(kv[k], 10, 64); return n }
		tb := f.tables[dev]
		for i, a := range args {
			if a == "-N" {
				n, _ := strconv.Atoi(args[i+1])
				for j := range tb.Partitions {
					if tb.Partitions[j].Number == n {
						tb.Partitions[j].Size = num("size")
					}
				}
				return nil, nil, 0, nil
			}
		}
		n := 1
		for used := true; used; {
			used = false
			for _, p := range tb.Partitions {
				if p.Number == n {
					n, used = n+1, true
				}
			}
		}
		tb.Partitions = append(tb.Partitions, partition{Number: n, Node: fmt.Sprintf("%sp%d", dev, n), Start: num("start"), Size: num("size"),
			Type: kv["type"], UUID: kv["uuid"], Name: kv["name"]})
		return nil, nil, 0, nil
	case "partx":
		n, _ := strconv.Atoi(args[2])
		kname := fmt.Sprintf("%sp%d", filepath.Base(dev), n)
		dir := filepath.Join(f.sys, "class", "block", filepath.Base(dev), kname)
		switch args[0] {
		case "-a", "-u":
			if err := os.MkdirAll(dir, 0o755); err != nil {
				f.t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "partition"), []byte(strconv.Itoa(n)+"\n"), 0o644); err != nil {
				f.t.Fatal(err)
			}
		case "-d":
			if f.busy[kname] {
				return nil, []byte(fmt.Sprintf("partx: %s: error deleting partition %d", dev, n)), 1, nil
			}
			os.RemoveAll(dir) //nolint:errcheck
		}
		return nil, nil, 0, nil
	case "wipefs", "blkid":
		return nil, nil, 0, nil
	}
	f.t.Fatalf("unexpected command %s %v", name, args)
	return nil, nil, 0, nil
}

func (f *fakeDisks) count(name string) int {
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, name) {
			n++
		}
	}
	return n
}

func TestCreateExpandDelete(t *testing.T) {
	ctx := context.Background()
	f, cfg := newFake(t, map[string]int64{"/dev/null": 100 << 20})
	cfg.ReserveBytes = 10 << 20
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.TotalBytes != 98<<20 || c.Available(cfg.ReserveBytes, 0) != 88<<20 {
		t.Fatalf("capacity %+v, available %d; want 98 MiB total, 88 MiB available", c, c.Available(cfg.ReserveBytes, 0))
	}
	a, err := r.Create(ctx, vid(1), 1)
	if err != nil {
		t.Fatal(err)
	}
	if a.SizeBytes != 1<<20 || a.DevicePath != "/dev/nullp1" {
		t.Fatalf("A = %+v, want 1 MiB at /dev/nullp1", a)
	}
	writes := f.count("sfdisk --quiet")
	if _, err := r.Create(ctx, vid(1), 1<<20); err != nil || f.count("sfdisk --quiet") != writes {
		t.Fatalf("Create again: %v, %d table writes (want none)", err, f.count("sfdisk --quiet")-writes)
	}
	// the reserve holds: 88 MiB available, 87 after A
	if _, err := r.Create(ctx, vid(2), 88<<20); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Fatalf("Create into the reserve: %v", err)
	}
	b, err := r.Create(ctx, vid(2), 20<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Expand(ctx, vid(1), 2<<20); !errors.Is(err, backend.ErrOutOfRange) {
		t.Fatalf("Expand A: %v, want ErrOutOfRange", err)
	}
	if _, err := r.Expand(ctx, vid(2), 90<<20); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Fatalf("Expand B into the reserve: %v, want ErrInsufficientCapacity", err)
	}
	if b2, err := r.Expand(ctx, vid(2), 30<<20); err != nil || b2.SizeBytes != 30<<20 || b2.DevicePath != b.DevicePath {
		t.Fatalf("Expand B = %+v, %v (B %+v)\n%s", b2, err, b, strings.Join(f.calls, "\n"))
	}
	f.busy["nullp2"] = true
	if err := r.Delete(ctx, vid(2)); !errors.Is(err, backend.ErrInUse) {
		t.Fatalf("Delete of a busy partition: %v", err)
	}
	if f.count("wipefs") != 0 || len(f.tables["/dev/null"].Partitions) != 2 {
		t.Fatalf("a busy partition was touched: %v", f.calls)
	}
	f.busy["nullp2"] = false
	if err := r.Delete(ctx, vid(2)); err != nil {
		t.Fatal(err)
	}
	if f.count("wipefs --all /dev/nullp2") != 1 || len(f.tables["/dev/null"].Partitions) != 1 {
		t.Fatalf("Delete: calls %v", f.calls)
	}
	vols, err := r.List(ctx)
	if err != nil || len(vols) != 1 || vols[0].ID != vid(1) {
		t.Fatalf("List = %+v, %v", vols, err)
	}
}

func TestNew(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Devices: []string{"vdb"}},
		{Devices: []string{"/dev/vdb", "/dev/vdb"}},
		{Devices: []string{"/dev/vdb"}, Partitioning: "MBR"},
	} {
		if _, err := New(cfg); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("New(%+v): %v, want ErrInvalidArgument", cfg, err)
		}
	}
}
