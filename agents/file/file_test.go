package file

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/test/prereq"
)

// These tests use the kernel's real loop devices: on the host (root with
// /dev/loop-control) and in the qemu guest of make test-kernel.
func requireLoop(t *testing.T) {
	t.Helper()
	prereq.LoopControl(t)
}

func devSize(t *testing.T, dev string) int64 {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newBackend(t *testing.T, cfg Config) *File {
	t.Helper()
	if cfg.Directory == "" {
		cfg.Directory = t.TempDir()
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		vols, _ := f.List(context.Background())
		for _, v := range vols {
			if err := f.Delete(context.Background(), v.ID); err != nil {
				t.Errorf("cleanup %s: %v", v.ID, err)
			}
		}
	})
	return f
}

// waitDetached waits until no loop device is bound to path (LOOP_CLR_FD on
// a device this process still had open completes on close).
func waitDetached(t *testing.T, f *File, path string) {
	t.Helper()
	for i := 0; i < 100; i++ {
		// the kernel's word, not the index's
		if err := f.rescan(); err != nil {
			t.Fatal(err)
		}
		devs, err := f.attached(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("%s still attached", path)
}

func TestLoopLifecycle(t *testing.T) {
	requireLoop(t)
	ctx := context.Background()
	f := newBackend(t, Config{})

	// Byte-precise sizes round UP to the 4 KiB unit.
	idA, idB := backend.VolumeID("one-byte"), backend.VolumeID("gib-plus-one")
	va, err := f.Create(ctx, idA, 1)
	if err != nil {
		t.Fatal(err)
	}
	vb, err := f.Create(ctx, idB, 1073741825)
	if err != nil {
		t.Fatal(err)
	}
	if va.SizeBytes != 4096 || vb.SizeBytes != 1073745920 {
		t.Errorf("sizes %d %d", va.SizeBytes, vb.SizeBytes)
	}
	if va.DevicePath == "" || devSize(t, va.DevicePath) != 4096 || devSize(t, vb.DevicePath) != 1073745920 {
		t.Fatalf("devices %+v %+v", va, vb)
	}
	t.Logf("attached %s and %s", va.DevicePath, vb.DevicePath)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(f.cfg.Directory, idB+".img"), &st); err != nil || st.Blocks*512 > 1<<20 {
		t.Errorf("file not sparse: %d blocks, %v", st.Blocks, err)
	}

	// idempotent; bigger request for the same id is incompatible.
	if v, err := f.Create(ctx, idA, 1); err != nil || v != va {
		t.Errorf("repeat create %+v %v", v, err)
	}
	if _, err := f.Create(ctx, idA, 8192); !errors.Is(err, backend.ErrAlreadyExists) {
		t.Errorf("bigger re-create: %v", err)
	}

	// data through the loop device lands in the file.
	data := make([]byte, 64<<10)
	rand.Read(data)
	dev, err := os.OpenFile(vb.DevicePath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dev.WriteAt(data, 1<<20); err != nil {
		t.Fatal(err)
	}
	dev.Sync()
	dev.Close()
	got := make([]byte, len(data))
	fh, _ := os.Open(filepath.Join(f.cfg.Directory, idB+".img"))
	fh.ReadAt(got, 1<<20)
	fh.Close()
	if !bytes.Equal(got, data) {
		t.Errorf("data did not reach the file")
	}

	// Expand: the attached device sees the new size.
	ve, err := f.Expand(ctx, idA, 2<<20+1)
	if err != nil {
		t.Fatal(err)
	}
	if ve.SizeBytes != 2<<20+4096 || devSize(t, ve.DevicePath) != 2<<20+4096 {
		t.Errorf("expanded %+v, device %d", ve, devSize(t, ve.DevicePath))
	}
	if v, err := f.Expand(ctx, idA, 1); err != nil || v.SizeBytes != ve.SizeBytes {
		t.Errorf("shrink must be a no-op: %+v %v", v, err)
	}
	if _, err := f.Expand(ctx, backend.VolumeID("absent"), 1); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("expand absent: %v", err)
	}

	// Capacity from statfs.
	c, err := f.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sfs unix.Statfs_t
	unix.Statfs(f.cfg.Directory, &sfs)
	if c.TotalBytes != int64(sfs.Blocks)*int64(sfs.Bsize) || c.ProvisionedBytes != ve.SizeBytes+vb.SizeBytes || !c.Thin {
		t.Errorf("capacity %+v statfs %+v", c, sfs)
	}
	t.Logf("capacity %+v", c)
	// A request beyond (size − reserve) is refused; nothing is created.
	big := newBackend(t, Config{Directory: f.cfg.Directory, ReserveBytes: c.TotalBytes})
	if _, err := big.Create(ctx, backend.VolumeID("huge"), 1); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Errorf("create into reserve: %v", err)
	}
	if _, err := f.Get(ctx, backend.VolumeID("huge")); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("huge exists: %v", err)
	}

	// List.
	vols, err := f.List(ctx)
	if err != nil || len(vols) != 2 {
		t.Errorf("list %+v %v", vols, err)
	}

	// After a "reboot" (device detached) DevicePath attaches again.
	if err := detach(va.DevicePath); err != nil {
		t.Fatal(err)
	}
	pathA := filepath.Join(f.cfg.Directory, idA+".img")
	waitDetached(t, f, pathA)
	if v, _ := f.Get(ctx, idA); v.DevicePath != "" {
		t.Errorf("detached volume has device %s", v.DevicePath)
	}
	p, err := f.DevicePath(ctx, idA)
	if err != nil || devSize(t, p) != ve.SizeBytes {
		t.Fatalf("reattach %s %v", p, err)
	}

	// Delete while held exclusively (as a mount would) → ErrInUse.
	hold, err := unix.Open(p, unix.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Delete(ctx, idA)
	unix.Close(hold)
	if !errors.Is(err, backend.ErrInUse) {
		t.Errorf("delete of held device: %v", err)
	}
	for _, id := range []string{idA, idB} {
		if err := f.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	waitDetached(t, f, pathA)
	if err := f.Delete(ctx, idA); err != nil {
		t.Errorf("delete absent: %v", err)
	}
	if _, err := f.DevicePath(ctx, idA); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("device of deleted: %v", err)
	}
}

