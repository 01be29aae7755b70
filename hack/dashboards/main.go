// Command dashboards writes Plinth's Grafana dashboards (internal/dashboards) as JSON into a
// folder: `make generate` runs it with -out kustomize/monitoring/dashboards.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/plinth-storage/plinth/internal/dashboards"
)

func main() {
	out := flag.String("out", "kustomize/monitoring/dashboards", "folder the dashboard JSON files are written to")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "dashboards:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, s := range dashboards.All() {
		data, err := s.JSON()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, s.File), data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", s.File, err)
		}
	}
	return nil
}
