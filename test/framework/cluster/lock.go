package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// LockPath is the host's cluster lock (one cluster at a time on a host).
const LockPath = lockPath

// LockHolder says who holds the flock(2) lock on the file at path, as "pid N (command line)",
// read from /proc/locks (which names the process that took each lock) and
// /proc/<pid>/cmdline; "an unknown process" when /proc does not say (the lock was released
// meanwhile, or the holder runs in another PID namespace).
func LockHolder(path string) string {
	if h, ok := holderOf(path); ok {
		return h
	}
	return "an unknown process"
}

// holderOf is LockHolder, with ok false when /proc/locks names no holder of path's lock.
func holderOf(path string) (holder string, ok bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "", false
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 12345 fe:00:10027407 0 EOF"; a waiter's line has "->"
		// after the number.
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" {
			continue
		}
		dev := strings.Split(fields[5], ":")
		if len(dev) != 3 || dev[2] != strconv.FormatUint(st.Ino, 10) {
			continue
		}
		return describePID(fields[4]), true
	}
	return "", false
}

// describePID is "pid N (command line)", the command line cut at 200 bytes.
func describePID(pid string) string {
	cmd, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil || len(cmd) == 0 {
		return "pid " + pid
	}
	line := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
	if len(line) > 200 {
		line = line[:200] + "…"
	}
	return fmt.Sprintf("pid %s (%s)", pid, line)
}

// LockHeld reports whether a process holds the host's cluster lock now, and who (LockHolder),
// from /proc/locks alone: it never takes the lock, so a cluster starting meanwhile does not
// find it held by the caller. The answer may be stale by the time the caller acts on it
// (Start waits for the lock anyway).
func LockHeld() (holder string, held bool) {
	return holderOf(lockPath)
}

// WaitLockFree waits, polling /proc/locks every 500 ms, until no process holds the host's
// cluster lock, or ctx ends (ctx's error). Tests call it before they start the clock of their
// own work, so the time another package's cluster holds the host does not count against it.
// It takes no lock: a cluster may start between its return and the caller's Start, which
// then waits for the lock as usual.
func WaitLockFree(ctx context.Context) error {
	for {
		if _, held := LockHeld(); !held {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the host's cluster lock %s is still held by %s: %w", lockPath, LockHolder(lockPath), context.Cause(ctx))
		case <-time.After(500 * time.Millisecond):
		}
	}
}
