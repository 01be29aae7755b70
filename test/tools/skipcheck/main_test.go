package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const pkg = "example.com/p"

func TestFilterJSON(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"start","Package":"example.com/p"}`,
		`{"Action":"run","Package":"example.com/p","Test":"TestPass"}`,
		`{"Action":"output","Package":"example.com/p","Test":"TestPass","Output":"=== RUN   TestPass\n"}`,
		`{"Action":"output","Package":"example.com/p","Test":"TestPass","Output":"    x_test.go:3: chatter of a passing test\n"}`,
		`{"Action":"pass","Package":"example.com/p","Test":"TestPass"}`,
		`{"Action":"output","Package":"example.com/p","Test":"TestSkip/sub","Output":"=== RUN   TestSkip/sub\n"}`,
		`{"Action":"output","Package":"example.com/p","Test":"TestSkip/sub","Output":"    x_test.go:9: SKIP: needs root\n"}`,
		`{"Action":"output","Package":"example.com/p","Test":"TestSkip/sub","Output":"--- SKIP: TestSkip/sub (0.00s)\n"}`,
		`{"Action":"skip","Package":"example.com/p","Test":"TestSkip/sub"}`,
		`{"Action":"pass","Package":"example.com/p","Test":"TestSkip"}`,
		`{"Action":"output","Package":"example.com/p","Test":"TestFail","Output":"    x_test.go:12: it broke\n"}`,
		`{"Action":"fail","Package":"example.com/p","Test":"TestFail"}`,
		`{"Action":"output","Package":"example.com/p","Output":"PASS\n"}`,
		`{"Action":"output","Package":"example.com/p","Output":"FAIL\texample.com/p\t0.1s\n"}`,
		`{"Action":"build-output","ImportPath":"example.com/q","Output":"q.go:1: syntax error\n"}`,
		`go: warning: not json`,
	}, "\n")
	var out strings.Builder
	skips, err := FilterJSON(strings.NewReader(in), &out, "integration")
	if err != nil {
		t.Fatal(err)
	}
	want := []Skip{{Phase: "integration", Package: pkg, Test: "TestSkip/sub", Reason: "SKIP: needs root"}}
	if len(skips) != 1 || skips[0] != want[0] {
		t.Errorf("skips %+v, want %+v", skips, want)
	}
	got := out.String()
	for _, s := range []string{"it broke", "FAIL\texample.com/p", "syntax error", "--- SKIP: example.com/p TestSkip/sub: SKIP: needs root", "go: warning: not json"} {
		if !strings.Contains(got, s) {
			t.Errorf("output lacks %q:\n%s", s, got)
		}
	}
	if strings.Contains(got, "chatter of a passing test") {
		t.Errorf("output of a passing test printed:\n%s", got)
	}
}

func TestFilterText(t *testing.T) {
	in := "=== KERNEL agents_lvm.test\n=== RUN   TestA\n--- SKIP: TestA (0.00s)\n    guest_test.go:31: kernel test: set X\n=== RUN   TestB\n    --- SKIP: TestB/c (0.00s)\n" +
		"=== KERNEL agents_lvm.test PASS 1.0s\n"
	var out strings.Builder
	skips, err := FilterText(strings.NewReader(in), &out, "kernel-guest")
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != in {
		t.Errorf("text not passed through unchanged:\n%s", out.String())
	}
	want := []Skip{
		{Phase: "kernel-guest", Package: "agents_lvm.test", Test: "TestA", Reason: "kernel test: set X"},
		{Phase: "kernel-guest", Package: "agents_lvm.test", Test: "TestB/c", Reason: "(no reason logged)"},
	}
	if len(skips) != len(want) {
		t.Fatalf("skips %+v, want %+v", skips, want)
	}
	for i := range want {
		if skips[i] != want[i] {
			t.Errorf("skip %d: %+v, want %+v", i, skips[i], want[i])
		}
	}
}

func TestReport(t *testing.T) {
	dir := t.TempDir()
	allow := filepath.Join(dir, "allow.txt")
	os.WriteFile(allow, []byte("# gates\nintegration example.com/p TestGuest*\n"), 0o644)
	skips := filepath.Join(dir, "skips")
	if err := writeSkips(skips, "integration", []Skip{
		{Phase: "integration", Package: pkg, Test: "TestGuestA", Reason: "gate"},
		{Phase: "integration", Package: pkg, Test: "TestGuestA/sub", Reason: "a subtest is not matched by *"},
	}); err != nil {
		t.Fatal(err)
	}
	if err := writeSkips(skips, "kernel-guest", []Skip{{Phase: "kernel-guest", Package: pkg, Test: "TestGuestB", Reason: "same test, other phase"}}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	ok, err := report(&out, allow, skips)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Errorf("report ok with two skips off the allow-list:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "SKIPPED 3 tests: 1 on the allow-list, 2 not") {
		t.Errorf("report:\n%s", out.String())
	}
	os.Remove(filepath.Join(skips, "kernel-guest.skips"))
	writeSkips(skips, "integration", []Skip{{Phase: "integration", Package: pkg, Test: "TestGuestA", Reason: "gate"}})
	out.Reset()
	if ok, err := report(&out, allow, skips); err != nil || !ok {
		t.Errorf("report of allowed skips: %v, %v\n%s", ok, err, out.String())
	}
}

func TestParseAllowErrors(t *testing.T) {
	for _, in := range []string{"integration pkg\n", "integration pkg Test[\n", "a b c d\n"} {
		if _, err := ParseAllow(strings.NewReader(in)); err == nil {
			t.Errorf("ParseAllow(%q): no error", in)
		}
	}
}

// TestAllowListNamesRealTests: every line of the committed allow-list names a package of this
// repository and a test function that exists there, so a renamed test cannot leave a stale line.
func TestAllowListNamesRealTests(t *testing.T) {
	f, err := os.Open("allow.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rules, err := ParseAllow(f)
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/plinth-storage/plinth/"
	for _, r := range rules {
		dir := filepath.Join("..", "..", "..", strings.TrimPrefix(r.Package, module))
		files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
		found := false
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(string(data), "\n") {
				name, ok := strings.CutPrefix(l, "func ")
				if !ok {
					continue
				}
				name, _, _ = strings.Cut(name, "(")
				if _, ok := Allowed([]Rule{r}, Skip{Phase: r.Phase, Package: r.Package, Test: name}); ok {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("allow.txt:%d: no test in %s matches %s", r.Line, dir, r.Pattern)
		}
	}
}
