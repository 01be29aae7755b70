package zfs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// fakeZFS answers zfs/zpool from an in-memory parent dataset and records
// every command; it stands in for the real tools in unit tests (they run for
// real in the guest tests, and their recorded output is in testdata/).
type fakeZFS struct {
	parent    string
	avail     int64 // parent available before reservations
	parentUse int64
	vols      map[string]*Dataset
	calls     []string
	fail      map[string]string // "zfs create" / "zfs set" ... → stderr, exit 1
	snaps     *fakeSnapshots    // snapshot_test.go; nil: no snapshots
}

func newFake(parent string, avail int64) *fakeZFS {
	return &fakeZFS{parent: parent, avail: avail, parentUse: 200 << 10, vols: map[string]*Dataset{}}
}

func (f *fakeZFS) row(d Dataset) string {
	m := d.Managed
	if m == "" {
		m = "-"
	}
	dash := func(n int64) string {
		if d.Type != "volume" {
			return "-"
		}
		return strconv.FormatInt(n, 10)
	}
	id := d.Identity
	if id == "" {
		id = "-"
	}
	return strings.Join([]string{d.Name, d.Type, strconv.FormatInt(d.UsedBytes, 10), strconv.FormatInt(d.AvailableBytes, 10),
		strconv.FormatInt(d.ReferencedBytes, 10), dash(d.VolSizeBytes), dash(d.VolBlockSizeBytes), strconv.FormatInt(d.RefReservationBytes, 10), m, id}, "\t")
}

func (f *fakeZFS) reserved() int64 {
	var r int64
	for _, v := range f.vols {
		r += v.RefReservationBytes
	}
	return r
}

func (f *fakeZFS) run(_ context.Context, name string, args ...string) ([]byte, []byte, int, error) {
	f.calls = append(f.calls, name+" "+strings.Join(args, " "))
	if len(args) > 0 {
		if se, ok := f.fail[name+" "+args[0]]; ok {
			return nil, []byte(se), 1, nil
		}
	}
	if out, se, code, ok := f.snapshotCommand(name, args); ok {
		return out, se, code, nil
	}
	target := args[len(args)-1]
	switch name + " " + args[0] {
	case "zpool list":
		return []byte("tank\t2013265920\t26762240\t1986503680\tONLINE\n"), nil, 0, nil
	case "zfs list":
		var rows []string
		if target == f.parent {
			rows = append(rows, f.row(Dataset{Name: f.parent, Type: "filesystem", UsedBytes: f.parentUse + f.reserved(), AvailableBytes: f.avail - f.reserved(), ReferencedBytes: 24576}))
			var names []string
			for n := range f.vols {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				rows = append(rows, f.row(*f.vols[n]))
			}
		} else if v, ok := f.vols[target]; ok {
			rows = append(rows, f.row(*v))
		} else {
			return nil, []byte(fmt.Sprintf("cannot open '%s': dataset does not exist", target)), 1, nil
		}
		return []byte(strings.Join(rows, "\n") + "\n"), nil, 0, nil
	case "zfs create":
		if args[1] == "-p" {
			return nil, nil, 0, nil
		}
		d := &Dataset{Name: target, Type: "volume", UsedBytes: 12288, ReferencedBytes: 12288}
		sparse := false
		for i := 1; i < len(args)-1; i++ {
			switch args[i] {
			case "-V":
				d.VolSizeBytes, _ = strconv.ParseInt(args[i+1], 10, 64)
			case "-b":
				d.VolBlockSizeBytes, _ = strconv.ParseInt(args[i+1], 10, 64)
			case "-s":
				sparse = true
			case "-o":
				if k, v, _ := strings.Cut(args[i+1], "="); k == PropManaged {
					d.Managed = v
				}
			}
		}
		if d.VolSizeBytes%d.VolBlockSizeBytes != 0 {
			return nil, []byte("cannot create '" + target + "': volume size must be a multiple of volume block size"), 1, nil
		}
		if !sparse {
			d.RefReservationBytes = d.VolSizeBytes + d.VolSizeBytes/64
			if d.RefReservationBytes > f.avail-f.reserved() {
				return nil, []byte("cannot create '" + target + "': out of space"), 1, nil
			}
			d.UsedBytes = d.RefReservationBytes
		}
		f.vols[target] = d
		return nil, nil, 0, nil
	case "zfs set":
		v := f.vols[target]
		if val, ok := strings.CutPrefix(args[1], PropIdentity+"="); ok {
			v.Identity = val
			return nil, nil, 0, nil
		}
		size, _ := strconv.ParseInt(strings.TrimPrefix(args[1], "volsize="), 10, 64)
		if v.RefReservationBytes > 0 {
			res := size + size/64
			if res-v.RefReservationBytes > f.avail-f.reserved() {
				return nil, []byte("cannot set property for '" + target + "': out of space"), 1, nil
			}
			v.RefReservationBytes, v.UsedBytes = res, res
		}
		v.VolSizeBytes = size
		return nil, nil, 0, nil
	case "zfs destroy":
		delete(f.vols, target)
		return nil, nil, 0, nil
	}
	return nil, []byte("unexpected command"), 2, nil
}

