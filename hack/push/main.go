// Command push pushes the image archives of `make images` to a registry (make push
// REGISTRY=host:port): each image keeps its repository path and tag under the registry
// (ghcr.io/plinth-storage/plinth:v0.1.0 → host:port/plinth-storage/plinth:v0.1.0), with its
// manifest's digest unchanged. No Docker: go-containerregistry, with the credentials of
// ~/.docker/config.json when the registry needs some. See docs/install.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/plinth-storage/plinth/test/framework/registry"
)

func main() {
	var (
		reg      = flag.String("registry", "", "the registry to push to: host, host:port or host:port/prefix (required)")
		dir      = flag.String("dir", "bin/images", "folder of the archives of make images (<name>.tar); ignored when archives are named as arguments")
		insecure = flag.Bool("insecure", false, "plain HTTP to a registry that is not on loopback (loopback is always plain HTTP)")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: push -registry host:port [-insecure] [-dir bin/images | ARCHIVE.tar...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*reg, *dir, *insecure, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "push:", err)
		os.Exit(1)
	}
}

func run(reg, dir string, insecure bool, archives []string) error {
	if reg == "" {
		return fmt.Errorf("-registry is required (make push REGISTRY=host:port)")
	}
	if len(archives) == 0 {
		var err error
		if archives, err = filepath.Glob(filepath.Join(dir, "*.tar")); err != nil {
			return err
		}
		if len(archives) == 0 {
			return fmt.Errorf("no image archives in %s (run make images first)", dir)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pushed, err := registry.Push(ctx, reg, insecure, archives...)
	for _, p := range pushed {
		fmt.Printf("%-52s → %s@%s\n", p.Source, p.Target, p.Digest)
	}
	if err != nil {
		return err
	}
	fmt.Printf("%d images pushed to %s\n", len(pushed), reg)
	return nil
}