func TestInvalidIDs(t *testing.T) {
	f, err := New(Config{Directory: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"", "../etc/passwd", "vol-x", "pvc-1"} {
		if _, err := f.Create(ctx, id, 1); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("Create(%q): %v", id, err)
		}
		if err := f.Delete(ctx, id); !errors.Is(err, backend.ErrInvalidArgument) {
			t.Errorf("Delete(%q): %v", id, err)
		}
	}
	if _, err := f.Create(ctx, backend.VolumeID("x"), 0); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("zero size: %v", err)
	}
	if _, err := New(Config{}); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("empty dir: %v", err)
	}
}

// A file attached by an agent in another mount namespace (the agent's
// previous container, since gone) through another path is found as attached
// by the path this agent uses: re-creating or staging it reuses that loop
// device instead of attaching the file a second time.
func TestAttachedFromAnotherMountNamespace(t *testing.T) {
	requireLoop(t)
	bins := prereq.Commands(t, "unshare", "losetup", "mount", "sh")
	ctx := context.Background()
	f := newBackend(t, Config{})
	id := backend.VolumeID("other-ns")
	path := filepath.Join(f.cfg.Directory, id+suffix)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	// The previous container: its own mount namespace, where the volume
	// directory is mounted at another path; it attaches and exits.
	other := t.TempDir()
	out, err := exec.Command(bins[0], "--mount", "--propagation", "private", bins[3], "-c",
		`"$1" --bind "$2" "$3" && "$4" --find --show "$3/$5"`, "sh", bins[2], f.cfg.Directory, other, bins[1], id+suffix).CombinedOutput()
	if err != nil {
		t.Fatalf("attach in another mount namespace: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command(bins[1], "--detach", dev).Run() })
	bf, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	t.Logf("%s attached in another mount namespace; its backing_file reads %q here, the agent's path is %q", dev, strings.TrimSpace(string(bf)), path)

	devs, err := f.attached(path)
	if err != nil || len(devs) != 1 || devs[0] != dev {
		t.Fatalf("attached(%s) = %v, %v; want [%s]", path, devs, err, dev)
	}
	v, err := f.Create(ctx, id, 1<<20)
	if err != nil || v.DevicePath != dev {
		t.Fatalf("re-create: %+v, %v; want device %s", v, err, dev)
	}
	if got, err := f.DevicePath(ctx, id); err != nil || got != dev {
		t.Fatalf("DevicePath: %s, %v; want %s", got, err, dev)
	}
	vols, err := f.List(ctx)
	if err != nil || len(vols) != 1 || vols[0].DevicePath != dev {
		t.Fatalf("List: %+v, %v", vols, err)
	}
	if devs, _ := f.attached(path); len(devs) != 1 {
		t.Fatalf("%s attached to %v after re-create and stage, want only %s", path, devs, dev)
	}
}

// Creations of different volumes run at once, and the capacity check stays atomic with the
// creation it admits: of 16 volumes of 1 MiB created at once where 10 MiB are left, exactly
// 10 are made, each on its own loop device, and the others fail with ErrInsufficientCapacity.
// Two creations of one volume at once make one file on one device.
func TestConcurrentCreate(t *testing.T) {
	requireLoop(t)
	ctx := context.Background()
	f := newBackend(t, Config{})
	c, err := f.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	f.cfg.ReserveBytes = c.TotalBytes - 10*mib
	type result struct {
		v   backend.Volume
		err error
	}
	results := make(chan result, 16)
	for i := 0; i < 16; i++ {
		go func() {
			v, err := f.Create(ctx, backend.VolumeID(fmt.Sprintf("burst-%d", i)), mib)
			results <- result{v, err}
		}()
	}
	made, devs := 0, map[string]bool{}
	for i := 0; i < 16; i++ {
		r := <-results
		switch {
		case r.err == nil:
			made++
			if r.v.DevicePath == "" || devs[r.v.DevicePath] {
				t.Errorf("volume %s on device %q, shared or empty", r.v.ID, r.v.DevicePath)
			}
			devs[r.v.DevicePath] = true
		case !errors.Is(r.err, backend.ErrInsufficientCapacity):
			t.Errorf("unexpected error: %v", r.err)
		}
	}
	if made != 10 {
		t.Errorf("%d volumes made with room for 10", made)
	}

	f.cfg.ReserveBytes = 0
	id := backend.VolumeID("same")
	for i := 0; i < 2; i++ {
		go func() {
			v, err := f.Create(ctx, id, mib)
			results <- result{v, err}
		}()
	}
	a, b := <-results, <-results
	if a.err != nil || b.err != nil || a.v.DevicePath != b.v.DevicePath {
		t.Fatalf("two creations of %s: %+v, %+v", id, a, b)
	}
	if err := f.rescan(); err != nil {
		t.Fatal(err)
	}
	if got, err := f.attached(filepath.Join(f.cfg.Directory, id+suffix)); err != nil || len(got) != 1 {
		t.Errorf("%s attached to %v (%v), want one device", id, got, err)
	}
}
