package main

import (
	"fmt"
	"strings"
	"testing"
)

func TestFailureDigestTimeout(t *testing.T) {
	var b strings.Builder
	b.WriteString("=== RUN   TestGuestA\n--- PASS: TestGuestA (1.00s)\n=== RUN   TestGuestB\n")
	for i := range 30 {
		if i == 25 {
			b.WriteString("    --- SKIP: TestGuestB/sub (0.00s)\n") // not repeated: skipcheck reads this output
		}
		fmt.Fprintf(&b, "    guest_test.go:79: TIMING   cmd zfs    list %d ms\n", i)
	}
	b.WriteString("panic: test timed out after 15m0s\n\trunning tests:\n\t\tTestGuestB (14m58s)\n\n")
	b.WriteString("goroutine 132 [running]:\ntesting.(*M).startAlarm.func1()\n\tsrc/testing/testing.go:2373 +0x385\n")
	diag := strings.Join([]string{
		"kguest-diag: user processes (pid state cmdline, kernel stack)",
		"kguest-diag: 1 S (sleeping) /bin/sh /init ",
		"kguest-diag:     [<0>] do_wait+0x114/0x320",
		"kguest-diag: 206 S (sleeping) uevent /run/zvol-uevent ",
		"kguest-diag:     [<0>] netlink_recvmsg+0x78/0x460",
		"kguest-diag: 192 S (sleeping) sh /mnt/host/cmd/000002.sh ",
		"kguest-diag:     [<0>] do_wait+0x114/0x320",
		"kguest-diag: 812 D (disk sleep) zfs destroy plinthz/k8s/volumes/a",
		"kguest-diag:     [<0>] zvol_remove_minors_impl+0x1c/0x90 [zfs]",
		"kguest-diag: 900 S (sleeping) sh /mnt/host/cmd/000003.sh ",
		"kguest-diag:     [<0>] do_wait+0x114/0x320",
		"kguest-diag: meminfo MemAvailable:     51200 kB",
		"kguest-diag: dmesg [   10.0] virtio_blk virtio1: [vda] 4194304 512-byte logical blocks",
		"kguest-diag: dmesg [ 1000.1] sysrq: Show Blocked State",
		"kguest-diag: dmesg [ 1000.1] task:zfs             state:D stack:0     pid:812",
		"not a diagnostic line",
	}, "\n")
	got := failureDigest(b.String(), diag)
	want := []string{
		"kguest-diag: user processes (pid state cmdline, kernel stack)",
		"kguest-diag: 812 D (disk sleep) zfs destroy plinthz/k8s/volumes/a",
		"kguest-diag:     [<0>] zvol_remove_minors_impl+0x1c/0x90 [zfs]",
		"kguest-diag: meminfo MemAvailable:     51200 kB",
		"kguest-diag: dmesg [ 1000.1] sysrq: Show Blocked State",
		"kguest-diag: dmesg [ 1000.1] task:zfs             state:D stack:0     pid:812",
	}
	for i := 11; i < 30; i++ { // the 20 lines before the panic, the SKIP line left out
		want = append(want, fmt.Sprintf("    guest_test.go:79: TIMING   cmd zfs    list %d ms", i))
	}
	want = append(want, "panic: test timed out after 15m0s", "\trunning tests:", "\t\tTestGuestB (14m58s)", "")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("digest:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestFailureDigestFailedTests(t *testing.T) {
	out := "=== RUN   TestA\n    a_test.go:5: boom\n--- FAIL: TestA (0.10s)\n=== RUN   TestB\n--- FAIL: TestB (0.20s)\nFAIL\n"
	got := failureDigest(out, "")
	if len(got) != 2 || got[0] != "--- FAIL: TestA (0.10s)" || got[1] != "--- FAIL: TestB (0.20s)" {
		t.Errorf("digest %q", got)
	}
	var long strings.Builder
	for i := range 500 {
		fmt.Fprintf(&long, "--- FAIL: T%d (0.00s)\n", i)
	}
	got = failureDigest(long.String(), "")
	if len(got) != 31 || got[0] != "… 470 more FAIL lines above" || got[30] != "--- FAIL: T499 (0.00s)" {
		t.Errorf("digest of 500 failures: %d lines, first %q, last %q", len(got), got[0], got[len(got)-1])
	}
	var diag strings.Builder
	for i := range 100 {
		fmt.Fprintf(&diag, "kguest-diag: %d R (running) spin\n", 1000+i)
	}
	if got := failureDigest("", diag.String()); len(got) != maxDiagnosticLines+1 || !strings.HasPrefix(got[maxDiagnosticLines], "kguest-diag: …") {
		t.Errorf("digest of 100 processes: %d lines, last %q", len(got), got[len(got)-1])
	}
}
