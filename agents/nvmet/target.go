package nvmet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/go-logr/logr"

	"github.com/plinth-storage/plinth/internal/failpoint"
)

// DefaultRoot is where the kernel mounts the nvmet configfs tree.
const DefaultRoot = "/sys/kernel/config/nvmet"

// NamespaceID is the namespace id of every exported volume. nvmet refuses 0
// and 0xffffffff (NVME_NSID_ALL) in nvmet_ns_make.
const NamespaceID = 1

// TransportTCP is the only transport Plinth configures (addr_trtype).
const TransportTCP = "tcp"

// ErrNotFound is returned by Inspect when the subsystem does not exist.
var ErrNotFound = errors.New("nvmet subsystem not found")

// ErrPortInUse is returned when an explicitly requested port id is enabled
// (has subsystems linked) with another address: configfs refuses addr_*
// writes on an enabled port with EACCES, and rewriting a live port would cut
// off every host connected through it.
var ErrPortInUse = errors.New("nvmet port in use with another address")

// ErrInvalidSpec wraps validation errors of an ExportSpec (besides
// ErrInvalidNQN); the CSI edge maps it to INVALID_ARGUMENT.
var ErrInvalidSpec = errors.New("invalid nvmet export spec")

// Endpoint is where a subsystem is reachable: a TCP listener of the target.
type Endpoint struct {
	// Address is an IPv4 or IPv6 literal (addr_traddr); the address family
	// (addr_adrfam) is derived from it.
	Address string
	// ServiceID is the TCP port, e.g. "4420" (addr_trsvcid).
	ServiceID string
	// PortID optionally pins the configfs port id (ports/<id>). 0 means
	// derive a stable id from the address. An existing port with the same
	// transport, family, address and service id is always reused, whatever
	// its id: two ports cannot listen on one address.
	PortID uint16
}

// ExportSpec is the desired export of one volume.
type ExportSpec struct {
	// NQN of the subsystem (see VolumeNQN); validated before any mkdir.
	NQN string
	// DevicePath is the absolute path of the block device (LV or zvol).
	DevicePath string
	// Endpoint is the listener the subsystem is linked to. A subsystem is
	// linked to exactly this port; links to other ports are removed.
	Endpoint Endpoint
	// ACL restricts access to Hosts (attr_allow_any_host=0). Without ACL any
	// host may connect and Hosts must be empty.
	ACL bool
	// Hosts are the host NQNs allowed to connect when ACL is set; the
	// allowed_hosts links are reconciled to exactly this set.
	Hosts []string
	// HostAuth, when set, requires DH-HMAC-CHAP of every host in Hosts: each host entry gets
	// its setting (HostAuth[host]) before it is linked into allowed_hosts, so the host is
	// never allowed without authentication. Needs ACL and an entry for every host; the
	// kernel must have target authentication (ErrAuthUnsupported otherwise).
	HostAuth map[string]HostAuth
}

// Namespace is an observed namespace of a subsystem.
type Namespace struct {
	ID         uint32
	DevicePath string // "" when unset (the kernel shows "(null)")
	UUID       string
	NGUID      string
	Enabled    bool
}

// Port is an observed (or desired) nvmet port.
type Port struct {
	ID        uint16
	Transport string // addr_trtype, e.g. "tcp"
	Family    string // addr_adrfam, "ipv4" or "ipv6"
	Address   string // addr_traddr
	ServiceID string // addr_trsvcid
}

// Export is the observed state of one subsystem, for status and drift
// detection.
type Export struct {
	NQN          string
	Serial       string
	AllowAnyHost bool
	// Hosts linked into allowed_hosts, sorted.
	Hosts []string
	// HostAuth holds the DH-HMAC-CHAP setting of each linked host whose entry has a key
	// (secrets: compare, never print).
	HostAuth   map[string]HostAuth
	Namespaces []Namespace
	// Ports the subsystem is linked into, sorted by id.
	Ports []Port
}

// Result reports what Export did.
type Result struct {
	// Port the subsystem is linked into.
	Port Port
	// Changes lists the configfs mutations made, in order ("mkdir <path>",
	// "write <path>=<value>", ...); empty when the export already matched.
	Changes []string
}