func newTestZFS(t *testing.T, f *fakeZFS, cfg Config) *ZFS {
	t.Helper()
	cfg.Pool, cfg.ParentDataset, cfg.Run = "tank", "k8s/volumes", f.run
	cfg.DevDir = t.TempDir()
	z, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// TestVolSizeRoundsUpToVolBlockSize: volsize rounded UP to a multiple of volblocksize; the
// caller honours limit_bytes with the same rounding (ExtentBytes) before calling Create.
func TestVolSizeRoundsUpToVolBlockSize(t *testing.T) {
	ctx := context.Background()
	f := newFake("tank/k8s/volumes", 20<<30)
	z := newTestZFS(t, f, Config{VolBlockSize: 16 << 10})
	id := backend.VolumeID("decimal-4g")
	v, err := z.Create(ctx, id, 4000000000)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 4000006144 || v.SizeBytes%16384 != 0 {
		t.Errorf("size %d, want 4000006144", v.SizeBytes)
	}
	if want := "zfs create -V 4000006144 -b 16384 -o plinth.dev:managed=true tank/k8s/volumes/" + id; !contains(f.calls, want) {
		t.Errorf("calls %q, want %q", f.calls, want)
	}
	c, err := z.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// second input: limit_bytes 4000000000 — the rounded size exceeds it (OUT_OF_RANGE at the CSI edge).
	if got := backend.RoundUp(4000000000, c.ExtentBytes); got <= 4000000000 {
		t.Errorf("limit check: rounded %d", got)
	}
	// Repeat (retry after a lost reply): same volume, no new command.
	n := len(f.calls)
	if v2, err := z.Create(ctx, id, 4000000000); err != nil || v2 != v {
		t.Errorf("repeat: %+v %v", v2, err)
	}
	if len(f.calls) != n+1 {
		t.Errorf("repeat ran %q", f.calls[n:])
	}
}

func TestCreateThickThin(t *testing.T) {
	ctx := context.Background()
	f := newFake("tank/k8s/volumes", 10<<30)
	thick := newTestZFS(t, f, Config{ReserveBytes: 1 << 30, Properties: map[string]string{"compression": "lz4", "com.example:team": "a"}})
	id := backend.VolumeID("thick")
	v, err := thick.Create(ctx, id, 1<<30)
	if err != nil || v.Thin || v.SizeBytes != 1<<30 || v.Name != "tank/k8s/volumes/"+id || v.ID != id {
		t.Fatalf("thick: %+v %v", v, err)
	}
	if want := "zfs create -V 1073741824 -b 16384 -o plinth.dev:managed=true -o com.example:team=a -o compression=lz4 tank/k8s/volumes/" + id; !contains(f.calls, want) {
		t.Errorf("calls %q", f.calls)
	}
	c, _ := thick.Capacity(ctx)
	if c.Thin || c.ProvisionedBytes != 1<<30 || c.FreeBytes != 10<<30-(1<<30+1<<30/64) || c.TotalBytes != 10<<30+200<<10 || c.ExtentBytes != 16384 {
		t.Errorf("thick capacity %+v", c)
	}
	// The reserve is honoured before zfs runs.
	n := len(f.calls)
	if _, err := thick.Create(ctx, backend.VolumeID("big"), 8<<30); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Errorf("over reserve: %v", err)
	}
	if len(f.calls) != n+1 {
		t.Errorf("zfs create ran: %q", f.calls[n:])
	}

	sparse := newTestZFS(t, f, Config{Sparse: true, OvercommitPercent: 300})
	ids := backend.VolumeID("sparse")
	vs, err := sparse.Create(ctx, ids, 15<<30)
	if err != nil || !vs.Thin {
		t.Fatalf("sparse: %+v %v", vs, err)
	}
	if !strings.Contains(f.calls[len(f.calls)-2], " -s ") {
		t.Errorf("no -s: %q", f.calls[len(f.calls)-2])
	}
	cs, _ := sparse.Capacity(ctx)
	if !cs.Thin || cs.ProvisionedBytes != 16<<30 || cs.DataUsedRatio <= 0 {
		t.Errorf("sparse capacity %+v", cs)
	}
	if _, err := sparse.Create(ctx, backend.VolumeID("s2"), 20<<30); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Errorf("overcommit bound: %v", err)
	}
	l, err := sparse.List(ctx)
	if err != nil || len(l) != 2 {
		t.Errorf("list %+v %v", l, err)
	}
}

