package registry

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/plinth-storage/plinth/test/framework/process"
)

// DefaultBinary is Debian's docker-registry package's server (CNCF distribution).
const DefaultBinary = "/usr/bin/docker-registry"

// ServerOptions say how to run a registry.
type ServerOptions struct {
	// Binary is the docker-registry executable (DefaultBinary when empty).
	Binary string
	// Dir holds the registry's storage (Dir/storage), config (Dir/config.yml) and log
	// (Dir/docker-registry.log). It must exist.
	Dir string
	// Port is the TCP port on 127.0.0.1; 0 takes a free one.
	Port int
}

// Server is a running docker-registry serving plain HTTP on 127.0.0.1.
type Server struct {
	// Addr is "127.0.0.1:<port>": the registry part of image names pushed to it.
	Addr string
	proc *process.Process
}

// config is the registry's configuration (distribution's config.yml, version 0.1): local
// storage, deletes allowed, HTTP on loopback only, no access log.
const config = `version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`

// StartServer starts docker-registry with opts and waits until it answers GET /v2/. A port
// taken between the choice and the bind is chosen again (three tries when opts.Port is 0).
// Errors name the binary when it is missing (Debian package docker-registry) and end with the
// tail of the registry's log when it does not come up.
func StartServer(ctx context.Context, opts ServerOptions) (*Server, error) {
	bin := opts.Binary
	if bin == "" {
		bin = DefaultBinary
	}
	if _, err := exec.LookPath(bin); err != nil {
		return nil, fmt.Errorf("docker-registry: %w (Debian package docker-registry, hack/install-deps.sh)", err)
	}
	storage := filepath.Join(opts.Dir, "storage")
	if err := os.MkdirAll(storage, 0o755); err != nil {
		return nil, err
	}
	tries := 1
	if opts.Port == 0 {
		tries = 3
	}
	var err error
	for range tries {
		port := opts.Port
		if port == 0 {
			if port, err = process.FreePort(); err != nil {
				return nil, err
			}
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cfg := filepath.Join(opts.Dir, "config.yml")
		if err := os.WriteFile(cfg, fmt.Appendf(nil, config, storage, addr), 0o644); err != nil {
			return nil, err
		}
		var p *process.Process
		p, err = process.Start(ctx, bin, opts.Dir, process.Spec{
			Name:         "docker-registry",
			Args:         []string{"serve", cfg},
			Ready:        process.HTTPReady("http://"+addr+"/v2/", nil),
			ReadyTimeout: 30 * time.Second,
		})
		if err == nil {
			return &Server{Addr: addr, proc: p}, nil
		}
		if !process.AddrInUse(err) {
			break
		}
	}
	return nil, fmt.Errorf("start docker-registry: %w", err)
}

// LogPath is the registry's log file.
func (s *Server) LogPath() string { return s.proc.LogPath }

// Tail returns the last n lines of the registry's log.
func (s *Server) Tail(n int) string { return s.proc.Tail(n) }

// Stop ends the registry (SIGTERM, then SIGKILL after 5 s) and waits until it has exited.
func (s *Server) Stop() error { return s.proc.Stop() }
