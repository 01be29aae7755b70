package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hostTools are the executables the harness runs, with the Debian package
// that provides each.
var hostTools = []struct{ bin, pkg string }{
	{"containerd", "containerd"},
	{"ctr", "containerd"},
	{"runc", "runc"},
	{"unshare", "util-linux"},
	{"nsenter", "util-linux"},
	{"mount", "mount"},
	{"umount", "mount"},
	{"iptables", "iptables"},
	{"ip", "iproute2"},
}

// cniPlugins are the CNI plugins the node network config and containerd's
// CRI plugin use (Debian's containernetworking-plugins).
var cniPlugins = []string{"bridge", "host-local", "loopback"}

// CheckHost returns an error naming everything this host lacks to run nodes:
// root, a tool (with its Debian package), a CNI plugin, cgroup v1 hierarchies.
func CheckHost() error {
	var errs []error
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("not root: kubelet and containerd need root"))
	}
	for _, t := range hostTools {
		if _, err := exec.LookPath(t.bin); err != nil {
			errs = append(errs, fmt.Errorf("%s not found (install the Debian package %s)", t.bin, t.pkg))
		}
	}
	for _, p := range cniPlugins {
		if _, err := os.Stat(filepath.Join(DefaultCNIBinDir, p)); err != nil {
			errs = append(errs, fmt.Errorf("CNI plugin %s not in %s (install the Debian package containernetworking-plugins)", p, DefaultCNIBinDir))
		}
	}
	if h, err := cgroupMounts(); err != nil {
		errs = append(errs, err)
	} else if !h.v1 {
		errs = append(errs, errors.New("no cgroup v1 hierarchy mounted: the harness sets kubelet up for cgroup v1 (cgroupfs driver)"))
	}
	return errors.Join(errs...)
}

// HostIP returns the host's first global IPv4 address on the interface of
// its default route (else any global IPv4 address): the address the API
// server advertises for the `kubernetes` Service, kubelets serve on and pods
// reach the host at. Loopback will not do: kubelet refuses a loopback node
// IP and a pod's 127.0.0.1 is its own.
func HostIP() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	def := defaultRouteInterface()
	var any string
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.To4() == nil || !ipn.IP.IsGlobalUnicast() {
				continue
			}
			if ifc.Name == def {
				return ipn.IP.String(), nil
			}
			if any == "" && !strings.HasPrefix(ifc.Name, bridgePrefix) {
				any = ipn.IP.String()
			}
		}
	}
	if any == "" {
		return "", errors.New("no global IPv4 address on this host: pods need one to reach the API server")
	}
	return any, nil
}

// defaultRouteInterface reads /proc/net/route for the default route's interface.
func defaultRouteInterface() string {
	data, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 2 && f[1] == "00000000" {
			return f[0]
		}
	}
	return ""
}

// mountInfo is one line of /proc/<pid>/mountinfo.
type mountInfo struct {
	mountPoint, fsType, optional string
}

func readMountInfo(path string) ([]mountInfo, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []mountInfo
	s := bufio.NewScanner(bytes.NewReader(data))
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		f := strings.Fields(s.Text())
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 6 || len(f) < sep+3 {
			continue
		}
		out = append(out, mountInfo{
			mountPoint: unescapeMount(f[4]),
			optional:   strings.Join(f[6:sep], " "),
			fsType:     f[sep+1],
		})
	}
	return out, s.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// MountsUnder returns the host's mount points at or below dir (from
