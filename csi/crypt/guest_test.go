package crypt_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/csi/crypt"
	"github.com/plinth-storage/plinth/internal/failpoint"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// The LUKS2 layer on real dm-crypt: these tests run in the qemu guest (test/kernel/run.sh,
// packages.txt), on loop devices over sparse files in the guest's /tmp.

func requireGuest(t testing.TB) {
	t.Helper()
	if os.Getenv("PLINTH_KERNEL_TEST") != "1" {
		t.Skip("kernel test: set PLINTH_KERNEL_TEST=1 (runs in the qemu guest via make test-kernel)")
	}
}

func sh(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// loopDevice makes a sparse file of size bytes and a loop device over it, both removed at the
// end of the test; it returns the device and the file.
func loopDevice(t testing.TB, size int64) (string, string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "backing")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f, size); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(sh(t, "losetup", "-f", "--show", f))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() }) //nolint:errcheck
	return dev, f
}

func randomKey(t testing.TB) []byte {
	t.Helper()
	raw := make([]byte, 64)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	return []byte(hex.EncodeToString(raw))
}

func luksUUID(t testing.TB, dev string) string {
	t.Helper()
	return strings.TrimSpace(sh(t, "blkid", "-p", "-o", "value", "-s", "UUID", dev))
}

const volID = "vol-0123456789abcdef0123456789abcdef01234567"

var params = crypt.Params{Cipher: "aes-xts-plain64", KeySize: 512}

// crashAt makes the next hit of point panic (standing in for a crash there: the kernel keeps
// whatever was done, the process keeps nothing) and returns a function that runs f and
// reports whether it stopped there.
func crashAt(t *testing.T, point string) func(f func()) bool {
	type crashed struct{}
	disable := failpoint.Enable(point, func() { panic(crashed{}) })
	return func(f func()) (stopped bool) {
		defer disable()
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(crashed); !ok {
					panic(r)
				}
				stopped = true
			}
		}()
		f()
		return false
	}
}

