package main

import (
	"fmt"
	"strings"

	"github.com/plinth-storage/plinth/test/kernel/guest"
)

// guestDiagnostics runs in the guest after a test binary failed. A test that
// times out leaves the command it waited for behind (a process blocked in the
// kernel outlives the test binary's exit), so this lists every user process
// with its state and kernel stack, prints the memory left (tmpfs and ZFS's ARC
// share the guest's RAM) and, where ZFS is loaded, each pool's state and the
// last ZFS events (zpool events, which may block behind a hung pool: given 10 s
// in the background, then reported as not answering), asks the kernel to log
// its blocked tasks (sysrq w), and prints the kernel log's tail.
const guestDiagnostics = `echo "kguest-diag: user processes (pid state cmdline, kernel stack)"
for p in /proc/[0-9]*; do
	c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null)
	[ -n "$c" ] || continue
	s=$(sed -n 's/^State:[[:space:]]*//p' $p/status 2>/dev/null)
	echo "kguest-diag: ${p#/proc/} $s $c"
	sed 's/^/kguest-diag:     /' $p/stack 2>/dev/null
done
grep -E '^(MemTotal|MemAvailable|Shmem|Dirty|Writeback):' /proc/meminfo | sed 's/^/kguest-diag: meminfo /'
if [ -e /dev/zfs ]; then
	for f in /proc/spl/kstat/zfs/*/state; do
		[ -e "$f" ] || continue
		p=${f%/state}
		echo "kguest-diag: zfs pool ${p##*/} $(cat $f)"
	done
	zpool events > /tmp/kguest-zevents 2>&1 &
	z=$! i=0
	while kill -0 $z 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	kill -0 $z 2>/dev/null && echo "kguest-diag: zfs zpool events (pid $z) did not answer in 10 s"
	tail -n 15 /tmp/kguest-zevents | sed 's/^/kguest-diag: zfs events /'
fi
echo w > /proc/sysrq-trigger 2>/dev/null
dmesg | tail -n 60 | sed 's/^/kguest-diag: dmesg /'
exit 0`

// maxDiagnosticLines bounds what failureDigest keeps of the guest diagnostics.
const maxDiagnosticLines = 60

// failureDigest picks out of the guest diagnostics and of a failed test
// binary's output (go test -test.v) the lines that say what failed, in this
// order: the guest's user processes with their kernel stacks, its memory and
// the kernel's blocked-task report (at most maxDiagnosticLines); for a panic
// (a -test.timeout expiry included), the 20 test log lines before it and its
// header up to the first goroutine trace (the tests still running, with their
// durations); each "--- FAIL" line. The CI log shows only the tail of a run,
// where a goroutine dump would otherwise hide the cause, so the most telling
// lines come last; kguest prints the digest just before its summary table.
func failureDigest(testOutput, diagnostics string) []string {
	var out []string
	blocked, plumbing := false, false
	for _, d := range strings.Split(diagnostics, "\n") {
		rest, ok := strings.CutPrefix(d, "kguest-diag: ")
		if !ok {
			continue
		}
		msg, isLog := strings.CutPrefix(rest, "dmesg ")
		if !isLog {
			// Processes and their stacks, but not the guest's own plumbing: its
			// shells (init and the runner of this script), always waiting for a
			// child, and the zvol uevent listener, always waiting for a uevent.
			if !strings.HasPrefix(rest, " ") { // not a stack line: a process or another report
				plumbing = strings.Contains(rest, ") /bin/sh /init") || strings.Contains(rest, ") sh "+guest.SharePath+"/cmd/") ||
					strings.Contains(rest, ") uevent /run/zvol-uevent")
			}
			if !plumbing {
				out = append(out, d)
			}
			continue
		}
		// Of the kernel log, the blocked-task report (sysrq w) and hung-task warnings.
		blocked = blocked || strings.Contains(msg, "Show Blocked State")
		if blocked || strings.Contains(msg, "blocked for more than") {
			out = append(out, d)
		}
	}
	if len(out) > maxDiagnosticLines {
		out = append(out[:maxDiagnosticLines:maxDiagnosticLines], "kguest-diag: … (cut; the whole report is above)")
	}
	lines := strings.Split(strings.TrimRight(testOutput, "\n"), "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "panic: ") {
			continue
		}
		for _, b := range lines[max(0, i-20):i] {
			// FAIL lines are kept below; a SKIP line printed twice would be
			// counted twice by test/tools/skipcheck, which reads this output.
			if !strings.HasPrefix(strings.TrimSpace(b), "--- FAIL") && !strings.HasPrefix(strings.TrimSpace(b), "--- SKIP") {
				out = append(out, b)
			}
		}
		for _, h := range lines[i:] {
			if strings.HasPrefix(h, "goroutine ") {
				break
			}
			out = append(out, h)
		}
		break
	}
	var fails []string
	for _, l := range lines {
		if strings.HasPrefix(l, "--- FAIL") {
			fails = append(fails, l)
		}
	}
	if len(fails) > 30 {
		fails = append([]string{fmt.Sprintf("… %d more FAIL lines above", len(fails)-30)}, fails[len(fails)-30:]...)
	}
	return append(out, fails...)
}
