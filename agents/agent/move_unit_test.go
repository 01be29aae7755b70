package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A copy carries exactly the first n bytes — a size that is no multiple of the copy's chunk
// included —, leaves the target's bytes beyond n as they were, and returns the checksum of
// what it carried.
func TestCopyVerifyCarriesTheRange(t *testing.T) {
	dir := t.TempDir()
	n := int64(2*moveChunk + 4097)
	srcData := make([]byte, n+512) // the source is longer than the range asked for
	rand.Read(srcData)
	tail := bytes.Repeat([]byte{0xAB}, 8192)
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, srcData, 0o600); err != nil {
		t.Fatal(err)
	}
	// a larger target: its bytes past n are not the copy's business
	if err := os.WriteFile(dst, append(make([]byte, n), tail...), 0o600); err != nil {
		t.Fatal(err)
	}
	sum, err := copyVerify(context.Background(), src, dst, n)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(srcData[:n])
	if want := "sha256:" + hex.EncodeToString(h[:]); sum != want {
		t.Errorf("checksum %s, want %s", sum, want)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:n], srcData[:n]) || !bytes.Equal(got[n:], tail) {
		t.Errorf("target differs from the source's range, or its tail was touched")
	}
}

// A source shorter than the range, a missing target and a cancelled context are errors, and
// nothing claims a checksum.
func TestCopyVerifyRefuses(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	os.WriteFile(src, make([]byte, 1000), 0o600)
	os.WriteFile(dst, make([]byte, 4096), 0o600)
	if sum, err := copyVerify(context.Background(), src, dst, 4096); err == nil || sum != "" {
		t.Errorf("a source shorter than the range: %q, %v", sum, err)
	}
	if sum, err := copyVerify(context.Background(), src, filepath.Join(dir, "none"), 1000); err == nil || sum != "" {
		t.Errorf("a missing target: %q, %v", sum, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if sum, err := copyVerify(ctx, src, dst, 1000); !errors.Is(err, context.Canceled) || sum != "" {
		t.Errorf("a cancelled copy: %q, %v", sum, err)
	}
}