// /proc/self/mountinfo), deepest first.
func MountsUnder(dir string) ([]string, error) {
	ms, err := readMountInfo("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if m.mountPoint == dir || strings.HasPrefix(m.mountPoint, dir+"/") {
			out = append(out, m.mountPoint)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// cgroupV1Hierarchies returns the mount points of the cgroup v1 hierarchies
// (/sys/fs/cgroup/cpu, .../memory, .../systemd ...), one per hierarchy, and of
// a hybrid host's cgroup2 (/sys/fs/cgroup/unified), where kubelet's cgroupfs
// manager makes its folders too.
func cgroupV1Hierarchies() ([]string, error) {
	h, err := cgroupMounts()
	return h.all, err
}

type cgroupSet struct {
	all []string
	v1  bool
}

func cgroupMounts() (cgroupSet, error) {
	ms, err := readMountInfo("/proc/self/mountinfo")
	if err != nil {
		return cgroupSet{}, err
	}
	var out cgroupSet
	for _, m := range ms {
		switch m.fsType {
		case "cgroup":
			out.v1 = true
			out.all = append(out.all, m.mountPoint)
		case "cgroup2":
			out.all = append(out.all, m.mountPoint)
		}
	}
	return out, nil
}

// run runs a command and returns an error carrying its output.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// output runs a command and returns its standard output.
func output(ctx context.Context, name string, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// pidsInMountNS returns the processes whose mount namespace is the one nsFile
// (a persistent namespace bind mount) holds.
func pidsInMountNS(nsFile string) ([]int, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(nsFile, &st); err != nil {
		return nil, err
	}
	want := fmt.Sprintf("mnt:[%d]", st.Ino)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); err == nil && l == want {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// pidsInCgroups returns every process in the cgroups at or below root in each
// v1 hierarchy.
func pidsInCgroups(hierarchies []string, root string) []int {
	seen := map[int]bool{}
	var pids []int
	for _, h := range hierarchies {
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups removes root and every cgroup below it in each hierarchy,
// deepest first; a cgroup still emptying is retried until deadline.
func removeCgroups(hierarchies []string, root string, deadline time.Time) error {
	var errs []error
	for _, h := range hierarchies {
		top := filepath.Join(h, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			for {
				err := syscall.Rmdir(d)
				if err == nil || errors.Is(err, syscall.ENOENT) {
					break
				}
				if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
					errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
					break
				}
				time.Sleep(50 * time.Millisecond) // a killed process leaves its cgroup a moment after it is reaped
			}
		}
	}
	return errors.Join(errs...)
}

// iptablesChains returns "table/chain" for every chain in the host's
// iptables and ip6tables (prefixed "6:" for IPv6).
func iptablesChains(ctx context.Context) map[string]bool {
	out := map[string]bool{}
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		data, err := output(ctx, bin)
		if err != nil {
			continue
		}
		prefix := ""
		if bin == "ip6tables-save" {
			prefix = "6:"
		}
		table := ""
		for _, line := range strings.Split(data, "\n") {
			switch {
			case strings.HasPrefix(line, "*"):
				table = line[1:]
			case strings.HasPrefix(line, ":"):
				if f := strings.Fields(line[1:]); len(f) > 0 {
					out[prefix+table+"/"+f[0]] = true
				}
			}
		}
	}
	return out
}

// removeChains deletes the given "table/chain" chains: first every rule that
// jumps to one of them, then their rules, then the chains.
func removeChains(ctx context.Context, chains []string) error {
	byBin := map[string]map[string][]string{} // bin → table → chains
	for _, c := range chains {
		bin := "iptables"
		if strings.HasPrefix(c, "6:") {
			bin, c = "ip6tables", c[2:]
		}
		table, chain, _ := strings.Cut(c, "/")
		if byBin[bin] == nil {
			byBin[bin] = map[string][]string{}
		}
		byBin[bin][table] = append(byBin[bin][table], chain)
	}
	var errs []error
	for bin, tables := range byBin {
		for table, chs := range tables {
			doomed := map[string]bool{}
			for _, c := range chs {
				doomed[c] = true
			}
			rules, err := output(ctx, bin, "-w", "-t", table, "-S")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, r := range strings.Split(rules, "\n") {
				f := strings.Fields(r)
				if len(f) < 2 || f[0] != "-A" || doomed[f[1]] {
					continue
				}
				for i := 2; i+1 < len(f); i++ {
					if (f[i] == "-j" || f[i] == "-g") && doomed[f[i+1]] {
						// -S quotes arguments (comments) the way a shell reads them.
						del := bin + " -w -t " + table + " -D " + strings.TrimPrefix(r, "-A ")
						if err := run(ctx, "sh", "-c", del); err != nil {
							errs = append(errs, err)
						}
						break
					}
				}
			}
			for _, c := range chs {
				_ = run(ctx, bin, "-w", "-t", table, "-F", c)
			}
			for _, c := range chs {
				if err := run(ctx, bin, "-w", "-t", table, "-X", c); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}
