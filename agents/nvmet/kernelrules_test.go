package nvmet

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// kernelRulesFS is a test double of the nvmet configfs tree: it keeps the tree
// in a temporary directory and enforces the kernel's rules that a plain
// directory cannot (drivers/nvme/target/configfs.c; TestKernelOrderingRules
// checks them on the real kernel):
//
//   - mkdir creates the default groups and attribute files configfs would;
//     namespaces/0 and namespaces/0xffffffff → EINVAL; a non-numeric port or
//     namespace name → EINVAL; mkdir outside a group → EPERM;
//   - device_path, device_uuid, device_nguid writes while enable=1 → EBUSY;
//     empty device_path → EINVAL; enable=1 of an unknown device → ENOENT;
//     revalidate_size on a disabled namespace → EINVAL;
//   - addr_* writes on a port with a linked subsystem → EACCES;
//   - the first link into a port "binds" it: no trtype → EINVAL, an address
//     in unassigned → EADDRNOTAVAIL, an address another enabled port listens
//     on → EADDRINUSE; the same subsystem linked twice → EEXIST;
//   - allowed host link while attr_allow_any_host=1 → EINVAL, duplicate →
//     EEXIST; attr_allow_any_host=1 with hosts linked → EINVAL;
//   - attr_serial: 1-20 printable ASCII bytes, frozen (EINVAL) once the
//     subsystem is in discovered;
//   - rmdir of a group with user-created children or links → ENOTEMPTY; rmdir
//     of a subsystem still linked into a port or of an enabled namespace
//     works in the kernel but is recorded in violations (it leaves the
//     device held or the subsystem reachable).
//
// It records every successful mutation in ops (paths relative to the root) so
// tests can check the order, and which devices are held open by an enabled
// namespace.
type kernelRulesFS struct {
	t    testing.TB
	root string
	real OSFS

	mu            sync.Mutex
	ops           []string
	violations    []string
	devices       map[string]bool // block devices that exist
	held          map[string]int  // device → enabled namespaces using it
	unassigned    map[string]bool // addresses on no interface
	discovered    map[string]bool // subsystem NQNs a host has identified
	revalidations map[string]int  // namespace dir (relative) → count
	// auth gives host entries the dhchap_* attributes of a kernel with
	// CONFIG_NVME_TARGET_AUTH (6.12 here; bookworm's 6.1 has none): writes of a key that
	// does not start "DHHC-1:" fail with EINVAL (nvmet_auth_set_key).
	auth bool
	// inject, when set, may fail an operation before the rules run
	// (op is "mkdir", "rmdir", "write", "symlink", "unlink").
	inject func(op, rel, value string) error
}

var _ FS = (*kernelRulesFS)(nil)

func newKernelRulesFS(t testing.TB) *kernelRulesFS {
	root := filepath.Join(t.TempDir(), "nvmet")
	for _, d := range []string{"", "subsystems", "ports", "hosts"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &kernelRulesFS{
		t: t, root: root,
		devices: map[string]bool{}, held: map[string]int{}, unassigned: map[string]bool{},
		discovered: map[string]bool{}, revalidations: map[string]int{},
	}
}

func errno(op, path string, e syscall.Errno) error { return &ConfigfsError{Op: op, Path: path, Err: e} }

func (k *kernelRulesFS) rel(path string) []string {
	r, err := filepath.Rel(k.root, path)
	if err != nil || strings.HasPrefix(r, "..") {
		k.t.Fatalf("kernelRulesFS: path %s outside root %s", path, k.root)
	}
	return strings.Split(r, string(filepath.Separator))
}

func (k *kernelRulesFS) record(format string, args ...any) {
	k.ops = append(k.ops, fmt.Sprintf(format, args...))
}

func (k *kernelRulesFS) opsSnapshot() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.ops...)
}

func (k *kernelRulesFS) resetOps() {
	k.mu.Lock()
	k.ops = nil
	k.mu.Unlock()
}

func (k *kernelRulesFS) file(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

func (k *kernelRulesFS) put(path, v string) {
	if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
		k.t.Fatal(err)
	}
}

