package crypt_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/csi/crypt"
	"github.com/plinth-storage/plinth/internal/failpoint"
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
