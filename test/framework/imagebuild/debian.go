package imagebuild

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Package is one Debian binary package as the apt metadata describes its candidate version.
type Package struct {
	Name         string
	Version      string
	Architecture string
	// SHA256 is the hex digest of the .deb, from the metadata; Fetch checks it.
	SHA256 string
	// Size is the .deb's size in bytes.
	Size int64
	// Depends holds Pre-Depends and Depends: each element one dependency, its alternatives
	// as package names (version constraints and architecture qualifiers dropped).
	Depends [][]string
}

// DebFile is the name `apt-get download` gives the package's file: name_version_arch.deb, the
// epoch's colon written %3a. It is the cache key: a new version is a new file.
func (p Package) DebFile() string {
	return fmt.Sprintf("%s_%s_%s.deb", p.Name, strings.ReplaceAll(p.Version, ":", "%3a"), p.Architecture)
}

// AptCache runs apt-cache; a variable so tests can point at their own apt configuration.
var AptCache = "apt-cache"

// ShowPackages returns the candidate version of each named package the apt metadata has, from
// one `apt-cache show --no-all-versions` call. Names it lacks (unknown or purely virtual) are
// absent from the result; the caller decides whether that is an error.
func ShowPackages(ctx context.Context, names []string) (map[string]Package, error) {
	out := map[string]Package{}
	if len(names) == 0 {
		return out, nil
	}
	args := append([]string{"show", "--no-all-versions"}, names...)
	stdout, err := exec.CommandContext(ctx, AptCache, args...).Output()
	if err != nil && len(stdout) == 0 {
		if len(names) == 1 {
			return out, nil // apt-cache fails when it finds nothing at all
		}
		return nil, fmt.Errorf("apt-cache show %s: %w%s", strings.Join(names, " "), err, stderrOf(err))
	}
	for _, stanza := range bytes.Split(stdout, []byte("\n\n")) {
		p, err := parseStanza(stanza)
		if err != nil {
			return nil, err
		}
		if p.Name != "" {
			out[p.Name] = p
		}
	}
	return out, nil
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return ": " + strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}

// parseStanza reads the fields Package, Version, Architecture, SHA256, Size, Pre-Depends and
// Depends of one deb822 stanza (continuation lines start with a space).
func parseStanza(b []byte) (Package, error) {
	var p Package
	fields := map[string]string{}
	var last string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			if last != "" {
				fields[last] += "\n" + line
			}
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		last = k
		fields[k] = strings.TrimSpace(v)
	}
	if err := sc.Err(); err != nil {
		return p, fmt.Errorf("reading apt-cache output: %w", err)
	}
	p.Name, p.Version, p.Architecture, p.SHA256 = fields["Package"], fields["Version"], fields["Architecture"], fields["SHA256"]
	if p.Name == "" {
		return p, nil
	}
	if p.Version == "" || p.Architecture == "" || p.SHA256 == "" {
		return p, fmt.Errorf("debian package %s: apt metadata lacks Version, Architecture or SHA256", p.Name)
	}
	if _, err := fmt.Sscan(fields["Size"], &p.Size); err != nil {
		return p, fmt.Errorf("debian package %s: Size %q: %w", p.Name, fields["Size"], err)
	}
	for _, f := range []string{"Pre-Depends", "Depends"} {
		p.Depends = append(p.Depends, parseDepends(fields[f])...)
	}
	return p, nil
}

// parseDepends splits a Depends field: "a (>= 1) | b:any, c" → [[a b] [c]].
func parseDepends(s string) [][]string {
	var out [][]string
	for _, dep := range strings.Split(s, ",") {
		var alts []string
		for _, alt := range strings.Split(dep, "|") {
			alt = strings.TrimSpace(alt)
			if i := strings.IndexAny(alt, " (["); i >= 0 {
				alt = alt[:i]
			}
			alt, _, _ = strings.Cut(alt, ":")
			if alt != "" {
				alts = append(alts, alt)
			}
		}
		if len(alts) > 0 {
			out = append(out, alts)
		}
	}
	return out
}

