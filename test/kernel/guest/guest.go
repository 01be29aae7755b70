// Package guest boots the Plinth kernel-test guest (Debian's kernel under qemu
// software emulation, the initramfs built by test/kernel/setup.sh) and runs
// commands in it. It is the one place that knows the qemu command line: the
// kernel suite (test/kernel/run.sh through cmd/kguest) and host-side Go tests
// that need a real kernel (e.g. an agent in the guest talking to a host
// kube-apiserver) both use it.
//
// Commands travel over a 9p share: the host writes cmd/<n>.sh, the guest's
// /init runs it with sh and writes cmd/<n>.out and cmd/<n>.rc (see
// test/kernel/guest-init.sh). Commands may run concurrently.
package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// GuestForwardAddr is the address on which the guest reaches host services
// forwarded with Options.GuestForwards (qemu guestfwd; docs/design.md, "Guest tests").
const GuestForwardAddr = "10.0.2.100"

// Kernel flavors of test/kernel/setup.sh (Options.Flavor).
const (
	// FlavorStable is Debian's current kernel (6.1 on bookworm) with ZFS, in .work/.
	FlavorStable = "stable"
	// FlavorBackports is bookworm-backports' kernel (6.12), in .work/backports/: NVMe
	// in-band authentication (DH-HMAC-CHAP) and NVMe/TCP TLS, no ZFS.
	FlavorBackports = "backports"
	// FlavorNode is the backports kernel with the Kubernetes-node initramfs of
	// test/kernel/node-assets.sh (.work/backports/node/): a tmpfs root, containerd, runc, CNI
	// plugins, iptables, kubelet and kube-proxy; run plinth-node-up in it first.
	FlavorNode = "node"
)

// SharePath is where the host share is mounted inside the guest.
const SharePath = "/mnt/host"

// Forward is one TCP port forward.
type Forward struct {
	// HostPort is the port on the host's 127.0.0.1.
	HostPort int
	// GuestPort is the port in the guest (for GuestForwards: on GuestForwardAddr).
	GuestPort int
}

// Options configure Boot. Zero values take the defaults noted per field.
type Options struct {
	// Flavor picks the kernel test/kernel/setup.sh prepared when Kernel and Initrd are not
	// given: FlavorStable (default: Debian's kernel, with ZFS) or FlavorBackports
	// (bookworm-backports' newer kernel: NVMe in-band authentication and TLS, no ZFS) or
	// FlavorNode (the backports kernel as a Kubernetes node's host).
	Flavor string
	// Kernel is the uncompressed vmlinux (default <repo>/test/kernel/.work/[<flavor>/]vmlinux).
	Kernel string
	// Initrd is the initramfs (default <repo>/test/kernel/.work/[<flavor>/]initramfs.cpio).
	Initrd string
	// DiskBytes are the sizes of the spare virtio disks, in order /dev/vda,
	// /dev/vdb, ... (raw sparse files, deleted by Stop). Default none.
	DiskBytes []int64
	// MemoryMiB is the guest memory (default 1024).
	MemoryMiB int
	// CPUs is the number of vCPUs (default 1; 2 is slower on a 2-core host).
	CPUs int
	// HostForwards expose guest ports on the host's 127.0.0.1 (qemu hostfwd).
	HostForwards []Forward
	// GuestForwards expose host ports (on 127.0.0.1) to the guest at
	// GuestForwardAddr:GuestPort (qemu guestfwd).
	GuestForwards []Forward
	// WorkDir holds the share and disks (default a new temp dir, removed by Stop). A caller's
	// WorkDir is kept by Stop, and a Boot with the same WorkDir reuses its disk files with
	// their data: a reboot of the same machine.
	WorkDir string
	// Console receives the guest's serial console (default discarded).
	Console io.Writer
	// Timeout bounds the guest's whole life; qemu runs under timeout(1) so it
	// dies even if this process does (default 20 minutes).
	Timeout time.Duration
	// BootTimeout bounds the wait for the guest to become ready (default 3 minutes).
	BootTimeout time.Duration
	// ExtraArgs are appended to the qemu command line, e.g. a second NIC on the private
	// network of test/kernel/netrelay (its Side.NetdevArgs).
	ExtraArgs []string
}