// Target manages the nvmet configfs tree under one root.
//
// Exports of one subsystem are serialized by a per-subsystem lock; ports
// (shared by subsystems) and host entries (shared too) have their own locks,
// always taken after the subsystem lock. The locks are per process: one agent
// per node owns the tree.
type Target struct {
	root string
	fs   FS

	subsys  keyedMutex
	portsMu sync.Mutex
	// hostsMu is held shared while hosts/<h> entries are created and linked
	// and exclusively while unreferenced entries are removed.
	hostsMu sync.RWMutex
}

// Option configures a Target.
type Option func(*Target)

// WithFS replaces the configfs implementation (tests).
func WithFS(f FS) Option { return func(t *Target) { t.fs = f } }

// New returns a Target for the configfs tree at root ("" means DefaultRoot).
func New(root string, opts ...Option) *Target {
	if root == "" {
		root = DefaultRoot
	}
	t := &Target{root: root, fs: OSFS{}}
	for _, o := range opts {
		o(t)
	}
	return t
}

// Root returns the configfs root the target writes to.
func (t *Target) Root() string { return t.root }

func (t *Target) subsysDir(nqn string) string { return filepath.Join(t.root, "subsystems", nqn) }
func (t *Target) nsDir(nqn string, id uint32) string {
	return filepath.Join(t.subsysDir(nqn), "namespaces", strconv.FormatUint(uint64(id), 10))
}
func (t *Target) portDir(name string) string { return filepath.Join(t.root, "ports", name) }
func (t *Target) hostDir(h string) string    { return filepath.Join(t.root, "hosts", h) }

// changes records mutations for Result.Changes and the log.
type changes struct{ list []string }

func (c *changes) add(format string, args ...any) {
	c.list = append(c.list, fmt.Sprintf(format, args...))
}

func validateSpec(s ExportSpec) (family string, err error) {
	if err := ValidateNQN(s.NQN); err != nil {
		return "", err
	}
	if !filepath.IsAbs(s.DevicePath) || strings.ContainsAny(s.DevicePath, "\n\x00") {
		return "", fmt.Errorf("%w: device path %q must be an absolute path", ErrInvalidSpec, s.DevicePath)
	}
	family, err = addressFamily(s.Endpoint.Address)
	if err != nil {
		return "", err
	}
	if n, err := strconv.ParseUint(s.Endpoint.ServiceID, 10, 16); err != nil || n == 0 || strconv.FormatUint(n, 10) != s.Endpoint.ServiceID {
		return "", fmt.Errorf("%w: service id %q must be a TCP port 1-65535", ErrInvalidSpec, s.Endpoint.ServiceID)
	}
	if !s.ACL && len(s.Hosts) > 0 {
		return "", fmt.Errorf("%w: hosts given without ACL (any host may connect)", ErrInvalidSpec)
	}
	for _, h := range s.Hosts {
		if err := ValidateNQN(h); err != nil {
			return "", fmt.Errorf("host: %w", err)
		}
	}
	if s.HostAuth != nil {
		if !s.ACL {
			return "", fmt.Errorf("%w: authentication without ACL (any host may connect, none is asked)", ErrInvalidSpec)
		}
		for _, h := range s.Hosts {
			if s.HostAuth[h].Key == "" {
				return "", fmt.Errorf("%w: no DH-HMAC-CHAP key for host %s", ErrInvalidSpec, h)
			}
		}
	}
	return family, nil
}

func addressFamily(addr string) (string, error) {
	ip := net.ParseIP(addr)
	switch {
	case ip == nil:
		return "", fmt.Errorf("%w: address %q is not an IP literal", ErrInvalidSpec, addr)
	case ip.To4() != nil && !strings.Contains(addr, ":"):
		return "ipv4", nil
	default:
		return "ipv6", nil
	}
}