func (k *kernelRulesFS) entries(path string) []string {
	names, _ := k.real.ReadDir(path)
	return names
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (k *kernelRulesFS) Mkdir(path string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.rel(path)
	if k.inject != nil {
		if err := k.inject("mkdir", strings.Join(p, "/"), ""); err != nil {
			return err
		}
	}
	var files map[string]string
	var dirs []string
	switch {
	case len(p) == 2 && p[0] == "subsystems":
		// nvmet_subsys_make
		if p[1] == DiscoveryNQN {
			return errno("mkdir", path, syscall.EINVAL)
		}
		files = map[string]string{
			"attr_allow_any_host": "0",
			"attr_serial":         randomHex(8) + "    ", // 16 hex, padded to 20
			"attr_version":        "1.3",
			"attr_model":          "Linux",
		}
		dirs = []string{"namespaces", "allowed_hosts"}
	case len(p) == 4 && p[0] == "subsystems" && p[2] == "namespaces":
		// nvmet_ns_make: kstrtou32(name, 0), 0 and NVME_NSID_ALL refused.
		id, err := strconv.ParseUint(p[3], 0, 32)
		if err != nil || id == 0 || id == 0xffffffff {
			return errno("mkdir", path, syscall.EINVAL)
		}
		u := randomHex(16)
		files = map[string]string{
			"device_path":     "(null)",
			"device_uuid":     u[0:8] + "-" + u[8:12] + "-" + u[12:16] + "-" + u[16:20] + "-" + u[20:32],
			"device_nguid":    "00000000-0000-0000-0000-000000000000",
			"enable":          "0",
			"revalidate_size": "",
			"buffered_io":     "0",
			"ana_grpid":       "1",
		}
	case len(p) == 2 && p[0] == "ports":
		// nvmet_ports_make: kstrtou16(name, 0)
		if _, err := strconv.ParseUint(p[1], 0, 16); err != nil {
			return errno("mkdir", path, syscall.EINVAL)
		}
		files = map[string]string{
			"addr_trtype": "", "addr_adrfam": "", "addr_traddr": "", "addr_trsvcid": "",
			"addr_treq": "not specified", "param_inline_data_size": "-1",
		}
		dirs = []string{"subsystems", "referrals", "ana_groups"}
	case len(p) == 2 && p[0] == "hosts":
		if k.auth {
			files = map[string]string{"dhchap_key": "", "dhchap_ctrl_key": "", "dhchap_hash": "hmac(sha256)", "dhchap_dhgroup": "null"}
		}
	default:
		return errno("mkdir", path, syscall.EPERM)
	}
	if err := k.real.Mkdir(path); err != nil {
		return err
	}
	for n, v := range files {
		k.put(filepath.Join(path, n), v)
	}
	for _, d := range dirs {
		if err := os.Mkdir(filepath.Join(path, d), 0o755); err != nil {
			k.t.Fatal(err)
		}
	}
	k.record("mkdir %s", strings.Join(p, "/"))
	return nil
}

func (k *kernelRulesFS) Rmdir(path string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.rel(path)
	rel := strings.Join(p, "/")
	if k.inject != nil {
		if err := k.inject("rmdir", rel, ""); err != nil {
			return err
		}
	}
	if _, err := os.Lstat(path); err != nil {
		return wrap("rmdir", path, err)
	}
	switch {
	case len(p) == 2 && p[0] == "subsystems":
		if len(k.entries(filepath.Join(path, "namespaces"))) > 0 || len(k.entries(filepath.Join(path, "allowed_hosts"))) > 0 {
			return errno("rmdir", path, syscall.ENOTEMPTY)
		}
		for _, port := range k.entries(filepath.Join(k.root, "ports")) {
			if _, err := os.Lstat(filepath.Join(k.root, "ports", port, "subsystems", p[1])); err == nil {
				k.violations = append(k.violations, "rmdir "+rel+" while linked into port "+port)
			}
		}
	case len(p) == 4 && p[0] == "subsystems" && p[2] == "namespaces":
		if k.file(filepath.Join(path, "enable")) == "1" {
			k.violations = append(k.violations, "rmdir of enabled namespace "+rel)
			k.held[k.file(filepath.Join(path, "device_path"))]--
		}
	case len(p) == 2 && p[0] == "ports":
		if len(k.entries(filepath.Join(path, "subsystems"))) > 0 {
			return errno("rmdir", path, syscall.ENOTEMPTY)
		}
	case len(p) == 2 && p[0] == "hosts":
		for _, s := range k.entries(filepath.Join(k.root, "subsystems")) {
			if _, err := os.Lstat(filepath.Join(k.root, "subsystems", s, "allowed_hosts", p[1])); err == nil {
				k.violations = append(k.violations, "rmdir "+rel+" while allowed in "+s)
			}
		}
	default:
		return errno("rmdir", path, syscall.EPERM)
	}
	if err := os.RemoveAll(path); err != nil {
		k.t.Fatal(err)
	}
	k.record("rmdir %s", rel)
	return nil
}

func (k *kernelRulesFS) ReadAttr(path string) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if filepath.Base(path) == "revalidate_size" {
		return "", errno("read", path, syscall.EACCES) // write-only attribute
	}
	return k.real.ReadAttr(path)
}