// Guest is a running guest.
type Guest struct {
	opts     Options
	work     string
	ownWork  bool
	share    string
	cmd      *exec.Cmd
	done     chan struct{}
	waitErr  error
	mu       sync.Mutex
	seq      int
	stopOnce sync.Once
	// BootTime is the time from starting qemu until the guest was ready.
	BootTime time.Duration
}

// RepoRoot finds the module root (the folder holding go.mod) from the
// working directory upwards.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/plinth-storage/plinth\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("guest: go.mod of github.com/plinth-storage/plinth not found above the working directory")
		}
		dir = parent
	}
}

func (o *Options) defaults() error {
	if o.Kernel == "" || o.Initrd == "" {
		root, err := RepoRoot()
		if err != nil {
			return err
		}
		w := filepath.Join(root, "test", "kernel", ".work")
		switch o.Flavor {
		case "", FlavorStable:
		case FlavorBackports:
			w = filepath.Join(w, FlavorBackports)
		case FlavorNode:
			if o.Kernel == "" {
				o.Kernel = filepath.Join(w, FlavorBackports, "vmlinux")
			}
			w = filepath.Join(w, FlavorBackports, FlavorNode)
		default:
			return fmt.Errorf("guest: unknown kernel flavor %q", o.Flavor)
		}
		if o.Kernel == "" {
			o.Kernel = filepath.Join(w, "vmlinux")
		}
		if o.Initrd == "" {
			o.Initrd = filepath.Join(w, "initramfs.cpio")
		}
	}
	for _, f := range []string{o.Kernel, o.Initrd} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("guest: %w (run make kernel-assets)", err)
		}
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 1024
	}
	if o.CPUs == 0 {
		o.CPUs = 1
	}
	if o.Console == nil {
		o.Console = io.Discard
	}
	if o.Timeout == 0 {
		o.Timeout = 20 * time.Minute
	}
	if o.BootTimeout == 0 {
		o.BootTimeout = 3 * time.Minute
	}
	return nil
}

// QemuArgs returns the qemu-system-x86_64 arguments for the options (after
// defaults), with share the 9p folder and disks the raw disk files.
func QemuArgs(o Options, share string, disks []string) []string {
	nic := "user,model=virtio-net-pci,restrict=on"
	for _, f := range o.HostForwards {
		nic += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", f.HostPort, f.GuestPort)
	}
	for _, f := range o.GuestForwards {
		nic += fmt.Sprintf(",guestfwd=tcp:%s:%d-tcp:127.0.0.1:%d", GuestForwardAddr, f.GuestPort, f.HostPort)
	}
	args := []string{
		"-accel", "tcg,thread=multi", "-cpu", "max", "-machine", "q35",
		"-m", strconv.Itoa(o.MemoryMiB), "-smp", strconv.Itoa(o.CPUs),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-serial", "stdio", "-monitor", "none",
		"-kernel", o.Kernel, "-initrd", o.Initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=4",
		"-nic", nic,
		"-virtfs", "local,path=" + share + ",mount_tag=plinth,security_model=none",
	}
	for _, d := range disks {
		args = append(args, "-drive", "file="+d+",if=virtio,format=raw,cache=unsafe,discard=unmap")
	}
	return append(args, o.ExtraArgs...)
}

