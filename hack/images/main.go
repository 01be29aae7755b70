// Command images builds Plinth's container image archives (make images): one tar per image
// under -out, each an OCI image layout plus a docker-save manifest, reproducible from the
// commit. See docs/install.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/plinth-storage/plinth/test/framework/imagebuild"
)

func main() {
	var (
		out      = flag.String("out", "bin/images", "folder for the archives (<name>.tar)")
		debs     = flag.String("debs", "", "cache of Debian .deb files (default <out>/.debs)")
		version  = flag.String("version", "", "Plinth's version: the tag of plinth and plinth-scheduler")
		revision = flag.String("revision", "", "the Git commit the images are built from")
		source   = flag.String("source", "https://github.com/plinth-storage/plinth", "repository URL for the source label")
		plinth   = flag.String("plinth", "", "static plinth binary")
		pause    = flag.String("pause", "", "static pause binary")
		binDir   = flag.String("bindir", "bin", "folder with the static plinth-scheduler and CSI sidecar binaries (make testbin)")
		versions = flag.String("versions", "test/tools/versions.env", "the sidecar versions file")
		only     = flag.String("only", "", "comma-separated image names to build (default: all)")
	)
	flag.Parse()
	if err := run(*out, *debs, *version, *revision, *source, *plinth, *pause, *binDir, *versions, *only); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(out, debs, version, revision, source, plinth, pause, binDir, versions, only string) error {
	epoch, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	if err != nil {
		return fmt.Errorf("SOURCE_DATE_EPOCH must hold the commit's time in seconds (git log -1 --format=%%ct): %w", err)
	}
	if version == "" || revision == "" || plinth == "" || pause == "" {
		return fmt.Errorf("-version, -revision, -plinth and -pause are required")
	}
	sidecars, err := imagebuild.ReadVersions(versions)
	if err != nil {
		return err
	}
	if debs == "" {
		debs = filepath.Join(out, ".debs")
	}
	var names []string
	if only != "" {
		names = strings.Split(only, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	in := imagebuild.Inputs{
		Version: version, Revision: revision, Source: source, Created: time.Unix(epoch, 0),
		Plinth: plinth, Pause: pause, BinDir: binDir, Sidecars: sidecars, DebCache: debs, Log: os.Stdout,
	}
	start := time.Now()
	res, err := imagebuild.BuildAll(ctx, in, out, names)
	if err != nil {
		return err
	}
	fmt.Printf("%d images in %s (%.0fs)\n", len(res), out, time.Since(start).Seconds())
	return nil
}
