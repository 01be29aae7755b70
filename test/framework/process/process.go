// Package process starts and owns long-running child processes — etcd,
// kube-apiserver, containerd, kubelet, a CSI sidecar — each with its own log
// file, a readiness check, and an error that names the process and ends with
// the tail of its log when it does not come up. The test control plane
// (test/framework/controlplane), the node harness (test/framework/cluster) and the
// registry (test/framework/registry) start their processes through it.
package process

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Spec describes a process to start and own: a scheduler, a CSI sidecar, a
// driver under test, a kubelet.
type Spec struct {
	// Name names the process in errors and its log file (<Dir>/logs/<Name>.log).
	Name string
	// Binary is a name in the test bin folder or an absolute path (read by
	// the callers that resolve it; Start takes the path itself).
	Binary string
	Args   []string
	// Env is added to the test's environment.
	Env []string
	// Ready, when set, is polled every 100 ms until it returns nil (the process
	// serves) or ReadyTimeout passes; nil means started is enough.
	Ready        func(ctx context.Context) error
	ReadyTimeout time.Duration
}

// Process is a running child process with its log file.
type Process struct {
	Name    string
	Path    string
	Args    []string
	LogPath string

	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error // Wait result, set before done closes
}

// PID returns the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string {
	data, _ := os.ReadFile(p.LogPath)
	return Tail(data, n)
}

// Err is the process's exit error (nil for a clean exit), valid once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Tail returns the last n lines of data.
func Tail(data []byte, n int) string {
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// TailLines is how many log lines a start-up error carries.
const TailLines = 25

// Start starts the executable at path with spec's arguments, its output
// appended to <logDir>/<spec.Name>.log, and waits until spec.Ready. On any
// error the process is killed and the error (a *Error once it ran) names it
// and ends with the tail of its log. ctx bounds start-up only.
func Start(ctx context.Context, path, logDir string, spec Spec) (*Process, error) {
	if spec.Name == "" {
		spec.Name = filepath.Base(path)
	}
	logPath := filepath.Join(logDir, spec.Name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", spec.Name, err)
	}
	fmt.Fprintf(logf, "### %s %s\n", path, strings.Join(spec.Args, " "))
	cmd := exec.Command(path, spec.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), spec.Env...)
	// Own process group so a terminal's ^C reaches the test, not each child
	// first; Pdeathsig so a killed test leaves no orphans.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: start %s: %w", spec.Name, path, err)
	}
	p := &Process{Name: spec.Name, Path: path, Args: spec.Args, LogPath: logPath, cmd: cmd, log: logf, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if spec.Ready == nil {
		return p, nil
	}
	timeout := spec.ReadyTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	if err := p.waitReady(ctx, spec.Ready, timeout); err != nil {
		p.stop(2 * time.Second)
		return nil, err
	}
	return p, nil
}

func (p *Process) waitReady(ctx context.Context, ready func(context.Context) error, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		select {
		case <-p.done:
			return p.failure(fmt.Sprintf("exited during start-up (%v)", p.err))
		default:
		}
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		last = ready(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.done:
			return p.failure(fmt.Sprintf("exited during start-up (%v)", p.err))
		case <-ctx.Done():
			return p.failure(fmt.Sprintf("not ready after %s: %v", timeout, last))
		case <-tick.C:
		}
	}
}

// Failure builds the error of a process that did not come up or died: what
// happened, ending with the tail of its log.
func (p *Process) Failure(what string) error {
	return &Error{Name: p.Name, What: what, LogPath: p.LogPath, Tail: p.Tail(TailLines)}
}

func (p *Process) failure(what string) error { return p.Failure(what) }

// Error says a process failed to start or died; Tail is the end of its log.
type Error struct {
	Name, What, LogPath, Tail string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s; last lines of %s:\n%s", e.Name, e.What, e.LogPath, Indent(e.Tail))
}

// Indent indents every line of s by four spaces (log tails inside errors).
func Indent(s string) string {
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// AddrInUse reports whether a start-up failure is a lost race for a port
// picked free a moment before (another process took it).
func AddrInUse(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && strings.Contains(pe.Tail, "address already in use")
}

// StopWithin sends SIGTERM to the process (by PID), then SIGKILL after
// grace, and waits until it is reaped.
func (p *Process) StopWithin(grace time.Duration) error { return p.stop(grace) }

// stop sends SIGTERM to the process (by PID), then SIGKILL after grace, and
// waits until it is reaped.
func (p *Process) stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = syscall.Kill(p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(p.PID(), syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.PID())
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago (another process may
// take it before the caller binds it; callers that start servers on it retry or fail clearly).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// HTTPReady returns a Ready check that wants 200 from url. With tlsConfig nil
// an https url is probed without verifying the certificate (components that
// serve self-signed health endpoints).
func HTTPReady(url string, tlsConfig *tls.Config) func(context.Context) error {
	if tlsConfig == nil {
		tlsConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // loopback health probe of a self-signed test server
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true}}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s: %s", url, resp.Status, Tail(body, 5))
		}
		return nil
	}
}

// SocketReady returns a Ready check that wants a unix socket at path to accept.
func SocketReady(path string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// Stop ends the process (SIGTERM, SIGKILL after 5 s) and waits until it is
// reaped; an owner's Stop then skips it.
func (p *Process) Stop() error { return p.stop(5 * time.Second) }
