package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A start that must wait for another cluster's lock says so at once, before waiting, and names
// the process that holds the lock; a free lock is taken without a word.
func TestWaitLockNamesHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.lock")
	holder, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	// flock locks belong to the open file: a second open of the same file in this process
	// conflicts with the first, as another process's would.
	if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	waiter, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()

	ctx, cancel := context.WithCancelCause(context.Background())
	var told []string
	stop := errors.New("the test stops waiting once told")
	err = waitLock(ctx, waiter, path, func(h string) { told = append(told, h); cancel(stop) })
	me := "pid " + strconv.Itoa(os.Getpid()) + " ("
	if len(told) != 1 || !strings.HasPrefix(told[0], me) || !strings.Contains(told[0], filepath.Base(os.Args[0])) {
		t.Errorf("told %q, want once: %s<this test's command line>)", told, me)
	}
	if err == nil || !errors.Is(err, stop) || !strings.Contains(err.Error(), "locked by "+me) {
		t.Errorf("error %v, want the cause and the holder", err)
	}

	if h, ok := holderOf(path); !ok || !strings.HasPrefix(h, me) {
		t.Errorf("holderOf %q %v, want held by %s…", h, ok, me)
	}
	if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	told = nil
	if h, ok := holderOf(path); ok {
		t.Errorf("holderOf a free lock: %q", h)
	}
	if err := waitLock(context.Background(), waiter, path, func(h string) { told = append(told, h) }); err != nil || told != nil {
		t.Errorf("free lock: error %v, told %q; want it taken without a word", err, told)
	}
}
