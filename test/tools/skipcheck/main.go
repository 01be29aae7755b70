// Command skipcheck counts the tests that skipped in a run of make test and fails the run when
// one skipped that is not on the allow-list (allow.txt beside this file): under CI a skip is
// either a gate by design, named and explained there, or a failure in disguise.
//
// Each test phase of the Makefile pipes its output through it, and the test target ends with
// a report:
//
//	go test -json ./... | skipcheck json -phase integration -dir bin/test-skips
//	test/kernel/run.sh  | skipcheck text -phase kernel-guest -dir bin/test-skips
//	skipcheck report -allow test/tools/skipcheck/allow.txt -dir bin/test-skips
//
// json reads `go test -json` and prints what plain `go test` would (package results, the output
// of failed tests) plus every skip with its reason; text passes `-test.v` output through
// unchanged (the kernel guest's stream, where the package is the test binary named by kguest's
// "=== KERNEL <binary>" lines). Both write <dir>/<phase>.skips, one skip a line:
// phase, package, test, reason, tab-separated; a phase run again replaces its file. The exit
// status of the tests travels through the pipeline (make's pipefail), not through skipcheck.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: skipcheck json|text|report [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("skipcheck "+os.Args[1], flag.ExitOnError)
	phase := fs.String("phase", "", "name of the test phase (json, text)")
	dir := fs.String("dir", "", "folder of the <phase>.skips files")
	allow := fs.String("allow", "", "allow-list file (report)")
	fs.Parse(os.Args[2:]) //nolint:errcheck // ExitOnError
	var err error
	switch os.Args[1] {
	case "json", "text":
		if *phase == "" || *dir == "" {
			err = errors.New("-phase and -dir are required")
			break
		}
		var skips []Skip
		if os.Args[1] == "json" {
			skips, err = FilterJSON(os.Stdin, os.Stdout, *phase)
		} else {
			skips, err = FilterText(os.Stdin, os.Stdout, *phase)
		}
		if werr := writeSkips(*dir, *phase, skips); err == nil {
			err = werr
		}
	case "report":
		if *allow == "" || *dir == "" {
			err = errors.New("-allow and -dir are required")
			break
		}
		var ok bool
		ok, err = report(os.Stdout, *allow, *dir)
		if err == nil && !ok {
			os.Exit(1)
		}
	default:
		err = fmt.Errorf("unknown mode %q (json, text, report)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "skipcheck: %v\n", err)
		os.Exit(2)
	}
}

// Skip is one skipped test: the phase of make test, the package (import path, or test binary
// in the kernel guest), the test's full name (subtests with "/") and the first line it logged.
type Skip struct {
	Phase, Package, Test, Reason string
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// FilterJSON reads `go test -json` from r, writes to w what a reader of the log needs (package
// results, build errors, output of failed tests, each skip with its reason) and returns the
// skips of the given phase. A line that is not JSON (go's own errors) is copied through.
func FilterJSON(r io.Reader, w io.Writer, phase string) ([]Skip, error) {
	var skips []Skip
	buf := map[string][]string{} // package + "\x00" + test → output lines
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch {
		case e.Action == "build-output":
			io.WriteString(w, e.Output) //nolint:errcheck
		case e.Action == "output" && e.Test == "":
			if e.Output != "PASS\n" {
				io.WriteString(w, e.Output) //nolint:errcheck
			}
		case e.Action == "output":
			buf[key] = append(buf[key], e.Output)
		case e.Action == "fail" && e.Test != "":
			io.WriteString(w, strings.Join(buf[key], "")) //nolint:errcheck
			delete(buf, key)
		case e.Action == "skip" && e.Test != "":
			out := buf[key]
			reason := skipReason(out)
			skips = append(skips, Skip{Phase: phase, Package: e.Package, Test: e.Test, Reason: reason})
			fmt.Fprintf(w, "--- SKIP: %s %s: %s\n", e.Package, e.Test, reason)
			delete(buf, key)
		case e.Action == "pass" && e.Test != "":
			delete(buf, key)
		}
	}
	return skips, sc.Err()
}

// skipReason is the first line a skipped test logged after its === RUN line, without the
// file:line prefix testing adds.
func skipReason(out []string) string {
	for _, l := range out {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- ") {
			continue
		}
		return stripPos(l)
	}
	return "(no reason logged)"
}

var posPrefix = regexp.MustCompile(`^[\w.-]+\.go:\d+: `)

func stripPos(l string) string { return posPrefix.ReplaceAllString(l, "") }

var (
	kernelBinary = regexp.MustCompile(`^=== KERNEL (\S+)$`)
	skipLine     = regexp.MustCompile(`^\s*--- SKIP: (\S+)`)
)

