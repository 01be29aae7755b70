package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// LockPath is the host's cluster lock (one cluster at a time on a host).
const LockPath = lockPath

// LockHolder says who holds the flock(2) lock on the file at path, as "pid N (command line)",
// read from /proc/locks (which names the process that took each lock) and
// /proc/<pid>/cmdline; "an unknown process" when /proc does not say (the lock was released
// meanwhile, or the holder runs in another PID namespace).
func LockHolder(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "an unknown process"
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return "an unknown process"
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
		return describePID(fields[4])
	}
	return "an unknown process"
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

// LockHeld reports whether another process holds the host's cluster lock now, and who
// (LockHolder). It takes the lock and releases it at once when free; the answer may be stale
// by the time the caller acts on it (Start waits for the lock anyway).
func LockHeld() (holder string, held bool, err error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case err == nil:
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return "", false, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		return LockHolder(lockPath), true, nil
	}
	return "", false, fmt.Errorf("lock %s: %w", lockPath, err)
}