// Export creates or converges the export of one volume and returns the port
// it is linked into and the mutations made. It is idempotent: an export that
// already matches makes no write. The order keeps hosts from ever seeing a
// half-built subsystem and follows the kernel's rules (see the package
// documentation):
//
//  1. subsystems/<nqn> (mkdir, EEXIST is success) and attr_serial;
//  2. access: ACL on → attr_allow_any_host=0 before linking hosts/<h> into
//     allowed_hosts (EINVAL otherwise), EEXIST is success, undesired links
//     removed; ACL off → links removed before attr_allow_any_host=1;
//  3. namespaces/1: device_path, device_uuid, device_nguid, then enable
//     LAST; an enabled namespace is disabled only when its path or identity
//     must change (those writes fail with EBUSY while enabled);
//  4. the port with the same address (or a new one with a stable id, its
//     addr_* written before the first link enables it), the link
//     ports/<id>/subsystems/<nqn> (EEXIST is success), a
//     post-condition read of that link, and removal of links to other ports.
//
// Errors wrap ErrInvalidNQN/ErrInvalidSpec for bad input, and otherwise a
// *ConfigfsError with the path and errno (e.g. EADDRNOTAVAIL from the link
// when the address is not assigned to any interface: never swallowed).
func (t *Target) Export(ctx context.Context, spec ExportSpec) (Result, error) {
	family, err := validateSpec(spec)
	if err != nil {
		return Result{}, err
	}
	unlock, err := t.subsys.lock(ctx, spec.NQN)
	if err != nil {
		return Result{}, err
	}
	defer unlock()

	var c changes
	res, err := t.export(spec, family, &c)
	res.Changes = c.list
	log := logr.FromContextOrDiscard(ctx)
	if len(c.list) > 0 {
		log.V(1).Info("nvmet export converged", "nqn", spec.NQN, "changes", c.list)
	}
	return res, err
}

func (t *Target) export(spec ExportSpec, family string, c *changes) (Result, error) {
	sdir := t.subsysDir(spec.NQN)
	if err := t.mkdir(sdir, c); err != nil {
		return Result{}, err
	}
	id := DeriveIdentity(spec.NQN)
	if err := t.ensureAttr(filepath.Join(sdir, "attr_serial"), id.Serial, c, func(s string) string {
		return strings.TrimRight(s, " ")
	}); err != nil {
		return Result{}, fmt.Errorf("set serial (frozen once a host identified the subsystem): %w", err)
	}
	revoked, err := t.reconcileHosts(spec.NQN, spec.ACL, spec.Hosts, spec.HostAuth, c)
	if err != nil {
		return Result{}, err
	}
	if revoked {
		// Removing a host from allowed_hosts only refuses its NEXT connect: the kernel keeps
		// the controllers it already has (nvmet_allowed_hosts_drop_link), so a revoked host
		// could go on writing. Dropping the subsystem's port links deletes every controller
		// of the subsystem on those ports (nvmet_port_subsys_drop_link → nvmet_port_del_ctrls);
		// linkPort below links it again, and only hosts still allowed reconnect (the
		// initiator's reconnect loop): a brief reconnect for them, the fence for the revoked.
		if err := t.dropPortLinks(spec.NQN, c); err != nil {
			return Result{}, fmt.Errorf("cut the controllers of revoked hosts: %w", err)
		}
	}
	if err := t.reconcileNamespace(spec.NQN, spec.DevicePath, id, c); err != nil {
		return Result{}, err
	}
	failpoint.Hit(failpoint.NVMetSubsystemCreated)
	port, err := t.linkPort(spec.NQN, Port{
		ID:        spec.Endpoint.PortID,
		Transport: TransportTCP,
		Family:    family,
		Address:   spec.Endpoint.Address,
		ServiceID: spec.Endpoint.ServiceID,
	}, c)
	if err != nil {
		return Result{}, err
	}
	return Result{Port: port}, nil
}

func (t *Target) mkdir(path string, c *changes) error {
	err := t.fs.Mkdir(path)
	if errors.Is(err, syscall.EEXIST) {
		return nil
	}
	if err == nil {
		c.add("mkdir %s", path)
	}
	return err
}

func (t *Target) write(path, value string, c *changes) error {
	if err := t.fs.WriteAttr(path, value); err != nil {
		return err
	}
	c.add("write %s=%s", path, value)
	return nil
}

// ensureAttr writes want unless the attribute (normalized by norm) already
// holds it.
func (t *Target) ensureAttr(path, want string, c *changes, norm func(string) string) error {
	got, err := t.fs.ReadAttr(path)
	if err != nil {
		return err
	}
	if norm != nil {
		got = norm(got)
	}
	if got == want {
		return nil
	}
	return t.write(path, want, c)
}