// Boot starts a guest and waits until it accepts commands. The caller must
// Stop it. Canceling ctx during boot stops the guest.
func Boot(ctx context.Context, opts Options) (*Guest, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if runtime.GOOS != "linux" {
		return nil, errors.New("guest: linux hosts only")
	}
	g := &Guest{opts: opts, done: make(chan struct{})}
	if opts.WorkDir == "" {
		d, err := os.MkdirTemp("", "plinth-guest-")
		if err != nil {
			return nil, err
		}
		g.work, g.ownWork = d, true
	} else {
		g.work = opts.WorkDir
	}
	g.share = filepath.Join(g.work, "share")
	// a reboot in a kept WorkDir: the last boot's commands and ready mark must not count
	os.RemoveAll(filepath.Join(g.share, "cmd"))
	os.Remove(filepath.Join(g.share, "ready"))
	if err := os.MkdirAll(filepath.Join(g.share, "cmd"), 0o755); err != nil {
		return nil, err
	}
	var disks []string
	for i, sz := range opts.DiskBytes {
		p := filepath.Join(g.work, fmt.Sprintf("disk%d.raw", i))
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644) // kept data: see WorkDir
		if err == nil {
			err = f.Truncate(sz)
			f.Close()
		}
		if err != nil {
			g.cleanup()
			return nil, fmt.Errorf("guest: disk %s: %w", p, err)
		}
		disks = append(disks, p)
	}
	secs := int(opts.Timeout / time.Second)
	args := append([]string{"-k", "5", strconv.Itoa(secs), "qemu-system-x86_64"}, QemuArgs(opts, g.share, disks)...)
	g.cmd = exec.Command("timeout", args...)
	g.cmd.Stdin = nil
	g.cmd.Stdout = opts.Console
	g.cmd.Stderr = opts.Console
	// Own process group: Stop kills timeout and qemu together by PID. If this
	// process dies, timeout(1) gets SIGTERM and passes it on to qemu.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	start := time.Now()
	if err := g.cmd.Start(); err != nil {
		g.cleanup()
		return nil, fmt.Errorf("guest: start qemu: %w", err)
	}
	go func() {
		g.waitErr = g.cmd.Wait()
		close(g.done)
	}()
	bctx, cancel := context.WithTimeout(ctx, opts.BootTimeout)
	defer cancel()
	ready := filepath.Join(g.share, "ready")
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case <-g.done:
			g.Stop()
			return nil, fmt.Errorf("guest: qemu exited during boot: %v", g.waitErr)
		case <-bctx.Done():
			g.Stop()
			return nil, fmt.Errorf("guest: not ready: %w", bctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	g.BootTime = time.Since(start)
	return g, nil
}

// PID is the process id of the timeout(1) process that runs qemu (qemu is its
// child, in the same process group).
func (g *Guest) PID() int { return g.cmd.Process.Pid }

// ShareDir is the host folder mounted at SharePath in the guest: files put
// there (e.g. test binaries) are visible to guest commands.
func (g *Guest) ShareDir() string { return g.share }

// Result is the outcome of a guest command.
type Result struct {
	// ExitCode is the shell's exit status.
	ExitCode int
	// Output is the combined stdout and stderr.
	Output []byte
}

// Run runs script with sh in the guest (working directory /root, PATH with
// the lvm/nvme tools) and returns its exit code and combined output. Output
// is also copied to w as it arrives when w is not nil. An error means the
// command could not be run or ctx ended (the guest command keeps running).
func (g *Guest) Run(ctx context.Context, script string, w io.Writer) (Result, error) {
	g.mu.Lock()
	g.seq++
	n := g.seq
	g.mu.Unlock()
	base := filepath.Join(g.share, "cmd", fmt.Sprintf("%06d", n))
	if err := os.WriteFile(base+".tmp", []byte(script+"\n"), 0o755); err != nil {
		return Result{}, err
	}
	if err := os.Rename(base+".tmp", base+".sh"); err != nil {
		return Result{}, err
	}
	var off int64
	var out bytes.Buffer
	drain := func() {
		f, err := os.Open(base + ".out")
		if err != nil {
			return
		}
		defer f.Close()
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return
		}
		k, _ := io.Copy(&out, f)
		if k > 0 && w != nil {
			w.Write(out.Bytes()[off : off+k])
		}
		off += k
	}
	for {
		drain()
		if b, err := os.ReadFile(base + ".rc"); err == nil {
			drain()
			rc, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return Result{Output: out.Bytes()}, fmt.Errorf("guest: bad exit code %q", b)
			}
			return Result{ExitCode: rc, Output: out.Bytes()}, nil
		}
		select {
		case <-ctx.Done():
			return Result{Output: out.Bytes()}, ctx.Err()
		case <-g.done:
			drain()
			return Result{Output: out.Bytes()}, fmt.Errorf("guest: qemu exited while running command: %v", g.waitErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop powers the guest off (briefly gracefully, then by killing the process
// group of the PID), waits for qemu to exit and removes the work folder it
// created. Safe to call more than once.
func (g *Guest) Stop() error {
	g.stopOnce.Do(func() {
		if g.cmd != nil && g.cmd.Process != nil {
			os.WriteFile(filepath.Join(g.share, "cmd", "poweroff"), nil, 0o644)
			select {
			case <-g.done:
			case <-time.After(5 * time.Second):
				syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
				<-g.done
			}
		}
		g.cleanup()
	})
	return nil
}

// Done is closed when qemu has exited.
func (g *Guest) Done() <-chan struct{} { return g.done }

func (g *Guest) cleanup() {
	if g.ownWork {
		os.RemoveAll(g.work)
	}
}
