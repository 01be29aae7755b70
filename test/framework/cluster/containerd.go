package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/plinth-storage/plinth/test/framework/process"
)

// DefaultSandboxImage is the pause image containerd's CRI plugin runs as every
// pod's sandbox; it must be imported (Containerd.Import) before the first pod.
const DefaultSandboxImage = "registry.k8s.io/pause:3.10"

// DefaultCNIBinDir is where Debian's containernetworking-plugins install the
// bridge, host-local and loopback plugins.
const DefaultCNIBinDir = "/usr/lib/cni"

// ContainerdOptions configure StartContainerd. Name and Dir are required.
type ContainerdOptions struct {
	// Name names this containerd in errors and its log (containerd-<Name>.log);
	// the node name.
	Name string
	// Dir holds everything of this containerd: root/, state/, opt/,
	// containerd.sock (gRPC), containerd.sock.ttrpc, config.toml, cni/net.d/
	// (unless CNIConfDir). It is created when missing.
	Dir string
	// LogDir receives containerd-<Name>.log; empty means Dir.
	LogDir string
	// Binary is the containerd executable; empty means "containerd" on PATH
	// (Debian's containerd 1.6).
	Binary string
	// SandboxImage defaults to DefaultSandboxImage.
	SandboxImage string
	// CNIConfDir is where the CRI plugin reads its CNI network config; empty
	// means <Dir>/cni/net.d. A node without a config there stays NotReady.
	CNIConfDir string
	// CNIBinDir defaults to DefaultCNIBinDir.
	CNIBinDir string
	// Wrap, when set, prefixes the command line (e.g. nsenter into the node's
	// mount namespace): the process run is Wrap[0] with Wrap[1:] + containerd's
	// own command line as arguments.
	Wrap []string
	// StartTimeout bounds start-up (default 60 s).
	StartTimeout time.Duration
}

// Containerd is a running containerd with its own root, state and sockets.
type Containerd struct {
	// Name is ContainerdOptions.Name.
	Name string
	// Dir is ContainerdOptions.Dir.
	Dir string
	// Socket is the gRPC socket path (what kubelet's containerRuntimeEndpoint
	// and `ctr -a` take).
	Socket string
	// CNIConfDir is the folder the CRI plugin reads CNI configs from.
	CNIConfDir string
	// Namespace is the containerd namespace the CRI plugin uses ("k8s.io").
	Namespace string

	proc *process.Process
	ctr  string
}

// CRINamespace is the containerd namespace kubelet's images and containers live in.
const CRINamespace = "k8s.io"

