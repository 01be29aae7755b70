// Package crypt is the node plugin's LUKS2 layer over dm-crypt: it formats, opens, resizes and
// closes the encrypted mapping of a volume by running cryptsetup(8), as k8s.io/mount-utils runs
// mount(8) and mkfs. The passphrase goes to cryptsetup on its standard input (--key-file -),
// never on a command line, in an error or a log line.
//
// Layout of an encrypted volume (docs/design.md#volume-encryption): the backing device (an
// LV, zvol, raw partition, or the NVMe-oF namespace that shows one on the consuming node)
// holds a LUKS2 header whose label is the CSI volume id, and one keyslot opened by the
// volume's passphrase (keyslot 0; rotation adds a keyslot and removes the old one, no data is
// re-encrypted). The mapping is /dev/mapper/<MapperName(volume id)>; the filesystem, or the
// raw block device handed to the pod, is inside it.
package crypt

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/plinth-storage/plinth/internal/failpoint"
)

// Errors of this package; match with errors.Is.
var (
	// ErrWrongKey: cryptsetup found no keyslot the passphrase opens (exit code 2).
	ErrWrongKey = errors.New("no keyslot opens with this key")
	// ErrForeignHeader: the device holds the LUKS header of another volume (its label is not
	// the volume id): never opened, never formatted.
	ErrForeignHeader = errors.New("LUKS header of another volume")
	// ErrNotEncrypted: the device holds data that is not a LUKS header (a filesystem, a
	// partition table, ...): an existing clear volume; left alone, never formatted.
	ErrNotEncrypted = errors.New("not a LUKS device")
	// ErrBusy: a mapping of the volume is active on another backing device.
	ErrBusy = errors.New("mapping active on another device")
)

// Params are the LUKS2 format parameters of a volume (the Placement's encryption).
type Params struct {
	// Cipher is the dm-crypt cipher, such as aes-xts-plain64.
	Cipher string
	// KeySize is the volume key's size in bits (256 or 512 for XTS).
	KeySize int
	// Inherited are the labels, besides the volume id, that the header of a volume made from
	// another's blocks (a restore or clone) may carry: its source's id, and theirs. Stage opens
	// such a header and relabels it with the volume id.
	Inherited []string
	// Previous is the passphrase the key replaces (a rotation: the key Secret's
	// key-previous), or nil. When the key opens no keyslot and Previous does, Stage re-wraps
	// the header first (Rewrap: a keyslot for the key added, Previous's removed).
	Previous []byte
}

// HeaderBytes is the room the LUKS2 header takes at the start of the device (Format pins the
// data offset there): the mapping is that much smaller than its backing device.
const HeaderBytes = 16 << 20

// LUKS runs cryptsetup. The zero value runs "cryptsetup" from PATH.
type LUKS struct {
	// Cryptsetup is the cryptsetup binary (default "cryptsetup").
	Cryptsetup string
	// Blkid is the blkid binary (default "blkid").
	Blkid string
}

// MapperName is the device-mapper name of volume id's mapping: "plinth-" + id (at most 127
// bytes for the volume ids Plinth makes).
func MapperName(id string) string { return "plinth-" + id }

// MapperPath is /dev/mapper/<name>.
func MapperPath(name string) string { return filepath.Join("/dev/mapper", name) }

// Stage makes volume id's mapping of dev with key and returns its path: a blank device (no
// signature at all, blkid) is formatted first; a LUKS2 device labelled id is opened; an
// active mapping of dev is reused (a retry after a crash). Every step may be retried after a
// crash: a formatted device is opened, never formatted again. A header labelled with one of
// p.Inherited is opened, then relabelled id. With p.Previous (a key rotation), the header is
// re-wrapped to key before it is opened (or while its mapping stays active). Errors: ErrWrongKey,
// ErrForeignHeader, ErrNotEncrypted, ErrBusy, or the tool's failure.
func (l *LUKS) Stage(ctx context.Context, dev, id string, key []byte, p Params) (string, error) {
	name := MapperName(id)
	if backing, active, err := l.Backing(ctx, name); err != nil {
		return "", err
	} else if active {
		if !sameDevice(backing, dev) {
			return "", fmt.Errorf("%w: %s is open on %s, not %s", ErrBusy, name, backing, dev)
		}
		if err := l.rewrapFor(ctx, dev, key, p); err != nil {
			return "", err
		}
		return MapperPath(name), nil
	}
	typ, label, err := l.probe(ctx, dev)
	if err != nil {
		return "", err
	}
	switch typ {
	case "":
		if err := l.Format(ctx, dev, id, key, p); err != nil {
			return "", err
		}
		failpoint.Hit(failpoint.CryptFormatted)
	case "crypto_LUKS":
		if label != id && !slices.Contains(p.Inherited, label) {
			return "", fmt.Errorf("%w: %s is labelled %q, not %s: refused", ErrForeignHeader, dev, label, id)
		}
		if err := l.rewrapFor(ctx, dev, key, p); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("%w: %s holds %s: left alone", ErrNotEncrypted, dev, typ)
	}
	if err := l.Open(ctx, dev, name, key); err != nil {
		return "", err
	}
	if typ != "" && label != id {
		// the source's header, opened by its key: from now on the volume's own (a crash
		// before this leaves the mapping open; the next stage after unstage relabels)
		if _, err := l.run(ctx, nil, "config", "--label", id, dev); err != nil {
			return "", err
		}
	}
	failpoint.Hit(failpoint.CryptOpened)
	return MapperPath(name), nil
}