func TestGuestLUKS(t *testing.T) {
	requireGuest(t)
	ctx := t.Context()
	l := &crypt.LUKS{}
	dev, file := loopDevice(t, 64<<20)
	key := randomKey(t)
	name := crypt.MapperName(volID)
	t.Cleanup(func() { l.Close(context.Background(), name) }) //nolint:errcheck

	// a crash right after luksFormat: the retry opens the header it wrote, never formats again
	var uuid string
	if !crashAt(t, failpoint.CryptFormatted)(func() { l.Stage(ctx, dev, volID, key, params) }) { //nolint:errcheck
		t.Fatal("Stage did not reach crypt.formatted")
	}
	if ok, label, err := l.IsLUKS(ctx, dev); err != nil || !ok || label != volID {
		t.Fatalf("after the crash at crypt.formatted: LUKS %v, label %q, %v", ok, label, err)
	}
	uuid = luksUUID(t, dev)
	if _, active, _ := l.Backing(ctx, name); active {
		t.Fatal("mapping active after a crash before open")
	}
	// a crash right after open: the retry reuses the mapping
	if !crashAt(t, failpoint.CryptOpened)(func() { l.Stage(ctx, dev, volID, key, params) }) { //nolint:errcheck
		t.Fatal("Stage did not reach crypt.opened")
	}
	if u := luksUUID(t, dev); u != uuid {
		t.Fatalf("LUKS UUID %s after the retry, %s before: formatted again", u, uuid)
	}
	mapped, err := l.Stage(ctx, dev, volID, key, params)
	if err != nil {
		t.Fatalf("Stage after the crash at crypt.opened: %v", err)
	}
	if mapped != crypt.MapperPath(name) {
		t.Fatalf("mapped at %s", mapped)
	}
	if b, active, err := l.Backing(ctx, name); err != nil || !active || b != dev {
		t.Fatalf("mapping backed by %q (active %v, %v), want %s", b, active, err, dev)
	}
	if u := luksUUID(t, dev); u != uuid {
		t.Fatalf("LUKS UUID %s, %s at format: formatted again", u, uuid)
	}

	// known data through the mapping: in clear inside, nowhere on the backing device
	marker := []byte("PLINTH-PLAINTEXT-" + hex.EncodeToString(randomKey(t)[:16]))
	sh(t, "mkfs.ext4", "-q", mapped)
	mnt := t.TempDir()
	sh(t, "mount", mapped, mnt)
	if err := os.WriteFile(filepath.Join(mnt, "data"), bytes.Repeat(append(marker, '\n'), 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	sh(t, "umount", mnt)
	inside, err := os.ReadFile(mapped)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(inside, marker) {
		t.Fatal("the marker is not on the mapping: the scan would find nothing anywhere")
	}
	outside, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(outside, marker) {
		t.Fatal("plaintext on the backing device")
	}

	if err := l.Close(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(mapped); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after Close: %v", mapped, err)
	}
	if err := l.Close(ctx, name); err != nil {
		t.Errorf("second Close: %v", err)
	}

	t.Run("WrongKeyRefusedNothingFormatted", func(t *testing.T) {
		_, err := l.Stage(ctx, dev, volID, randomKey(t), params)
		if !errors.Is(err, crypt.ErrWrongKey) {
			t.Fatalf("Stage with another key: %v, want ErrWrongKey", err)
		}
		if strings.Contains(err.Error(), string(key)) {
			t.Fatal("the error holds the key")
		}
		if u := luksUUID(t, dev); u != uuid {
			t.Fatalf("LUKS UUID %s after a wrong key, %s before", u, uuid)
		}
	})

	t.Run("AnotherVolumesHeaderRefused", func(t *testing.T) {
		other := "vol-ffffffffffffffffffffffffffffffffffffffff"
		_, err := l.Stage(ctx, dev, other, key, params)
		if !errors.Is(err, crypt.ErrForeignHeader) {
			t.Fatalf("Stage of %s on %s's device: %v, want ErrForeignHeader", other, volID, err)
		}
		if _, active, _ := l.Backing(ctx, crypt.MapperName(other)); active {
			t.Fatal("opened anyway")
		}
	})

	t.Run("RestageReadsBack", func(t *testing.T) {
		mapped, err := l.Stage(ctx, dev, volID, key, params)
		if err != nil {
			t.Fatal(err)
		}
		sh(t, "mount", mapped, mnt)
		defer sh(t, "umount", mnt)
		data, err := os.ReadFile(filepath.Join(mnt, "data"))
		if err != nil || !bytes.HasPrefix(data, marker) {
			t.Fatalf("data after restage: %.40q %v", data, err)
		}
	})

	t.Run("ExpandOnline", func(t *testing.T) {
		sh(t, "mount", crypt.MapperPath(name), mnt)
		defer sh(t, "umount", mnt)
		before := devSize(t, crypt.MapperPath(name))
		if err := os.Truncate(file, 128<<20); err != nil {
			t.Fatal(err)
		}
		sh(t, "losetup", "-c", dev)
		if err := l.Resize(ctx, name); err != nil {
			t.Fatal(err)
		}
		after := devSize(t, crypt.MapperPath(name))
		if after-before != 64<<20 {
			t.Fatalf("mapping %d bytes before, %d after growing its device by 64 MiB", before, after)
		}
		// the header takes exactly HeaderBytes (the controller adds that much to the backend)
		if backing := devSize(t, dev); backing-after != crypt.HeaderBytes {
			t.Fatalf("mapping of %d bytes on a device of %d: the header takes %d, want crypt.HeaderBytes %d", after, backing, backing-after, crypt.HeaderBytes)
		}
		sh(t, "resize2fs", crypt.MapperPath(name))
		data, err := os.ReadFile(filepath.Join(mnt, "data"))
		if err != nil || !bytes.HasPrefix(data, marker) {
			t.Fatalf("data after expansion: %.40q %v", data, err)
		}
	})

	t.Run("ClearVolumeLeftAlone", func(t *testing.T) {
		clear, _ := loopDevice(t, 32<<20)
		sh(t, "mkfs.ext4", "-q", clear)
		fsUUID := luksUUID(t, clear)
		_, err := l.Stage(ctx, clear, "vol-eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", key, params)
		if !errors.Is(err, crypt.ErrNotEncrypted) {
			t.Fatalf("Stage on an ext4 device: %v, want ErrNotEncrypted", err)
		}
		if u := luksUUID(t, clear); u != fsUUID {
			t.Fatalf("ext4 UUID %s after, %s before: touched", u, fsUUID)
		}
	})
}

func devSize(t testing.TB, dev string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(sh(t, "blockdev", "--getsize64", dev)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// BenchmarkGuestWrite writes 32 MiB with O_DIRECT to a clear loop device and to a LUKS2
// mapping of one (aes-xts-plain64, 512-bit key), in the same guest run: the cost of dm-crypt
// on this CPU (in the qemu guest: software-emulated AES-NI, so a ratio, not a figure of real
// hardware).
func BenchmarkGuestWrite(b *testing.B) {
	requireGuest(b)
	ctx := context.Background()
	l := &crypt.LUKS{}
	for _, encrypted := range []bool{false, true} {
		name := "clear"
		if encrypted {
			name = "luks2"
		}
		b.Run(name, func(b *testing.B) {
			dev, _ := loopDevice(b, 64<<20)
			if encrypted {
				mapped, err := l.Stage(ctx, dev, volID, randomKey(b), params)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { l.Close(ctx, crypt.MapperName(volID)) }) //nolint:errcheck
				dev = mapped
			}
			b.SetBytes(32 << 20)
			b.ReportAllocs()
			for b.Loop() {
				sh(b, "dd", "if=/dev/zero", "of="+dev, "bs=1M", "count=32", "oflag=direct")
			}
		})
	}
}

// A key rotation re-wraps the header of a staged volume while its filesystem is mounted and
// written: a keyslot for the new key, the old one removed, the volume key and every data block
// unchanged. A crash after either step is finished by the retry without losing access; after
// it, a restage opens with the new key only (every older key refused, nothing formatted), the
// data is intact and the backing device holds no plaintext.
func TestGuestLUKSRewrap(t *testing.T) {
	requireGuest(t)
	ctx := t.Context()
	l := &crypt.LUKS{}
	dev, file := loopDevice(t, 64<<20)
	name := crypt.MapperName(volID)
	t.Cleanup(func() { l.Close(context.Background(), name) }) //nolint:errcheck
	keys := [][]byte{randomKey(t), randomKey(t), randomKey(t), randomKey(t)}
	mapped, err := l.Stage(ctx, dev, volID, keys[0], params)
	if err != nil {
		t.Fatal(err)
	}
	uuid := luksUUID(t, dev)
	sh(t, "mkfs.ext4", "-q", mapped)
	mnt := t.TempDir()
	sh(t, "mount", mapped, mnt)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			exec.Command("umount", mnt).Run() //nolint:errcheck
		}
	})
	opens := func(key []byte) bool {
		t.Helper()
		ok, err := l.Opens(ctx, dev, key)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	slots := func() int {
		t.Helper()
		n, err := l.Keyslots(ctx, dev)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// a writer appends known records, each synced, for as long as the rotations run (paced at
	// one record per 5 ms: the guest has one CPU, shared with cryptsetup)
	marker := []byte("PLINTH-PLAINTEXT-" + hex.EncodeToString(randomKey(t)[:16]) + "\n")
	logFile := filepath.Join(mnt, "log")
	stop := make(chan struct{})
	type result struct {
		records int
		err     error
	}
	done := make(chan result, 1)
	go func() {
		f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer f.Close()
		pace := time.NewTicker(5 * time.Millisecond)
		defer pace.Stop()
		n := 0
		for {
			select {
			case <-stop:
				done <- result{records: n}
				return
			case <-pace.C:
			}
			if _, err := f.Write(bytes.Repeat(marker, 64)); err != nil {
				done <- result{records: n, err: err}
				return
			}
			if err := f.Sync(); err != nil {
				done <- result{records: n, err: err}
				return
			}
			n++
		}
	}()
	if err := grows(ctx, logFile, 0); err != nil {
		t.Fatal("the writer wrote nothing:", err)
	}

	// rotation 0 -> 1, crashing after the new keyslot is added: both keys open, the retry
	// (NodeStage again, or the next rotation round) removes the old one
	fi, err := os.Stat(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var stageErr error
	if !crashAt(t, failpoint.CryptRewrapAdded)(func() { _, stageErr = l.Stage(ctx, dev, volID, keys[1], withPrevious(keys[0])) }) {
		t.Fatalf("Stage did not reach crypt.rewrap.added: %v", stageErr)
	}
	if !opens(keys[0]) || !opens(keys[1]) || slots() != 2 {
		t.Fatalf("after the crash at crypt.rewrap.added: old key opens %v, new key opens %v, %d keyslots; want both, 2", opens(keys[0]), opens(keys[1]), slots())
	}
	if got, err := l.Stage(ctx, dev, volID, keys[1], withPrevious(keys[0])); err != nil || got != mapped {
		t.Fatalf("Stage after the crash at crypt.rewrap.added: %s, %v", got, err)
	}
	if opens(keys[0]) || !opens(keys[1]) || slots() != 1 {
		t.Fatalf("after the retry: old key opens %v, new key opens %v, %d keyslots; want false, true, 1", opens(keys[0]), opens(keys[1]), slots())
	}

	// rotation 1 -> 2, crashing after the old keyslot is removed (the Secret still holds it as
	// the previous key): the retry changes nothing and opens with the new key
	if !crashAt(t, failpoint.CryptRewrapRemoved)(func() { _, stageErr = l.Stage(ctx, dev, volID, keys[2], withPrevious(keys[1])) }) {
		t.Fatalf("Stage did not reach crypt.rewrap.removed: %v", stageErr)
	}
	if changed, err := l.Rewrap(ctx, dev, keys[1], keys[2]); err != nil || changed {
		t.Fatalf("Rewrap after the crash at crypt.rewrap.removed: changed %v, %v; want nothing to do", changed, err)
	}
	if got, err := l.Stage(ctx, dev, volID, keys[2], withPrevious(keys[1])); err != nil || got != mapped {
		t.Fatalf("Stage after the crash at crypt.rewrap.removed: %s, %v", got, err)
	}
	if err := grows(ctx, logFile, fi.Size()); err != nil {
		t.Fatal("the writer made no progress across the rotations:", err)
	}
	close(stop)
	res := <-done
	if res.err != nil {
		t.Fatalf("the writer failed during the rotations after %d records: %v", res.records, res.err)
	}
	t.Logf("%d records (%d bytes) written and synced across two rotations", res.records, res.records*64*len(marker))

	// a rotation rewrites the header only: the data area is the same bytes before and after
	sh(t, "umount", mnt)
	mounted = false
	dataArea := func() []byte {
		t.Helper()
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return b[crypt.HeaderBytes:]
	}
	areaBefore := dataArea()
	if changed, err := l.Rewrap(ctx, dev, keys[2], keys[3]); err != nil || !changed {
		t.Fatalf("Rewrap 2 -> 3: changed %v, %v", changed, err)
	}
	if !bytes.Equal(areaBefore, dataArea()) {
		t.Fatal("the rotation changed the data area: data re-encrypted")
	}
	if bytes.Contains(areaBefore, marker[:len(marker)-1]) {
		t.Fatal("plaintext on the backing device")
	}

	// restage: the newest key opens, every older one is refused, nothing is formatted
	if err := l.Close(ctx, name); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys[:3] {
		if _, err := l.Stage(ctx, dev, volID, k, params); !errors.Is(err, crypt.ErrWrongKey) {
			t.Fatalf("Stage with key %d after rotating to key 3: %v, want ErrWrongKey", i, err)
		}
	}
	// a previous key that is not the header's either: refused, the header unchanged
	if _, err := l.Stage(ctx, dev, volID, randomKey(t), withPrevious(keys[1])); !errors.Is(err, crypt.ErrWrongKey) {
		t.Fatalf("Stage with two keys the header does not know: %v, want ErrWrongKey", err)
	}
	if u := luksUUID(t, dev); u != uuid || slots() != 1 {
		t.Fatalf("LUKS UUID %s (was %s), %d keyslots after refused stages", u, uuid, slots())
	}
	mapped, err = l.Stage(ctx, dev, volID, keys[3], params)
	if err != nil {
		t.Fatalf("restage with the newest key: %v", err)
	}
	sh(t, "mount", "-o", "ro", mapped, mnt)
	mounted = true
	data, err := os.ReadFile(filepath.Join(mnt, "log"))
	if err != nil {
		t.Fatal(err)
	}
	if want := res.records * 64 * len(marker); len(data) != want || !bytes.Equal(data, bytes.Repeat(marker, res.records*64)) {
		t.Fatalf("after restage: %d bytes read back, %d written, or not the records written", len(data), want)
	}
	sh(t, "umount", mnt)
	mounted = false
}

// grows polls until the writer's file is larger than n bytes.
func grows(ctx context.Context, path string, n int64) error {
	return wait.Poll(ctx, 10*time.Second, 10*time.Millisecond, func() error {
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		if fi.Size() <= n {
			return fmt.Errorf("%s has %d bytes, not more than %d", path, fi.Size(), n)
		}
		return nil
	})
}

func withPrevious(prev []byte) crypt.Params {
	p := params
	p.Previous = prev
	return p
}
