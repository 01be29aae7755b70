// Command kguest boots the kernel-test guest once and runs Go test binaries
// in it one after another (test/kernel/run.sh uses it). Each binary runs with
// PLINTH_KERNEL_TEST=1 and -test.v; its output streams to stdout. After a
// binary fails, the guest's processes, memory and blocked tasks are reported,
// and a digest of what failed is printed before the closing summary. The exit
// code is 0 only when every binary passed.
//
// A binary that has not exited -hang-after its start (its -test.timeout plus two
// minutes: a process blocked in the kernel keeps the binary from exiting after its
// timeout panic) is reported hung by name, with the same diagnostics, instead of
// holding the guest until its whole-life timeout ends qemu.
//
//	kguest [-disks 2G,4G,4G,1G] [-timeout 30m] [-hang-after 17m] [-mem MiB] [-sh SCRIPT] BINARY[=PKGDIR]...
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/plinth-storage/plinth/test/kernel/guest"
)

func main() {
	os.Exit(run())
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}

// prefixWriter prefixes each console line so it is told apart from test output.
type prefixWriter struct {
	w   io.Writer
	bol bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		if p.bol {
			io.WriteString(p.w, "guest-console| ")
		}
		io.WriteString(p.w, strings.TrimRight(line, "\r\n")+map[bool]string{true: "\n", false: ""}[strings.HasSuffix(line, "\n")])
		p.bol = strings.HasSuffix(line, "\n")
	}
	return len(b), nil
}

// testTimeout is each binary's -test.timeout; hangGrace the time after it that a binary
// still running is reported hung (its timeout panic prints within seconds; a binary that
// outlives it has a thread blocked in the kernel).
const (
	testTimeout = 15 * time.Minute
	hangGrace   = 2 * time.Minute
)

// runner runs a shell script in the guest (*guest.Guest.Run).
type runner interface {
	Run(ctx context.Context, script string, w io.Writer) (guest.Result, error)
}

// binaryResult is the outcome of one test binary for kguest's summary and digest.
type binaryResult struct {
	summary     string   // the summary table's line
	failed      bool     // exit code not 0, hung, or not run to its end
	digest      []string // what failed, digested (failureDigest), headed by the binary's name
	interrupted bool     // kguest's context ended (signal): run no more binaries
}

// runBinary runs script (one test binary) in the guest, its output streamed to out, and
// reports it. A binary still running hangAfter after its start is reported hung: the guest
// command keeps running (a task blocked in the kernel cannot be killed), the guest's
// diagnostics (guestDiagnostics, run beside it) go to out and into the digest, and the
// caller goes on with the next binary. After a failed exit the same diagnostics run.
func runBinary(ctx context.Context, g runner, name, script string, hangAfter time.Duration, out io.Writer) binaryResult {
	t0 := time.Now()
	bctx, cancel := context.WithTimeout(ctx, hangAfter)
	w := bufio.NewWriter(out)
	res, err := g.Run(bctx, script, flushWriter{w})
	cancel()
	w.Flush()
	d := time.Since(t0)
	hung := err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)
	status := "ok"
	switch {
	case hung:
		status = fmt.Sprintf("HUNG (still running %s after its start; -test.timeout %s)", hangAfter, testTimeout)
	case err != nil || res.ExitCode != 0:
		status = fmt.Sprintf("FAIL (exit %d, %v)", res.ExitCode, err)
	}
	fmt.Fprintf(out, "=== KERNEL %s %s %.1fs\n", name, status, d.Seconds())
	r := binaryResult{summary: fmt.Sprintf("  %-20s %s %.1fs", name, status, d.Seconds()), failed: status != "ok"}
	if err != nil && ctx.Err() != nil {
		r.interrupted = true
		return r
	}
	if !r.failed {
		return r
	}
	var diag []byte
	if err == nil || hung {
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Minute)
		dres, _ := g.Run(dctx, guestDiagnostics, out)
		dcancel()
		diag = dres.Output
	}
	r.digest = append([]string{"--- " + name + " " + status + " ---"}, failureDigest(string(res.Output), string(diag))...)
	return r
}