// Rewrap moves the passphrase of dev's LUKS2 header from old to key: it adds a keyslot for
// key (unlocked by old), then removes the keyslot old opens. The volume key (the one dm-crypt
// encrypts with) stays, so no data is re-encrypted, and an active mapping of dev keeps working
// (opened with --disable-keyring, it holds the volume key in its dm table): the filesystem
// stays mounted and written while the header changes. Each step is checked before it is done,
// so a retry after a crash between them finishes the job: a key that opens a keyslot already
// is not added again, an old key that opens none has nothing left to remove. It returns
// whether it changed the header. Errors: ErrWrongKey when neither key nor old opens a keyslot
// (nothing is changed), or the tool's failure. Both keys reach cryptsetup through pipes (old
// on its standard input, key on file descriptor 3, read as /proc/self/fd/3), never on a
// command line or on disk.
func (l *LUKS) Rewrap(ctx context.Context, dev string, old, key []byte) (bool, error) {
	if bytes.Equal(old, key) {
		return false, nil
	}
	opens, err := l.Opens(ctx, dev, key)
	if err != nil {
		return false, err
	}
	changed := false
	if !opens {
		fd3, w, err := os.Pipe()
		if err != nil {
			return false, err
		}
		_, werr := w.Write(key) // a key fits the pipe's buffer: written before cryptsetup reads it
		w.Close()               //nolint:errcheck
		if werr != nil {
			fd3.Close() //nolint:errcheck
			return false, werr
		}
		_, err = l.runFiles(ctx, old, []*os.File{fd3}, "luksAddKey", "--batch-mode", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
			"--hash", "sha256", "--key-file", "-", dev, "/proc/self/fd/3")
		fd3.Close() //nolint:errcheck
		if err != nil {
			return false, err
		}
		changed = true
		failpoint.Hit(failpoint.CryptRewrapAdded)
	}
	if oldOpens, err := l.Opens(ctx, dev, old); err != nil {
		return changed, err
	} else if !oldOpens {
		return changed, nil
	}
	if _, err := l.run(ctx, old, "luksRemoveKey", "--batch-mode", "--key-file", "-", dev); err != nil {
		return changed, err
	}
	failpoint.Hit(failpoint.CryptRewrapRemoved)
	return true, nil
}

// Opens reports whether key opens a keyslot of dev's LUKS2 header (cryptsetup open
// --test-passphrase: nothing is activated).
func (l *LUKS) Opens(ctx context.Context, dev string, key []byte) (bool, error) {
	_, err := l.run(ctx, key, "open", "--test-passphrase", "--type", "luks2", "--key-file", "-", dev)
	if errors.Is(err, ErrWrongKey) {
		return false, nil
	}
	return err == nil, err
}

// Keyslots returns the number of keyslots in use in dev's LUKS2 header (cryptsetup luksDump).
func (l *LUKS) Keyslots(ctx context.Context, dev string) (int, error) {
	out, err := l.run(ctx, nil, "luksDump", dev)
	if err != nil {
		return 0, err
	}
	n, in := 0, false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "Keyslots:":
			in = true
		case in && line != "" && line[0] != ' ' && line[0] != '\t':
			in = false
		case in && strings.HasSuffix(line, ": luks2") && strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   "):
			n++
		}
	}
	return n, nil
}

// rewrapFor re-wraps dev's header from p.Previous to key when p names a previous key and
// key opens no keyslot yet; a wrong key for both is ErrWrongKey.
func (l *LUKS) rewrapFor(ctx context.Context, dev string, key []byte, p Params) error {
	if p.Previous == nil {
		return nil
	}
	_, err := l.Rewrap(ctx, dev, p.Previous, key)
	return err
}