func kstrtobool(v string) (bool, bool) {
	switch strings.ToLower(strings.TrimSuffix(v, "\n")) {
	case "1", "y", "yes", "on", "true":
		return true, true
	case "0", "n", "no", "off", "false":
		return false, true
	}
	return false, false
}

func parseNGUID(v string) (string, bool) {
	var b []byte
	s := strings.TrimSuffix(v, "\n")
	for i := 0; i < 16; i++ {
		if len(s) < 2 || !isHex(s[0]) || !isHex(s[1]) {
			return "", false
		}
		x, _ := strconv.ParseUint(s[:2], 16, 8)
		b = append(b, byte(x))
		s = s[2:]
		if len(s) > 0 && (s[0] == '-' || s[0] == ':') {
			s = s[1:]
		}
	}
	return formatUUID(b), true
}

func (k *kernelRulesFS) WriteAttr(path, value string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.rel(path)
	rel := strings.Join(p, "/")
	if k.inject != nil {
		if err := k.inject("write", rel, value); err != nil {
			return err
		}
	}
	if st, err := os.Stat(path); err != nil || st.IsDir() {
		if err == nil {
			err = syscall.EISDIR
		}
		return wrap("write", path, err)
	}
	dir, attr := filepath.Dir(path), filepath.Base(path)
	line := value
	if i := strings.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	store := line
	fail := func(e syscall.Errno) error { return errno("write", path, e) }
	switch {
	case len(p) == 5 && p[0] == "subsystems" && p[2] == "namespaces":
		enabled := k.file(filepath.Join(dir, "enable")) == "1"
		switch attr {
		case "device_path":
			if enabled {
				return fail(syscall.EBUSY)
			}
			if line == "" {
				return fail(syscall.EINVAL)
			}
		case "device_uuid":
			if enabled {
				return fail(syscall.EBUSY)
			}
			if !validUUID(line) {
				return fail(syscall.EINVAL)
			}
			store = strings.ToLower(line)
		case "device_nguid":
			if enabled {
				return fail(syscall.EBUSY)
			}
			g, ok := parseNGUID(line)
			if !ok {
				return fail(syscall.EINVAL)
			}
			store = g
		case "enable":
			on, ok := kstrtobool(value)
			if !ok {
				return fail(syscall.EINVAL)
			}
			dev := k.file(filepath.Join(dir, "device_path"))
			switch {
			case on && !enabled:
				if dev == "(null)" {
					return fail(syscall.EINVAL)
				}
				if !k.devices[dev] {
					return fail(syscall.ENOENT)
				}
				k.held[dev]++
			case !on && enabled:
				k.held[dev]--
			}
			store = map[bool]string{true: "1", false: "0"}[on]
		case "revalidate_size":
			on, ok := kstrtobool(value)
			if !ok || !on || !enabled {
				return fail(syscall.EINVAL)
			}
			k.revalidations[filepath.Join(p[:4]...)]++
			k.record("write %s=%s", rel, value)
			return nil
		}
	case len(p) == 3 && p[0] == "subsystems":
		switch attr {
		case "attr_allow_any_host":
			on, ok := kstrtobool(value)
			if !ok {
				return fail(syscall.EINVAL)
			}
			if on && len(k.entries(filepath.Join(dir, "allowed_hosts"))) > 0 {
				return fail(syscall.EINVAL)
			}
			store = map[bool]string{true: "1", false: "0"}[on]
		case "attr_serial":
			if k.discovered[p[1]] || line == "" || len(line) > 20 {
				return fail(syscall.EINVAL)
			}
			for i := 0; i < len(line); i++ {
				if line[i] < 0x20 || line[i] > 0x7e {
					return fail(syscall.EINVAL)
				}
			}
			store = line + strings.Repeat(" ", 20-len(line))
		}
	case len(p) == 3 && p[0] == "ports":
		if len(k.entries(filepath.Join(dir, "subsystems"))) > 0 {
			return fail(syscall.EACCES) // nvmet_is_port_enabled
		}
		valid := map[string][]string{
			"addr_trtype": {"rdma", "fc", "tcp", "pci", "loop"},
			"addr_adrfam": {"pcie", "ipv4", "ipv6", "ib", "fc", "pci", "loop"},
		}
		if vs, ok := valid[attr]; ok {
			found := false
			for _, v := range vs {
				found = found || v == line
			}
			if !found {
				return fail(syscall.EINVAL)
			}
		}
		if attr == "addr_traddr" && len(value) > 256 || attr == "addr_trsvcid" && len(value) > 32 {
			return fail(syscall.EINVAL)
		}
	}
	if len(p) == 3 && p[0] == "hosts" && (attr == "dhchap_key" || attr == "dhchap_ctrl_key") && !strings.HasPrefix(line, "DHHC-1:") {
		return fail(syscall.EINVAL)
	}
	k.put(path, store)
	k.record("write %s=%s", rel, value)
	return nil
}