// reconcileHosts converges attr_allow_any_host and allowed_hosts; revoked is true when the
// ACL stays on and a host that was allowed no longer is (its live controllers must be cut).
func (t *Target) reconcileHosts(nqn string, acl bool, hosts []string, auth map[string]HostAuth, c *changes) (revoked bool, err error) {
	sdir := t.subsysDir(nqn)
	anyPath := filepath.Join(sdir, "attr_allow_any_host")
	adir := filepath.Join(sdir, "allowed_hosts")
	var removed []string
	var unauthenticated string // a host entry made but not given its key: removed again

	err = func() error {
		t.hostsMu.RLock()
		defer t.hostsMu.RUnlock()
		current, err := t.fs.ReadDir(adir)
		if err != nil {
			return err
		}
		if !acl {
			for _, h := range current {
				if err := t.unlink(filepath.Join(adir, h), c); err != nil {
					return err
				}
				removed = append(removed, h)
			}
			// EINVAL while any allowed host is still linked.
			return t.ensureAttr(anyPath, "1", c, nil)
		}
		// Linking a host while allow_any_host=1 fails with EINVAL.
		if err := t.ensureAttr(anyPath, "0", c, nil); err != nil {
			return err
		}
		for _, h := range hosts {
			if auth != nil {
				// the key before the link: an allowed host is never admitted without it,
				// and a changed key (rotation) is written to a host already linked
				if err := t.mkdir(t.hostDir(h), c); err != nil {
					return err
				}
				if err := t.ensureHostAuth(h, auth[h], c); err != nil {
					unauthenticated = h
					return err
				}
			}
			if slices.Contains(current, h) {
				continue
			}
			if err := t.mkdir(t.hostDir(h), c); err != nil {
				return err
			}
			if err := t.symlink(t.hostDir(h), filepath.Join(adir, h), c); err != nil {
				return err
			}
		}
		for _, h := range current {
			if !slices.Contains(hosts, h) {
				if err := t.unlink(filepath.Join(adir, h), c); err != nil {
					return err
				}
				removed = append(removed, h)
			}
		}
		return nil
	}()
	if err != nil {
		if unauthenticated != "" {
			_ = t.pruneHosts([]string{unauthenticated}, c) // only when no subsystem links it
		}
		return false, err
	}
	return acl && len(removed) > 0, t.pruneHosts(removed, c)
}

// pruneHosts removes hosts/<h> entries no subsystem links any more.
func (t *Target) pruneHosts(candidates []string, c *changes) error {
	if len(candidates) == 0 {
		return nil
	}
	t.hostsMu.Lock()
	defer t.hostsMu.Unlock()
	subs, err := t.fs.ReadDir(filepath.Join(t.root, "subsystems"))
	if err != nil {
		return err
	}
	inUse := map[string]bool{}
	for _, s := range subs {
		hs, err := t.fs.ReadDir(filepath.Join(t.subsysDir(s), "allowed_hosts"))
		if err != nil {
			continue // removed concurrently
		}
		for _, h := range hs {
			inUse[h] = true
		}
	}
	for _, h := range candidates {
		if inUse[h] {
			continue
		}
		err := t.fs.Rmdir(t.hostDir(h))
		if errors.Is(err, syscall.ENOENT) {
			continue
		}
		if err != nil {
			return err
		}
		c.add("rmdir %s", t.hostDir(h))
	}
	return nil
}

func (t *Target) symlink(target, link string, c *changes) error {
	err := t.fs.Symlink(target, link)
	if errors.Is(err, syscall.EEXIST) {
		return nil // the kernel's answer for a link that already exists
	}
	if err == nil {
		c.add("symlink %s -> %s", link, target)
	}
	return err
}

func (t *Target) unlink(path string, c *changes) error {
	err := t.fs.Unlink(path)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if err == nil {
		c.add("unlink %s", path)
	}
	return err
}

// readNamespace reads namespaces/<id> (device_path "(null)" means unset).
func (t *Target) readNamespace(nqn string, id uint32) (Namespace, error) {
	dir := t.nsDir(nqn, id)
	ns := Namespace{ID: id}
	var err error
	read := func(name string) string {
		if err != nil {
			return ""
		}
		var v string
		v, err = t.fs.ReadAttr(filepath.Join(dir, name))
		return v
	}
	ns.DevicePath = read("device_path")
	if ns.DevicePath == "(null)" {
		ns.DevicePath = ""
	}
	ns.UUID = strings.ToLower(read("device_uuid"))
	ns.NGUID = strings.ToLower(read("device_nguid"))
	ns.Enabled = read("enable") == "1"
	return ns, err
}