// Resolve returns the dependency closure of roots, sorted by name: every root and, for each
// dependency of a chosen package, the first alternative already chosen or else the first one
// the metadata has. A package in exclude (name → reason) is never chosen: a dependency with an
// excluded alternative and no available one is left out, on purpose (e.g. python3, needed only
// by a script the image does not carry; "debconf | debconf-2.0", a virtual package). A root that is missing is an error naming it.
func Resolve(ctx context.Context, roots []string, exclude map[string]string) ([]Package, error) {
	chosen := map[string]Package{}
	known := map[string]Package{} // metadata seen, chosen or not
	absent := map[string]bool{}   // names apt-cache does not show (virtual)
	for _, r := range roots {
		if reason, ok := exclude[r]; ok {
			return nil, fmt.Errorf("debian package %s is both wanted and excluded (%s)", r, reason)
		}
	}
	ps, err := ShowPackages(ctx, roots)
	if err != nil {
		return nil, err
	}
	frontier := []Package{}
	for _, r := range roots {
		if _, ok := ps[r]; !ok {
			return nil, fmt.Errorf("debian package %q: not in the apt metadata (is the name right, and has `apt-get update` run?)", r)
		}
		chosen[r], known[r] = ps[r], ps[r]
		frontier = append(frontier, ps[r])
	}
	for len(frontier) > 0 {
		// Look up every alternative of this round not seen yet, each name once.
		var ask []string
		seen := map[string]bool{}
		for _, p := range frontier {
			for _, alts := range p.Depends {
				for _, a := range alts {
					if _, ok := known[a]; ok || absent[a] || seen[a] || exclude[a] != "" {
						continue
					}
					seen[a] = true
					ask = append(ask, a)
				}
			}
		}
		sort.Strings(ask)
		got, err := ShowPackages(ctx, ask)
		if err != nil {
			return nil, err
		}
		for _, a := range ask {
			if p, ok := got[a]; ok {
				known[a] = p
			} else {
				absent[a] = true
			}
		}
		var next []Package
		for _, p := range frontier {
		deps:
			for _, alts := range p.Depends {
				for _, a := range alts {
					if _, ok := chosen[a]; ok {
						continue deps
					}
				}
				excluded := false
				for _, a := range alts {
					if exclude[a] != "" {
						excluded = true
						continue
					}
					if q, ok := known[a]; ok {
						chosen[a] = q
						next = append(next, q)
						continue deps
					}
				}
				if !excluded {
					return nil, fmt.Errorf("debian package %s %s depends on %s: none of them is in the apt metadata", p.Name, p.Version, strings.Join(alts, " | "))
				}
			}
		}
		frontier = next
	}
	out := make([]Package, 0, len(chosen))
	for _, p := range chosen {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Fetch makes sure the .deb of every package is in cacheDir (downloading the missing ones with
// `apt-get download name=version` into a temporary folder, then renaming them in) and checks
// each file's SHA256 against the metadata. It returns the paths in the order of pkgs. A failed
// download or a wrong checksum is an error naming the package; no partial file is left under
// the cache name.
func Fetch(ctx context.Context, cacheDir string, pkgs []Package, log io.Writer) ([]string, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	var missing []Package
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(cacheDir, p.DebFile())); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		tmp, err := os.MkdirTemp(cacheDir, ".download-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		// One apt-get call for all of them: each call reads apt's whole cache first.
		args := []string{"download", "-q", "-o", "APT::Sandbox::User=root"}
		var names []string
		for _, p := range missing {
			args = append(args, p.Name+"="+p.Version)
			names = append(names, p.Name+" "+p.Version)
		}
		fmt.Fprintf(log, "  downloading %d debian packages: %s\n", len(missing), strings.Join(names, ", "))
		// As root, apt drops to user _apt, who cannot write here: download as root.
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("downloading debian packages (%s): %w: %s", strings.Join(names, ", "), err, strings.TrimSpace(string(out)))
		}
		for _, p := range missing {
			got := filepath.Join(tmp, p.DebFile())
			if err := checkSHA256(got, p); err != nil {
				return nil, err
			}
			if err := os.Rename(got, filepath.Join(cacheDir, p.DebFile())); err != nil {
				return nil, err
			}
		}
	}
	paths := make([]string, len(pkgs))
	for i, p := range pkgs {
		paths[i] = filepath.Join(cacheDir, p.DebFile())
		if err := checkSHA256(paths[i], p); err != nil {
			return nil, fmt.Errorf("%w (delete it to download it again)", err)
		}
	}
	return paths, nil
}

func checkSHA256(file string, p Package) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("debian package %s %s: %w", p.Name, p.Version, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("debian package %s %s: reading %s: %w", p.Name, p.Version, file, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != p.SHA256 {
		return fmt.Errorf("debian package %s %s: %s has sha256 %s, the apt metadata says %s", p.Name, p.Version, file, got, p.SHA256)
	}
	return nil
}

// AddDeb adds the files of the .deb at file (its data archive, read with `dpkg-deb
// --fsys-tarfile`) to t as origin, keeping the paths keep accepts.
func AddDeb(ctx context.Context, t *Tree, file, origin string, keep func(string) bool) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", file)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb for %s: %w", origin, err)
	}
	addErr := t.AddTar(stdout, origin, keep)
	_, _ = io.Copy(io.Discard, stdout)
	waitErr := cmd.Wait()
	if addErr != nil {
		return addErr
	}
	if waitErr != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", file, waitErr, strings.TrimSpace(stderr.String()))
	}
	return nil
}