func (k *kernelRulesFS) Symlink(target, link string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.rel(link)
	rel := strings.Join(p, "/")
	if k.inject != nil {
		if err := k.inject("symlink", rel, target); err != nil {
			return err
		}
	}
	tp := k.rel(target)
	fail := func(e syscall.Errno) error { return errno("symlink", link, e) }
	if st, err := os.Stat(target); err != nil || !st.IsDir() {
		return fail(syscall.ENOENT)
	}
	switch {
	case len(p) == 4 && p[0] == "ports" && p[2] == "subsystems":
		// nvmet_port_subsys_allow_link
		if len(tp) != 2 || tp[0] != "subsystems" {
			return fail(syscall.EINVAL)
		}
		sdir := filepath.Dir(link)
		existing := k.entries(sdir)
		for _, e := range existing {
			if t, _ := os.Readlink(filepath.Join(sdir, e)); filepath.Clean(t) == filepath.Clean(target) {
				return fail(syscall.EEXIST)
			}
		}
		if len(existing) == 0 {
			// nvmet_enable_port: the transport binds its listener.
			pdir := filepath.Dir(sdir)
			trtype, addr, svc := k.file(filepath.Join(pdir, "addr_trtype")), k.file(filepath.Join(pdir, "addr_traddr")), k.file(filepath.Join(pdir, "addr_trsvcid"))
			if trtype == "" {
				return fail(syscall.EINVAL)
			}
			if k.unassigned[addr] {
				return fail(syscall.EADDRNOTAVAIL)
			}
			for _, other := range k.entries(filepath.Join(k.root, "ports")) {
				od := filepath.Join(k.root, "ports", other)
				if od != pdir && len(k.entries(filepath.Join(od, "subsystems"))) > 0 &&
					k.file(filepath.Join(od, "addr_trtype")) == trtype &&
					k.file(filepath.Join(od, "addr_traddr")) == addr && k.file(filepath.Join(od, "addr_trsvcid")) == svc {
					return fail(syscall.EADDRINUSE)
				}
			}
		}
	case len(p) == 4 && p[0] == "subsystems" && p[2] == "allowed_hosts":
		// nvmet_allowed_hosts_allow_link
		if len(tp) != 2 || tp[0] != "hosts" {
			return fail(syscall.EINVAL)
		}
		if k.file(filepath.Join(k.root, "subsystems", p[1], "attr_allow_any_host")) == "1" {
			return fail(syscall.EINVAL)
		}
		for _, e := range k.entries(filepath.Dir(link)) {
			if e == tp[1] {
				return fail(syscall.EEXIST)
			}
		}
	default:
		return fail(syscall.EPERM)
	}
	if err := k.real.Symlink(target, link); err != nil {
		return err
	}
	k.record("symlink %s", rel)
	return nil
}

func (k *kernelRulesFS) Unlink(path string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	rel := strings.Join(k.rel(path), "/")
	if k.inject != nil {
		if err := k.inject("unlink", rel, ""); err != nil {
			return err
		}
	}
	st, err := os.Lstat(path)
	if err != nil {
		return wrap("unlink", path, err)
	}
	if st.Mode()&fs.ModeSymlink == 0 {
		return errno("unlink", path, syscall.EPERM) // attributes and groups cannot be unlinked
	}
	if err := k.real.Unlink(path); err != nil {
		return err
	}
	k.record("unlink %s", rel)
	return nil
}

func (k *kernelRulesFS) ReadDir(path string) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.real.ReadDir(path)
}

func (k *kernelRulesFS) Readlink(path string) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.real.Readlink(path)
}

func (k *kernelRulesFS) Exists(path string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.real.Exists(path)
}

// read returns an attribute relative to the root (test assertions).
func (k *kernelRulesFS) read(rel string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.file(filepath.Join(k.root, rel))
}

func (k *kernelRulesFS) exists(rel string) bool {
	_, err := os.Lstat(filepath.Join(k.root, rel))
	return err == nil
}

func (k *kernelRulesFS) checkNoViolations(t testing.TB) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.violations) > 0 {
		t.Errorf("kernel ordering violations: %q", k.violations)
	}
}

var errInjected = errors.New("injected")