// FilterText copies `-test.v` output from r to w unchanged and returns its skips: a
// "--- SKIP: name" line, its reason the next line; the package is the binary of the last
// "=== KERNEL <binary>" line (test/kernel/cmd/kguest), else "-".
func FilterText(r io.Reader, w io.Writer, phase string) ([]Skip, error) {
	var skips []Skip
	pkg := "-"
	pending := -1 // index of a skip waiting for its reason line
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		l := sc.Text()
		fmt.Fprintln(w, l)
		if pending >= 0 {
			// the reason is the indented line testing prints under "--- SKIP"
			if t := strings.TrimSpace(l); t != l && !strings.HasPrefix(t, "--- ") && !strings.HasPrefix(t, "=== ") {
				skips[pending].Reason = stripPos(t)
			}
			pending = -1
		}
		if m := kernelBinary.FindStringSubmatch(l); m != nil {
			pkg = m[1]
		} else if m := skipLine.FindStringSubmatch(l); m != nil {
			skips = append(skips, Skip{Phase: phase, Package: pkg, Test: m[1], Reason: "(no reason logged)"})
			pending = len(skips) - 1
		}
	}
	return skips, sc.Err()
}

func writeSkips(dir, phase string, skips []Skip) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	for _, s := range skips {
		fmt.Fprintf(&b, "%s\t%s\t%s\t%s\n", s.Phase, s.Package, s.Test, strings.ReplaceAll(s.Reason, "\t", " "))
	}
	return os.WriteFile(filepath.Join(dir, phase+".skips"), []byte(b.String()), 0o644)
}

// Rule is one line of the allow-list: a phase, a package and a test name pattern (path.Match:
// "*" does not cross the "/" of subtests), with the comment block above it as the reason.
type Rule struct {
	Phase, Package, Pattern string
	Line                    int
}

// ParseAllow reads the allow-list: "phase package pattern" lines; '#' starts a comment.
func ParseAllow(r io.Reader) ([]Rule, error) {
	var rules []Rule
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		l := sc.Text()
		if i := strings.Index(l, "#"); i >= 0 {
			l = l[:i]
		}
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d: want \"phase package pattern\", got %q", n, strings.TrimSpace(l))
		}
		if _, err := path.Match(f[2], ""); err != nil {
			return nil, fmt.Errorf("line %d: pattern %q: %w", n, f[2], err)
		}
		rules = append(rules, Rule{Phase: f[0], Package: f[1], Pattern: f[2], Line: n})
	}
	return rules, sc.Err()
}

// Allowed returns the rule that allows s, if any.
func Allowed(rules []Rule, s Skip) (Rule, bool) {
	for _, r := range rules {
		if r.Phase != s.Phase || r.Package != s.Package {
			continue
		}
		if ok, _ := path.Match(r.Pattern, s.Test); ok {
			return r, true
		}
	}
	return Rule{}, false
}

func readSkips(dir string) ([]Skip, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.skips"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var skips []Skip
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for i, l := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
			if l == "" {
				continue
			}
			p := strings.SplitN(l, "\t", 4)
			if len(p) != 4 {
				return nil, fmt.Errorf("%s:%d: want 4 tab-separated fields", f, i+1)
			}
			skips = append(skips, Skip{Phase: p[0], Package: p[1], Test: p[2], Reason: p[3]})
		}
	}
	return skips, nil
}

// report prints every skip of the phases recorded in dir, allowed or not, and the count; ok is
// false when one is not on the allow-list.
func report(w io.Writer, allowFile, dir string) (ok bool, err error) {
	f, err := os.Open(allowFile)
	if err != nil {
		return false, err
	}
	defer f.Close()
	rules, err := ParseAllow(f)
	if err != nil {
		return false, fmt.Errorf("%s: %w", allowFile, err)
	}
	skips, err := readSkips(dir)
	if err != nil {
		return false, err
	}
	var bad []Skip
	fmt.Fprintf(w, "=== skipped tests (allow-list %s)\n", allowFile)
	for _, s := range skips {
		if r, ok := Allowed(rules, s); ok {
			fmt.Fprintf(w, "  allowed (%s:%d)  %s %s %s: %s\n", allowFile, r.Line, s.Phase, s.Package, s.Test, s.Reason)
		} else {
			bad = append(bad, s)
		}
	}
	for _, s := range bad {
		fmt.Fprintf(w, "  NOT ALLOWED       %s %s %s: %s\n", s.Phase, s.Package, s.Test, s.Reason)
	}
	fmt.Fprintf(w, "SKIPPED %d tests: %d on the allow-list, %d not\n", len(skips), len(skips)-len(bad), len(bad))
	if len(bad) > 0 {
		fmt.Fprintln(w, "FAIL: a test skipped that is not on the allow-list: fix its prerequisite, or add it with the reason to the allow-list")
	}
	return len(bad) == 0, nil
}
