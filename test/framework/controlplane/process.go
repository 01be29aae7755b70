package controlplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"github.com/plinth-storage/plinth/test/framework/process"
)

// ProcessSpec describes a process the control plane starts and owns: a
// scheduler, a CSI sidecar, a driver under test (test/framework/process.Spec).
type ProcessSpec = process.Spec

// Process is a running child process with its log file (test/framework/process.Process).
type Process = process.Process

// ProcessError says a process failed to start or died; Tail is the end of its
// log (test/framework/process.Error).
type ProcessError = process.Error

const tailLines = process.TailLines

// startProcess resolves spec.Binary in binDir and starts it with its output in
// logDir, waiting until Ready (process.Start).
func startProcess(ctx context.Context, binDir, logDir string, spec ProcessSpec) (*Process, error) {
	path, err := BinaryPath(binDir, spec.Binary)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Name, err)
	}
	return process.Start(ctx, path, logDir, spec)
}

func tail(data []byte, n int) string { return process.Tail(data, n) }

func indent(s string) string { return process.Indent(s) }

// addrInUse reports whether a start-up failure is a lost race for a port
// picked free a moment before (another control plane took it).
func addrInUse(err error) bool { return process.AddrInUse(err) }

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago
// (process.FreePort).
func FreePort() (int, error) { return process.FreePort() }

// checkPortFree returns a clear error when a port asked for explicitly is taken.
func checkPortFree(name string, port int) error {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("%s: port 127.0.0.1:%d is taken: %w", name, port, err)
	}
	return l.Close()
}

// HTTPReady returns a Ready check that wants 200 from url (process.HTTPReady).
func HTTPReady(url string, tlsConfig *tls.Config) func(context.Context) error {
	return process.HTTPReady(url, tlsConfig)
}

// SocketReady returns a Ready check that wants a unix socket at path to accept
// (process.SocketReady).
func SocketReady(path string) func(context.Context) error { return process.SocketReady(path) }
