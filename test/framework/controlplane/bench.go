package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
)

// The readers every benchmark of the repository shares: its knobs, the machine's load and
// the CPU and memory of the processes it measures (proc(5)).

// BenchKnob returns the integer in the environment variable name, or def when it is unset; a
// value that is not an integer of at least min fails tb with the variable's name.
func BenchKnob(tb testing.TB, name string, def, min int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		tb.Fatalf("%s=%q: want an integer of at least %d", name, v, min)
	}
	return n
}

// LoadAverage is the 1-, 5- and 15-minute load averages of /proc/loadavg ("0.52 0.61 0.70"),
// or "unknown": benchmarks log it beside their figures.
func LoadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// ProcCPU is the user+system CPU time of process pid (/proc/<pid>/stat fields 14 and 15, in
// clock ticks of 100 Hz as on every Linux this runs on); an unreadable file fails tb.
func ProcCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// the command name may hold spaces: fields start after the last ')'
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	if len(f) < 13 {
		tb.Fatalf("/proc/%d/stat: %d fields after the command name, want at least 13", pid, len(f))
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// ProcStatusMiB is field (VmRSS, VmHWM, RssAnon …), a size in kB of /proc/<pid>/status, in
// MiB; a missing or malformed field fails tb.
func ProcStatusMiB(tb testing.TB, pid int, field string) float64 {
	tb.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				tb.Fatalf("%s of process %d: %v", field, pid, err)
			}
			return kb / 1024
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// Parallel runs f(0) … f(n-1) on workers goroutines and returns when all have returned.
func Parallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for i := g; i < n; i += workers {
				f(i)
			}
		})
	}
	wg.Wait()
}

// ProfileAPIServer starts a CPU profile of the API server behind cs (its /debug/pprof/profile,
// on by default in kube-apiserver) over the next seconds, written to
// $PLINTH_BENCH_OUT/<name>-apiserver.pprof (read it with `go tool pprof`); without
// PLINTH_BENCH_OUT it does nothing. The returned wait blocks until the profile is written and
// fails tb when it could not be taken.
func ProfileAPIServer(tb testing.TB, cs kubernetes.Interface, name string, seconds int) (wait func()) {
	out := os.Getenv("PLINTH_BENCH_OUT")
	if out == "" {
		return func() {}
	}
	done := make(chan error, 1)
	go func() {
		data, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(seconds)).DoRaw(context.Background())
		if err == nil {
			err = os.WriteFile(filepath.Join(out, name+"-apiserver.pprof"), data, 0o644)
		}
		done <- err
	}()
	return func() {
		tb.Helper()
		if err := <-done; err != nil {
			tb.Fatalf("CPU profile of the API server (%s): %v", name, err)
		}
	}
}