func run() int {
	disks := flag.String("disks", "2G,4G,4G,1G", "comma-separated sizes of the spare virtio disks /dev/vda, /dev/vdb, ...")
	timeout := flag.Duration("timeout", 30*time.Minute, "bound on the guest's whole life")
	mem := flag.Int("mem", 1024, "guest memory in MiB")
	shell := flag.String("sh", "", "run this shell script in the guest (after the binaries), output to stdout")
	hangAfter := flag.Duration("hang-after", testTimeout+hangGrace, "a test binary still running this long after its start is reported hung: its output so far and the guest's diagnostics are printed, and the next binary runs")
	flavor := flag.String("flavor", guest.FlavorStable, "kernel of test/kernel/setup.sh: stable (with ZFS), backports (NVMe auth, TLS) or node (backports + node-assets.sh)")
	flag.Parse()
	var sizes []int64
	for _, s := range strings.Split(*disks, ",") {
		if s == "" {
			continue
		}
		n, err := parseSize(s)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kguest: bad disk size %q\n", s)
			return 2
		}
		sizes = append(sizes, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	start := time.Now()
	g, err := guest.Boot(ctx, guest.Options{
		Flavor:    *flavor,
		DiskBytes: sizes,
		MemoryMiB: *mem,
		Timeout:   *timeout,
		Console:   &prefixWriter{w: os.Stderr, bol: true},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kguest: %v\n", err)
		return 1
	}
	defer g.Stop()
	fmt.Printf("TIMING guest-boot %.1fs (pid %d)\n", g.BootTime.Seconds(), g.PID())

	failed := 0
	var summary, digest []string
	for _, arg := range flag.Args() {
		// BINARY[=PKGDIR]: with PKGDIR, its testdata/ is copied along and the
		// binary runs in the copy's folder, as go test runs it in the package.
		bin, pkgDir, _ := strings.Cut(arg, "=")
		name := filepath.Base(bin)
		if err := copyFile(bin, filepath.Join(g.ShareDir(), name)); err != nil {
			fmt.Fprintf(os.Stderr, "kguest: %v\n", err)
			return 1
		}
		cwd := "/tmp"
		if pkgDir != "" {
			if _, err := os.Stat(filepath.Join(pkgDir, "testdata")); err == nil {
				dst := filepath.Join(g.ShareDir(), name+".d")
				if err := os.CopyFS(filepath.Join(dst, "testdata"), os.DirFS(filepath.Join(pkgDir, "testdata"))); err != nil {
					fmt.Fprintf(os.Stderr, "kguest: testdata: %v\n", err)
					return 1
				}
				cwd = guest.SharePath + "/" + name + ".d"
			}
		}
		fmt.Printf("=== KERNEL %s\n", name)
		script := fmt.Sprintf("cd %s && PLINTH_KERNEL_TEST=1 %s/%s -test.v -test.count=1 -test.timeout=%s", cwd, guest.SharePath, name, testTimeout)
		r := runBinary(ctx, g, name, script, *hangAfter, os.Stdout)
		summary = append(summary, r.summary)
		if r.failed {
			failed++
			digest = append(digest, r.digest...)
		}
		if r.interrupted {
			break
		}
	}
	if *shell != "" {
		res, err := g.Run(ctx, *shell, os.Stdout)
		if err != nil || res.ExitCode != 0 {
			failed++
			summary = append(summary, fmt.Sprintf("  -sh script: exit %d, %v", res.ExitCode, err))
		}
	}
	g.Stop()
	fmt.Printf("TIMING kernel-suite %.1fs (boot %.1fs)\n", time.Since(start).Seconds(), g.BootTime.Seconds())
	// The digest comes before the table: CI shows the log's tail.
	if len(digest) > 0 {
		fmt.Println("kguest: what failed (the lines above, digested):")
		for _, l := range digest {
			fmt.Println("  " + l)
		}
	}
	for _, s := range summary {
		fmt.Println(s)
	}
	if failed > 0 {
		fmt.Printf("kguest: %d test binaries failed\n", failed)
		return 1
	}
	return 0
}

type flushWriter struct{ w *bufio.Writer }

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	f.w.Flush()
	return n, err
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