func TestAdoptForeignAndDelete(t *testing.T) {
	ctx := context.Background()
	f := newFake("tank/k8s/volumes", 10<<30)
	z := newTestZFS(t, f, Config{})
	idC, idF := backend.VolumeID("crash"), backend.VolumeID("foreign")
	f.vols["tank/k8s/volumes/"+idC] = &Dataset{Name: "tank/k8s/volumes/" + idC, Type: "volume", VolSizeBytes: 1 << 20, VolBlockSizeBytes: 16384, Managed: ManagedValue}
	f.vols["tank/k8s/volumes/"+idF] = &Dataset{Name: "tank/k8s/volumes/" + idF, Type: "volume", VolSizeBytes: 1 << 20, VolBlockSizeBytes: 16384}
	f.vols["tank/k8s/volumes/other"] = &Dataset{Name: "tank/k8s/volumes/other", Type: "volume", VolSizeBytes: 1 << 20, Managed: ManagedValue}
	if v, err := z.Create(ctx, idC, 1<<20); err != nil || v.SizeBytes != 1<<20 {
		t.Errorf("adopt: %+v %v", v, err)
	}
	if _, err := z.Create(ctx, idC, 2<<20); !errors.Is(err, backend.ErrAlreadyExists) {
		t.Errorf("adopt smaller: %v", err)
	}
	if _, err := z.Create(ctx, idF, 1<<20); !errors.Is(err, backend.ErrAlreadyExists) {
		t.Errorf("foreign: %v", err)
	}
	if l, _ := z.List(ctx); len(l) != 1 || l[0].ID != idC {
		t.Errorf("list must hold only Plinth's zvol: %+v", l)
	}
	if _, err := z.Get(ctx, idF); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("get foreign: %v", err)
	}
	if err := z.Delete(ctx, idF); err != nil || f.vols["tank/k8s/volumes/"+idF] == nil {
		t.Errorf("foreign deleted: %v", err)
	}
	if err := z.Delete(ctx, idC); err != nil || f.vols["tank/k8s/volumes/"+idC] != nil {
		t.Errorf("delete: %v", err)
	}
	if err := z.Delete(ctx, idC); err != nil {
		t.Errorf("delete absent: %v", err)
	}
	f.vols["tank/k8s/volumes/"+idC] = &Dataset{Name: "tank/k8s/volumes/" + idC, Type: "volume", VolSizeBytes: 1 << 20, Managed: ManagedValue}
	f.fail = map[string]string{"zfs destroy": "cannot destroy 'tank/k8s/volumes/" + idC + "': dataset is busy"}
	err := z.Delete(ctx, idC)
	var ce *backend.CommandError
	if !errors.Is(err, backend.ErrInUse) || !errors.As(err, &ce) || !strings.Contains(err.Error(), "zfs destroy tank/k8s/volumes/"+idC) || !strings.Contains(err.Error(), "dataset is busy") {
		t.Errorf("busy delete: %v", err)
	}
}

func TestExpand(t *testing.T) {
	ctx := context.Background()
	f := newFake("tank/k8s/volumes", 4<<30)
	z := newTestZFS(t, f, Config{VolBlockSize: 8192})
	id := backend.VolumeID("grow")
	if _, err := z.Create(ctx, id, 1<<30); err != nil {
		t.Fatal(err)
	}
	v, err := z.Expand(ctx, id, 2<<30+1)
	if err != nil || v.SizeBytes != 2<<30+8192 {
		t.Fatalf("expand: %+v %v", v, err)
	}
	if v, err := z.Expand(ctx, id, 1<<30); err != nil || v.SizeBytes != 2<<30+8192 {
		t.Errorf("no shrink: %+v %v", v, err)
	}
	if _, err := z.Expand(ctx, id, 100<<30); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Errorf("expand beyond: %v", err)
	}
	// ZFS's own refusal (the refreservation's metadata share): properties unchanged.
	before := *f.vols["tank/k8s/volumes/"+id]
	c, _ := z.Capacity(ctx)
	_, err = z.Expand(ctx, id, before.VolSizeBytes+c.FreeBytes/8192*8192)
	if !errors.Is(err, backend.ErrInsufficientCapacity) || !strings.Contains(err.Error(), "zfs set volsize=") || !strings.Contains(err.Error(), "out of space") {
		t.Errorf("zfs refusal: %v", err)
	}
	if after := *f.vols["tank/k8s/volumes/"+id]; after != before {
		t.Errorf("properties changed: %+v → %+v", before, after)
	}
	if _, err := z.Expand(ctx, backend.VolumeID("none"), 1); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("expand absent: %v", err)
	}
}