// Format writes a LUKS2 header labelled id on dev with one keyslot (0) for key. The key is a
// high-entropy random secret, not a password: PBKDF2 with the fewest iterations cryptsetup
// allows (1000) costs nothing and weakens nothing, where argon2id would take a second and up
// to 1 GiB of memory per stage. Never call it on a device that holds data (Stage checks).
func (l *LUKS) Format(ctx context.Context, dev, id string, key []byte, p Params) error {
	args := []string{"luksFormat", "--batch-mode", "--type", "luks2", "--cipher", p.Cipher, "--key-size", strconv.Itoa(p.KeySize),
		"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--hash", "sha256", "--label", id, "--key-slot", "0",
		"--offset", strconv.Itoa(HeaderBytes / 512),
		"--key-file", "-", dev}
	_, err := l.run(ctx, key, args...)
	return err
}

// Open activates dev as the mapping name with key. --disable-keyring keeps the volume key in
// the dm-crypt table instead of the kernel keyring, so that Resize needs no passphrase
// (NodeExpandVolume gets no Secret). ErrWrongKey when no keyslot opens.
func (l *LUKS) Open(ctx context.Context, dev, name string, key []byte) error {
	_, err := l.run(ctx, key, "open", "--type", "luks2", "--disable-keyring", "--key-file", "-", dev, name)
	return err
}

// Resize grows the active mapping name to its backing device (online; the filesystem inside
// is grown afterwards by the caller).
func (l *LUKS) Resize(ctx context.Context, name string) error {
	_, err := l.run(ctx, nil, "resize", name)
	return err
}

// Close deactivates the mapping name; an inactive mapping is success.
func (l *LUKS) Close(ctx context.Context, name string) error {
	if _, err := os.Lstat(MapperPath(name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	_, err := l.run(ctx, nil, "close", name)
	return err
}

// Backing returns the backing device of the active mapping name (from cryptsetup status),
// and whether it is active.
func (l *LUKS) Backing(ctx context.Context, name string) (string, bool, error) {
	if _, err := os.Lstat(MapperPath(name)); errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	out, err := l.run(ctx, nil, "status", name)
	if err != nil {
		return "", false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok && k == "device" {
			return strings.TrimSpace(v), true, nil
		}
	}
	return "", true, fmt.Errorf("cryptsetup status %s: no device line", name)
}

// IsLUKS reports whether dev holds a LUKS header, and its label.
func (l *LUKS) IsLUKS(ctx context.Context, dev string) (bool, string, error) {
	typ, label, err := l.probe(ctx, dev)
	return typ == "crypto_LUKS", label, err
}

// probe returns the signature type blkid finds on dev ("" for none) and its label, reading
// the device itself (-p: no cache).
func (l *LUKS) probe(ctx context.Context, dev string) (typ, label string, err error) {
	bin := l.Blkid
	if bin == "" {
		bin = "blkid"
	}
	out, err := exec.CommandContext(ctx, bin, "-p", "-o", "export", dev).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return "", "", nil // nothing found: blank
	}
	if err != nil {
		return "", "", fmt.Errorf("blkid -p %s: %w", dev, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "TYPE":
			typ = v
		case "PTTYPE":
			if typ == "" {
				typ = "partition table " + v
			}
		case "LABEL":
			label = v
		}
	}
	if typ == "" {
		typ = "an unknown signature"
	}
	return typ, label, nil
}

// run runs cryptsetup with args, key (when not nil) on its standard input. Exit code 2 is
// ErrWrongKey; other failures carry cryptsetup's message (which never holds the key).
func (l *LUKS) run(ctx context.Context, key []byte, args ...string) ([]byte, error) {
	return l.runFiles(ctx, key, nil, args...)
}

// runFiles is run with extra open files for cryptsetup (descriptor 3 onwards).
func (l *LUKS) runFiles(ctx context.Context, key []byte, files []*os.File, args ...string) ([]byte, error) {
	bin := l.Cryptsetup
	if bin == "" {
		bin = "cryptsetup"
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.ExtraFiles = files
	if key != nil {
		cmd.Stdin = bytes.NewReader(key)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 2 && (args[0] == "open" || args[0] == "luksAddKey" || args[0] == "luksKillSlot" || args[0] == "luksRemoveKey") {
			return out, fmt.Errorf("cryptsetup %s: %w (%s)", args[0], ErrWrongKey, msg)
		}
		return out, fmt.Errorf("cryptsetup %s: %w: %s", args[0], err, msg)
	}
	return out, nil
}

// sameDevice reports whether a and b name one block device (same device number), or the same
// path when either cannot be read.
func sameDevice(a, b string) bool {
	da, ea := devNumber(a)
	db, eb := devNumber(b)
	if ea != nil || eb != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return da == db
}
