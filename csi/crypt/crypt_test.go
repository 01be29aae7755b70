package crypt_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/csi/crypt"
)

// fakeTools writes stand-ins for blkid and cryptsetup (FAKES: the host has no device-mapper;
// the real tools run in the guest, guest_test.go): blkid prints blkidOut and exits blkidCode;
// cryptsetup appends its arguments and its standard input to a log and exits cryptCode.
func fakeTools(t *testing.T, blkidOut string, blkidCode, cryptCode int) (*crypt.LUKS, string) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	blkid := write("blkid", "printf '%s' '"+blkidOut+"'\nexit "+itoa(blkidCode)+"\n")
	cs := write("cryptsetup", "echo \"args: $*\" >> "+log+"\nif [ \"$1\" != status ] && [ \"$1\" != resize ] && [ \"$1\" != close ]; then echo \"stdin: $(cat)\" >> "+log+"; fi\n"+
		"echo 'No key available with this passphrase.' >&2\nexit "+itoa(cryptCode)+"\n")
	return &crypt.LUKS{Cryptsetup: cs, Blkid: blkid}, log
}

func itoa(i int) string { return strconv.Itoa(i) }

func readLog(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// The blank device is formatted then opened, the key on standard input only; a device labelled
// for another volume, or holding a filesystem, is neither formatted nor opened; exit code 2 of
// open is ErrWrongKey, and no error holds the key.
func TestStageDecisions(t *testing.T) {
	key := []byte(strings.Repeat("k3y", 22))
	dev := "/dev/fake-device-for-stage"
	p := crypt.Params{Cipher: "aes-xts-plain64", KeySize: 512}
	for _, tc := range []struct {
		name           string
		blkid          string
		blkidCode      int
		cryptCode      int
		want           error
		formats, opens bool
	}{
		{name: "blank", blkidCode: 2, formats: true, opens: true},
		{name: "own header", blkid: "TYPE=crypto_LUKS\nLABEL=" + volID + "\n", opens: true},
		{name: "wrong key", blkid: "TYPE=crypto_LUKS\nLABEL=" + volID + "\n", cryptCode: 2, want: crypt.ErrWrongKey, opens: true},
		{name: "another volume's header", blkid: "TYPE=crypto_LUKS\nLABEL=vol-other\n", want: crypt.ErrForeignHeader},
		{name: "clear filesystem", blkid: "TYPE=ext4\nUUID=x\n", want: crypt.ErrNotEncrypted},
		{name: "partition table", blkid: "PTTYPE=gpt\n", want: crypt.ErrNotEncrypted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, log := fakeTools(t, tc.blkid, tc.blkidCode, tc.cryptCode)
			_, err := l.Stage(t.Context(), dev, volID, key, p)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Stage: %v, want %v", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), string(key)) {
				t.Fatal("the error holds the key")
			}
			got := readLog(t, log)
			if strings.Contains(got, "luksFormat") != tc.formats || strings.Contains(got, "args: open") != tc.opens {
				t.Fatalf("cryptsetup calls (format %v, open %v wanted):\n%s", tc.formats, tc.opens, got)
			}
			for _, line := range strings.Split(got, "\n") {
				if strings.HasPrefix(line, "args:") && strings.Contains(line, string(key)) {
					t.Fatalf("the key on a command line: %s", line)
				}
			}
			if tc.opens && !strings.Contains(got, "stdin: "+string(key)) {
				t.Fatalf("the key did not reach cryptsetup's standard input:\n%s", got)
			}
			if tc.formats && !strings.Contains(got, "--label "+volID) {
				t.Fatalf("format without the volume id as label:\n%s", got)
			}
		})
	}
}

func TestMapperName(t *testing.T) {
	if n := crypt.MapperName(volID); n != "plinth-"+volID || len(n) > 127 {
		t.Errorf("MapperName %q", n)
	}
}