// containerdConfig is containerd 1.6's config (version 2). restrict_oom_score_adj:
// root here lacks CAP_SYS_RESOURCE, so nothing may lower an oom_score_adj, and
// without it runc fails every sandbox ("can't get final child's PID from pipe").
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
`

// StartContainerd writes a config under opts.Dir, starts containerd and waits
// until its gRPC socket answers `ctr version`. ctx bounds start-up only. The
// error of a containerd that does not come up names opts.Name and ends with
// the tail of its log.
func StartContainerd(ctx context.Context, opts ContainerdOptions) (*Containerd, error) {
	if opts.Name == "" || opts.Dir == "" {
		return nil, errors.New("containerd: Name and Dir are required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	bin := opts.Binary
	if bin == "" {
		bin = "containerd"
	}
	if bin, err = lookPath(bin, "containerd"); err != nil {
		return nil, fmt.Errorf("node %s: %w", opts.Name, err)
	}
	ctr, err := lookPath("ctr", "containerd")
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", opts.Name, err)
	}
	if _, err := lookPath("runc", "runc"); err != nil {
		return nil, fmt.Errorf("node %s: %w", opts.Name, err)
	}
	c := &Containerd{Name: opts.Name, Dir: dir, Socket: filepath.Join(dir, "containerd.sock"),
		CNIConfDir: opts.CNIConfDir, Namespace: CRINamespace, ctr: ctr}
	if c.CNIConfDir == "" {
		c.CNIConfDir = filepath.Join(dir, "cni", "net.d")
	}
	sandbox := opts.SandboxImage
	if sandbox == "" {
		sandbox = DefaultSandboxImage
	}
	cniBin := opts.CNIBinDir
	if cniBin == "" {
		cniBin = DefaultCNIBinDir
	}
	for _, d := range []string{dir, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "opt"), c.CNIConfDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("node %s: containerd: %w", opts.Name, err)
		}
	}
	cfgPath := filepath.Join(dir, "config.toml")
	cfg := fmt.Sprintf(containerdConfig, filepath.Join(dir, "root"), filepath.Join(dir, "state"),
		c.Socket, c.Socket+".ttrpc", filepath.Join(dir, "opt"), sandbox, cniBin, c.CNIConfDir)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("node %s: containerd config: %w", opts.Name, err)
	}
	logDir := opts.LogDir
	if logDir == "" {
		logDir = dir
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	path, args := wrap(opts.Wrap, bin, "--config", cfgPath)
	c.proc, err = process.Start(ctx, path, logDir, process.Spec{
		Name:         "containerd-" + opts.Name,
		Args:         args,
		Ready:        c.ready,
		ReadyTimeout: timeout,
	})
	if err != nil {
		return nil, fmt.Errorf("node %s: containerd did not start: %w", opts.Name, err)
	}
	return c, nil
}

// wrap returns the command that runs bin with args, prefixed by prefix.
func wrap(prefix []string, bin string, args ...string) (string, []string) {
	if len(prefix) == 0 {
		return bin, args
	}
	return prefix[0], append(append(append([]string(nil), prefix[1:]...), bin), args...)
}

func (c *Containerd) ready(ctx context.Context) error {
	if _, err := os.Stat(c.Socket); err != nil {
		return err
	}
	_, err := c.Ctr(ctx, "version")
	return err
}

// Ctr runs `ctr -a <Socket> -n k8s.io ARGS...` and returns its output; the
// error carries ctr's output.
func (c *Containerd) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.ctr, append([]string{"-a", c.Socket, "-n", c.Namespace}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("node %s: ctr %s: %w: %s", c.Name, strings.Join(args, " "), err, strings.TrimSpace(process.Tail(out.Bytes(), 10)))
	}
	return out.Bytes(), nil
}

// Import loads an image archive (an OCI image layout or `docker save` tar,
// its image names in the index annotations) into the k8s.io namespace, where
// kubelet finds it; pods then use it with imagePullPolicy Never or
// IfNotPresent. The error names the node and the archive.
func (c *Containerd) Import(ctx context.Context, archive string) error {
	if _, err := os.Stat(archive); err != nil {
		return fmt.Errorf("node %s: import image: %w", c.Name, err)
	}
	if _, err := c.Ctr(ctx, "images", "import", archive); err != nil {
		return fmt.Errorf("import %s: %w", archive, err)
	}
	return nil
}

// Images returns the image names known to this containerd's k8s.io namespace.
func (c *Containerd) Images(ctx context.Context) ([]string, error) {
	out, err := c.Ctr(ctx, "images", "list", "-q")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// PID returns containerd's process id (nsenter's when Wrap is set: it execs
// containerd, so the same process).
func (c *Containerd) PID() int { return c.proc.PID() }

// LogPath is containerd's log file.
func (c *Containerd) LogPath() string { return c.proc.LogPath }

// Exited reports whether containerd has ended.
func (c *Containerd) Exited() bool { return c.proc.Exited() }

// Stop ends containerd (SIGTERM, SIGKILL after 5 s) and waits until it is
// reaped. Containers it started (their shims) are not its children and
// outlive it; the node harness kills them through the node's cgroups and
// mount namespace. Calling Stop again does nothing.
func (c *Containerd) Stop() error {
	return c.proc.StopWithin(5 * time.Second)
}

// lookPath finds bin (a name on PATH or a path) and names the Debian package
// that provides it when it is missing.
func lookPath(bin, pkg string) (string, error) {
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%s not found (install the Debian package %s): %w", bin, pkg, err)
	}
	return p, nil
}