func TestEnsureAndErrors(t *testing.T) {
	ctx := context.Background()
	f := newFake("tank/k8s/volumes", 1<<30)
	f.fail = map[string]string{"zfs list": "cannot open 'tank/k8s/volumes': dataset does not exist"}
	z := newTestZFS(t, f, Config{})
	if _, err := z.Capacity(ctx); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("missing parent: %v", err)
	}
	// Ensure: zpool list, zfs list (missing), zfs create -p.
	f.calls = nil
	z.cfg.Run = func(ctx context.Context, name string, args ...string) ([]byte, []byte, int, error) {
		o, e, c, err := f.run(ctx, name, args...)
		if name == "zfs" && args[0] == "create" {
			delete(f.fail, "zfs list")
		}
		return o, e, c, err
	}
	if err := z.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"zpool list -Hp -o name,size,allocated,free,health tank",
		"zfs list -Hp -o name,type,used,available,referenced,volsize,volblocksize,refreservation,plinth.dev:managed,plinth.dev:identity -t filesystem,volume -d 1 tank/k8s/volumes",
		"zfs create -p tank/k8s/volumes"}
	if strings.Join(f.calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("Ensure ran\n%s\nwant\n%s", strings.Join(f.calls, "\n"), strings.Join(want, "\n"))
	}
	if err := z.Ensure(ctx); err != nil {
		t.Errorf("second Ensure: %v", err)
	}
	for _, bad := range []Config{{Pool: "tank", VolBlockSize: 1000}, {Pool: "tank", Properties: map[string]string{"volsize": "1"}}, {Pool: "1x"}} {
		if _, err := New(bad); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("New(%+v): %v", bad, err)
		}
	}
	if _, err := z.Create(ctx, "pvc-1", 1); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("bad id: %v", err)
	}
	if _, err := z.Create(ctx, backend.VolumeID("a"), 0); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("zero size: %v", err)
	}
}

func TestClassify(t *testing.T) {
	for se, want := range map[string]error{
		"cannot create 'tank/v': out of space":                                        backend.ErrInsufficientCapacity,
		"cannot destroy 'tank/v': dataset is busy":                                    backend.ErrInUse,
		"cannot create 'tank/v': dataset already exists":                              backend.ErrAlreadyExists,
		"cannot open 'tank/v': dataset does not exist":                                backend.ErrNotFound,
		"cannot open 'nopool': no such pool":                                          backend.ErrNotFound,
		"cannot create 'tank/v': volume size must be a multiple of volume block size": backend.ErrInvalidArgument,
		"something else": nil,
	} {
		if got := classify(se); got != want {
			t.Errorf("classify(%q) = %v, want %v", se, got, want)
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Observe (the agent's periodic refresh) is capacity and zvols from ONE `zfs list`, the same
// figures as Capacity and List (two).
func TestObserveIsOneList(t *testing.T) {
	ctx := context.Background()
	f := newFake("tank/k8s/volumes", 20<<30)
	z := newTestZFS(t, f, Config{VolBlockSize: 16 << 10, Sparse: true})
	for _, n := range []string{"a", "b"} {
		if _, err := z.Create(ctx, backend.VolumeID(n), 1<<30); err != nil {
			t.Fatal(err)
		}
	}
	f.calls = nil
	c, vols, err := z.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.calls) != 1 || !strings.HasPrefix(f.calls[0], "zfs list ") {
		t.Errorf("calls %q, want one zfs list", f.calls)
	}
	wantC, err := z.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantV, err := z.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c != wantC || fmt.Sprint(vols) != fmt.Sprint(wantV) || len(vols) != 2 || c.ProvisionedBytes != 2<<30 {
		t.Errorf("Observe = %+v, %v; Capacity, List = %+v, %v", c, vols, wantC, wantV)
	}
	f.fail = map[string]string{"zfs list": "cannot open 'tank/k8s/volumes': dataset does not exist"}
	if _, _, err := z.Observe(ctx); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("missing parent: %v, want ErrNotFound", err)
	}
}