func (t *Target) reconcileNamespace(nqn, devicePath string, id Identity, c *changes) error {
	dir := t.nsDir(nqn, NamespaceID)
	if err := t.mkdir(dir, c); err != nil {
		return err
	}
	ns, err := t.readNamespace(nqn, NamespaceID)
	if err != nil {
		return err
	}
	pathOK := ns.DevicePath == devicePath
	idOK := ns.UUID == id.UUID && ns.NGUID == id.NGUID
	if ns.Enabled && pathOK && idOK {
		return nil
	}
	enablePath := filepath.Join(dir, "enable")
	disable := func() error { return t.write(enablePath, "0", c) }
	if ns.Enabled {
		// device_path/device_uuid/device_nguid writes fail with EBUSY while
		// the namespace is enabled.
		if err := disable(); err != nil {
			return err
		}
	}
	if !pathOK {
		p := filepath.Join(dir, "device_path")
		err := t.write(p, devicePath, c)
		if errors.Is(err, syscall.EBUSY) {
			// Enabled behind our back between the read and the write.
			if err := disable(); err != nil {
				return err
			}
			err = t.write(p, devicePath, c)
		}
		if err != nil {
			return err
		}
	}
	if !idOK {
		if err := t.write(filepath.Join(dir, "device_uuid"), id.UUID, c); err != nil {
			return err
		}
		if err := t.write(filepath.Join(dir, "device_nguid"), id.NGUID, c); err != nil {
			return err
		}
	}
	return t.write(enablePath, "1", c)
}

// RevalidateSize makes the target re-read the size of the namespace's device
// after the LV or zvol grew (namespaces/1/revalidate_size, present since
// Linux 5.x); connected hosts get a namespace-changed event and see the new
// size without reconnecting. The namespace must be enabled (EINVAL otherwise,
// nvmet_ns_revalidate_size_store).
func (t *Target) RevalidateSize(ctx context.Context, nqn string) error {
	if err := ValidateNQN(nqn); err != nil {
		return err
	}
	unlock, err := t.subsys.lock(ctx, nqn)
	if err != nil {
		return err
	}
	defer unlock()
	return t.fs.WriteAttr(filepath.Join(t.nsDir(nqn, NamespaceID), "revalidate_size"), "1")
}

// Unexport removes the export of one volume in the order that releases the
// device (configfs ordering rules, checked on the guest's kernel): port links
// (a port left without links is disabled by the kernel and removed here) →
// namespace disable → rmdir namespace → unlink allowed hosts → rmdir
// subsystem. Host entries no other subsystem links are removed. Unexport of a
// subsystem that does not exist succeeds.
func (t *Target) Unexport(ctx context.Context, nqn string) error {
	if err := ValidateNQN(nqn); err != nil {
		return err
	}
	unlock, err := t.subsys.lock(ctx, nqn)
	if err != nil {
		return err
	}
	defer unlock()
	var c changes
	err = t.unexport(nqn, &c)
	if len(c.list) > 0 {
		logr.FromContextOrDiscard(ctx).V(1).Info("nvmet unexport", "nqn", nqn, "changes", c.list)
	}
	return err
}

func (t *Target) unexport(nqn string, c *changes) error {
	sdir := t.subsysDir(nqn)
	ok, err := t.fs.Exists(sdir)
	if err != nil || !ok {
		return err
	}
	if err := t.unlinkPorts(nqn, "", c); err != nil {
		return err
	}
	nsRoot := filepath.Join(sdir, "namespaces")
	nss, err := t.fs.ReadDir(nsRoot)
	if err != nil {
		return err
	}
	for _, n := range nss {
		en := filepath.Join(nsRoot, n, "enable")
		v, err := t.fs.ReadAttr(en)
		if err != nil {
			return err
		}
		if v != "0" {
			if err := t.write(en, "0", c); err != nil {
				return err
			}
		}
		if err := t.fs.Rmdir(filepath.Join(nsRoot, n)); err != nil {
			return err
		}
		c.add("rmdir %s", filepath.Join(nsRoot, n))
	}
	var removed []string
	adir := filepath.Join(sdir, "allowed_hosts")
	hosts, err := t.fs.ReadDir(adir)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		if err := t.unlink(filepath.Join(adir, h), c); err != nil {
			return err
		}
		removed = append(removed, h)
	}
	if err := t.fs.Rmdir(sdir); err != nil {
		return err
	}
	c.add("rmdir %s", sdir)
	return t.pruneHosts(removed, c)
}
