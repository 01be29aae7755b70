package imagebuild

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ReadVersions reads a shell file of KEY=VALUE lines (test/tools/versions.env) and returns the
// version of each sidecar in Sidecars, keyed by binary name (csi-provisioner ←
// CSI_PROVISIONER_VERSION, snapshot-controller ← CSI_SNAPSHOTTER_VERSION).
func ReadVersions(file string) (map[string]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			vars[k] = strings.Trim(v, `"'`)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	out := map[string]string{}
	for _, s := range Sidecars {
		key := s.versionVar()
		if vars[key] == "" {
			return nil, fmt.Errorf("%s: no %s", file, key)
		}
		out[s.Name] = vars[key]
	}
	return out, nil
}

// BuildAll builds the images of the catalogue whose names are in only (all when only is
// empty) into outDir/<name>.tar and returns what it wrote, in catalogue order. It stops at the
// first error, which names the image.
func BuildAll(ctx context.Context, in Inputs, outDir string, only []string) ([]Result, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	want, unknown := map[string]bool{}, map[string]bool{}
	for _, n := range only {
		want[n], unknown[n] = true, true
	}
	for _, im := range Catalogue() {
		delete(unknown, im.Name)
	}
	for n := range unknown {
		var known []string
		for _, im := range Catalogue() {
			known = append(known, im.Name)
		}
		return nil, fmt.Errorf("no image named %q (known: %s)", n, strings.Join(known, ", "))
	}
	var results []Result
	for _, im := range Catalogue() {
		if len(want) > 0 && !want[im.Name] {
			continue
		}
		start := time.Now()
		spec, err := im.Spec(ctx, in)
		if err != nil {
			return results, fmt.Errorf("image %s: %w", im.Name, err)
		}
		img, err := Build(spec, in.Created)
		if err != nil {
			return results, fmt.Errorf("image %s: %w", im.Name, err)
		}
		res, err := WriteArchive(filepath.Join(outDir, im.Name+".tar"), spec.Ref, img, in.Created)
		if err != nil {
			return results, fmt.Errorf("image %s: %w", im.Name, err)
		}
		fmt.Fprintf(in.Log, "%-18s %-52s %s %6.1f MiB %5.1fs\n", im.Name, res.Ref, res.Digest, float64(res.Size)/(1<<20), time.Since(start).Seconds())
		results = append(results, res)
	}
	return results, nil
}
