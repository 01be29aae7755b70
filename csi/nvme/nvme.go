// Package nvme is the node plugin's NVMe-oF/TCP initiator: connect to a subsystem by writing the
// kernel's fabrics device (/dev/nvme-fabrics, drivers/nvme/host/fabrics.c — the same interface
// nvme-cli uses), find the namespace's block device through sysfs by subsystem NQN, and
// disconnect through each controller's delete_controller attribute.
//
// Devices are found by subsystem NQN under /sys/class/nvme-subsystem/<subsys>/, whose
// nvme<X>n<Y> entries are the visible multipath head devices; the per-path nodes
// nvme<X>c<Y>n<Z> are hidden and never returned.
package nvme

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Initiator connects and disconnects NVMe-oF/TCP subsystems. The zero value uses the real
// kernel paths; tests point SysRoot at a fake tree and replace Fabrics and WriteFile.
type Initiator struct {
	// SysRoot is the sysfs mount, "/sys" when empty.
	SysRoot string
	// DevRoot is where device nodes live, "/dev" when empty.
	DevRoot string
	// Fabrics writes one connect option string to /dev/nvme-fabrics; nil means the real device.
	// It returns syscall.EALREADY when the kernel says the controller already exists.
	Fabrics func(options string) error
	// WriteFile writes a sysfs attribute; nil means os.WriteFile.
	WriteFile func(path string, data []byte) error
	// PollInterval is how often Connect and Disconnect look at sysfs while waiting (default 50 ms).
	PollInterval time.Duration
	// Timeout bounds the wait for a namespace to appear or a subsystem to go (default 30 s).
	Timeout time.Duration
}

// Target is one subsystem to connect to.
type Target struct {
	// NQN is the subsystem NQN.
	NQN string
	// Address is the target IP (traddr).
	Address string
	// Port is the TCP port (trsvcid).
	Port int32
	// HostNQN is this node's host NQN; empty lets the kernel use its default.
	HostNQN string
	// HostID is the host identifier sent with HostNQN (hostid=, a UUID); "" derives it with
	// HostIDFor. Linux >= 6.6 refuses a host NQN with the kernel's default host id when that id
	// already belongs to another NQN (fabrics.c nvmf_host_add: "found same hostid"), so a
	// host NQN always travels with its own id.
	HostID string
	// CtrlLossTmo is ctrl_loss_tmo in seconds (-1 reconnects forever); nil keeps the default.
	CtrlLossTmo *int32
	// ReconnectDelay is reconnect_delay in seconds; 0 keeps the default.
	ReconnectDelay int32
	// QueueSize is queue_size, the I/O queue depth (nvme connect --queue-size; the kernel
	// accepts 16–1024, drivers/nvme/host/fabrics.c); 0 keeps the default (128).
	QueueSize int32
	// DHCHAPSecret is the host's DH-HMAC-CHAP secret ("DHHC-1:...", dhchap_secret, nvme connect
	// --dhchap-secret); "" connects without. DHCHAPCtrlSecret is the controller's secret for
	// bidirectional authentication (dhchap_ctrl_secret, --dhchap-ctrl-secret). Secrets: never
	// printed (String and errors leave them out).
	DHCHAPSecret, DHCHAPCtrlSecret string
}

var (
	ctrlName = regexp.MustCompile(`^nvme[0-9]+$`)
	headName = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)
)

func (in *Initiator) sys(p ...string) string {
	root := in.SysRoot
	if root == "" {
		root = "/sys"
	}
	return filepath.Join(append([]string{root}, p...)...)
}

func (in *Initiator) dev(name string) string {
	root := in.DevRoot
	if root == "" {
		root = "/dev"
	}
	return filepath.Join(root, name)
}

func (in *Initiator) poll() time.Duration {
	if in.PollInterval > 0 {
		return in.PollInterval
	}
	return 50 * time.Millisecond
}

func (in *Initiator) timeout() time.Duration {
	if in.Timeout > 0 {
		return in.Timeout
	}
	return 30 * time.Second
}

func (in *Initiator) write(path string, data []byte) error {
	if in.WriteFile != nil {
		return in.WriteFile(path, data)
	}
	return os.WriteFile(path, data, 0)
}

// AuthUsable reports whether this node's kernel can authenticate to a target
// (DH-HMAC-CHAP): nvme_core uses nvme_auth (CONFIG_NVME_HOST_AUTH; Linux 6.0 or newer built
// with it). Without it the kernel refuses a connect with dhchap_secret.
func (in *Initiator) AuthUsable() bool {
	_, err := os.Stat(in.sys("module", "nvme_auth", "holders", "nvme_core"))
	return err == nil
}

// Usable reports whether this node can connect over NVMe-oF/TCP: the fabrics device exists and
// the nvme_tcp module is loaded.
func (in *Initiator) Usable() bool { return in.Unusable() == "" }

// Unusable says why this node cannot connect over NVMe-oF/TCP, naming what is missing: the
// kernel module nvme_tcp (no /sys/module/nvme_tcp) or the fabrics device /dev/nvme-fabrics
// (module nvme_fabrics); "" when it can. The node plugin loads no module itself.
func (in *Initiator) Unusable() string {
	var missing []string
	if _, err := os.Stat(in.sys("module", "nvme_tcp")); err != nil {
		missing = append(missing, "kernel module nvme_tcp is not loaded (modprobe nvme_tcp)")
	}
	if _, err := os.Stat(in.dev("nvme-fabrics")); err != nil {
		missing = append(missing, "no "+in.dev("nvme-fabrics")+" (kernel module nvme_fabrics)")
	}
	return strings.Join(missing, "; ")
}

func readAttr(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// subsystem is one /sys/class/nvme-subsystem entry with the given NQN.
type subsystem struct {
	dir         string
	controllers []string // nvme<X>
	heads       []string // nvme<X>n<Y>
}

// subsystems lists the subsystems whose subsysnqn is nqn.
func (in *Initiator) subsystems(nqn string) ([]subsystem, error) {
	base := in.sys("class", "nvme-subsystem")
	entries, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // no NVMe at all: nothing connected, not an error
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", base, err)
	}
	var out []subsystem
	for _, e := range entries {
		dir := filepath.Join(base, e.Name())
		if readAttr(filepath.Join(dir, "subsysnqn")) != nqn {
			continue
		}
		s := subsystem{dir: dir}
		kids, err := os.ReadDir(dir)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // removed meanwhile
			}
			return nil, err
		}
		for _, k := range kids {
			switch {
			case ctrlName.MatchString(k.Name()):
				s.controllers = append(s.controllers, k.Name())
			case headName.MatchString(k.Name()):
				s.heads = append(s.heads, k.Name())
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// connected reports whether a live controller of t.NQN was made with t.HostNQN to t's address.
func (in *Initiator) connected(t Target) (bool, error) {
	subs, err := in.subsystems(t.NQN)
	if err != nil {
		return false, err
	}
	for _, s := range subs {
		for _, c := range s.controllers {
			ctrl := in.sys("class", "nvme", c)
			if readAttr(filepath.Join(ctrl, "transport")) != "tcp" {
				continue
			}
			if t.HostNQN != "" && readAttr(filepath.Join(ctrl, "hostnqn")) != t.HostNQN {
				continue // another host identity is a separate connection
			}
			addr := readAttr(filepath.Join(ctrl, "address"))
			// Whole fields, not substrings: a controller to 10.0.0.10:44201 is not one to
			// 10.0.0.1:4420, and taking it for one would skip the connect that stage needs.
			if addressField(addr, "traddr") == t.Address && addressField(addr, "trsvcid") == strconv.Itoa(int(t.Port)) {
				return true, nil
			}
		}
	}
	return false, nil
}

// addressField returns the value of key in a controller's address attribute, the
// comma-separated key=value list drivers/nvme/host/fabrics.c nvmf_get_address prints
// ("traddr=10.0.0.1,trsvcid=4420,src_addr=10.0.0.2"); "" when key is absent. The first
// occurrence counts.
func addressField(attr, key string) string {
	for _, kv := range strings.Split(attr, ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && k == key {
			return v
		}
	}
	return ""
}

// ConnectOptions returns the option string written to /dev/nvme-fabrics for t.
func ConnectOptions(t Target) string {
	opts := []string{
		"nqn=" + t.NQN,
		"transport=tcp",
		"traddr=" + t.Address,
		fmt.Sprintf("trsvcid=%d", t.Port),
	}
	if t.HostNQN != "" {
		opts = append(opts, "hostnqn="+t.HostNQN)
		id := t.HostID
		if id == "" {
			id = HostIDFor(t.HostNQN)
		}
		opts = append(opts, "hostid="+id)
	}
	if t.CtrlLossTmo != nil {
		opts = append(opts, fmt.Sprintf("ctrl_loss_tmo=%d", *t.CtrlLossTmo))
	}
	if t.ReconnectDelay > 0 {
		opts = append(opts, fmt.Sprintf("reconnect_delay=%d", t.ReconnectDelay))
	}
	if t.QueueSize > 0 {
		opts = append(opts, fmt.Sprintf("queue_size=%d", t.QueueSize))
	}
	if t.DHCHAPSecret != "" {
		opts = append(opts, "dhchap_secret="+t.DHCHAPSecret)
	}
	if t.DHCHAPCtrlSecret != "" {
		opts = append(opts, "dhchap_ctrl_secret="+t.DHCHAPCtrlSecret)
	}
	return strings.Join(opts, ",")
}

func writeFabrics(options string) error {
	f, err := os.OpenFile("/dev/nvme-fabrics", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write([]byte(options)); err != nil {
		return err
	}
	return nil
}

// Connect connects to t unless this host is already connected to it (a retried stage
// reuses the controller; "already connected" from the kernel, EALREADY, is success) and returns
// the namespace's block device, e.g. /dev/nvme1n1, waiting (bounded) for it to appear.
func (in *Initiator) Connect(ctx context.Context, t Target) (string, error) {
	if t.NQN == "" || t.Address == "" || t.Port == 0 {
		return "", fmt.Errorf("incomplete target (nqn %q, address %q, port %d)", t.NQN, t.Address, t.Port)
	}
	ok, err := in.connected(t)
	if err != nil {
		return "", err
	}
	if !ok {
		fabrics := in.Fabrics
		if fabrics == nil {
			fabrics = writeFabrics
		}
		if err := fabrics(ConnectOptions(t)); err != nil && !errors.Is(err, syscall.EALREADY) {
			return "", fmt.Errorf("connect to %s at %s:%d: %w", t.NQN, t.Address, t.Port, err)
		}
	}
	return in.WaitDevice(ctx, t.NQN)
}

// Device returns the block device of the subsystem's namespace ("" when none is visible).
// A subsystem with more than one namespace is an error: Plinth exports one namespace per volume.
func (in *Initiator) Device(nqn string) (string, error) {
	subs, err := in.subsystems(nqn)
	if err != nil {
		return "", err
	}
	var heads []string
	for _, s := range subs {
		heads = append(heads, s.heads...)
	}
	switch len(heads) {
	case 0:
		return "", nil
	case 1:
		return in.dev(heads[0]), nil
	}
	return "", fmt.Errorf("subsystem %s has %d namespaces (%s), want 1", nqn, len(heads), strings.Join(heads, ", "))
}

// WaitDevice waits (bounded by Timeout and ctx) until the subsystem's namespace is visible and
// its device node exists.
func (in *Initiator) WaitDevice(ctx context.Context, nqn string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, in.timeout())
	defer cancel()
	tick := time.NewTicker(in.poll())
	defer tick.Stop()
	for {
		dev, err := in.Device(nqn)
		if err != nil {
			return "", err
		}
		if dev != "" {
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("namespace of %s did not appear: %w", nqn, ctx.Err())
		case <-tick.C:
		}
	}
}

// SubsystemNQNOfDevice returns the subsystem NQN of an NVMe block device such as
// /dev/nvme1n1 through /sys/class/block/<name>/device/subsysnqn (or the head's
// subsystem link); "" when the device is not NVMe.
func (in *Initiator) SubsystemNQNOfDevice(device string) string {
	name := filepath.Base(device)
	for _, p := range []string{
		in.sys("class", "block", name, "device", "subsysnqn"),
		in.sys("class", "block", name, "subsystem", "subsysnqn"),
	} {
		if v := readAttr(p); v != "" {
			return v
		}
	}
	return ""
}

// SubsystemNQNsOfVolume returns the NQNs of the subsystems this node is connected to that
// belong to the volume volumeID, sorted: Plinth names a volume's subsystem "<prefix>:<volume
// id>" (agents/nvmet VolumeNQN), so the NQN's part after its last ':' is the id. It is how
// unstage finds a connection no stage record remembers (a record lost with the node's state).
func (in *Initiator) SubsystemNQNsOfVolume(volumeID string) ([]string, error) {
	if volumeID == "" {
		return nil, errors.New("empty volume id")
	}
	base := in.sys("class", "nvme-subsystem")
	entries, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", base, err)
	}
	var out []string
	for _, e := range entries {
		nqn := readAttr(filepath.Join(base, e.Name(), "subsysnqn"))
		if i := strings.LastIndexByte(nqn, ':'); i >= 0 && nqn[i+1:] == volumeID && !slices.Contains(out, nqn) {
			out = append(out, nqn)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Disconnect deletes every controller of the subsystem nqn on this node and returns once the
// subsystem is gone from sysfs (bounded poll). Nothing connected is success; a controller
// that refuses to go is an error.
func (in *Initiator) Disconnect(ctx context.Context, nqn string) error {
	subs, err := in.subsystems(nqn)
	if err != nil {
		return err
	}
	if len(subs) == 0 {
		return nil
	}
	for _, s := range subs {
		for _, c := range s.controllers {
			p := in.sys("class", "nvme", c, "delete_controller")
			if err := in.write(p, []byte("1")); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("disconnect %s (%s): %w", nqn, c, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, in.timeout())
	defer cancel()
	tick := time.NewTicker(in.poll())
	defer tick.Stop()
	for {
		subs, err := in.subsystems(nqn)
		if err != nil {
			return err
		}
		if len(subs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("subsystem %s still present after disconnect: %w", nqn, ctx.Err())
		case <-tick.C:
		}
	}
}

// HostNQN reads the node's host NQN from path (normally /etc/nvme/hostnqn); "" when absent.
func HostNQN(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// HostIDFor returns the host identifier of a host NQN: the UUID of a UUID-based NQN
// ("nqn.2014-08.org.nvmexpress:uuid:<uuid>", as nvme-cli's gen-hostnqn makes them and as
// nvme-cli pairs /etc/nvme/hostid with it), else a UUID (version 5 layout) derived from the
// SHA-1 of the NQN: stable, one per NQN.
func HostIDFor(hostNQN string) string {
	const prefix = "nqn.2014-08.org.nvmexpress:uuid:"
	if u, ok := strings.CutPrefix(hostNQN, prefix); ok && uuidRe.MatchString(u) {
		return strings.ToLower(u)
	}
	h := sha1.Sum([]byte(hostNQN))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

var uuidRe = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// AuthController is a live NVMe-oF/TCP controller of this node that authenticated with
// DH-HMAC-CHAP: its sysfs attributes (/sys/class/nvme/<Name>/…). The secrets are what the
// kernel holds for it (dhchap_secret, dhchap_ctrl_secret; "" when it has none); never printed.
type AuthController struct {
	// Name is the controller's name, nvme<X>.
	Name string
	// SubsysNQN is the subsystem NQN (subsysnqn).
	SubsysNQN string
	// Address is the target address (traddr of the address attribute).
	Address string
	// State is the controller state (state), such as live or connecting.
	State string
	// Secret and CtrlSecret are dhchap_secret and dhchap_ctrl_secret.
	Secret, CtrlSecret string
}

// AuthControllers lists the tcp controllers made with hostNQN that hold a DH-HMAC-CHAP host
// secret (dhchap_secret is neither "none" nor empty; Linux shows it to root only), sorted by
// name. A node without NVMe has none.
func (in *Initiator) AuthControllers(hostNQN string) ([]AuthController, error) {
	base := in.sys("class", "nvme")
	entries, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", base, err)
	}
	var out []AuthController
	for _, e := range entries {
		if !ctrlName.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		if readAttr(filepath.Join(dir, "transport")) != "tcp" || readAttr(filepath.Join(dir, "hostnqn")) != hostNQN {
			continue
		}
		secret := readAttr(filepath.Join(dir, "dhchap_secret"))
		if secret == "" || secret == "none" {
			continue
		}
		c := AuthController{Name: e.Name(), SubsysNQN: readAttr(filepath.Join(dir, "subsysnqn")), State: readAttr(filepath.Join(dir, "state")), Secret: secret}
		if cs := readAttr(filepath.Join(dir, "dhchap_ctrl_secret")); cs != "none" {
			c.CtrlSecret = cs
		}
		c.Address = addressField(readAttr(filepath.Join(dir, "address")), "traddr")
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b AuthController) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Reauthenticate hands new DH-HMAC-CHAP secrets to the live controller name: ctrlSecret (when
// not "") to dhchap_ctrl_secret, then secret to dhchap_secret. Each write makes the kernel
// re-authenticate the controller's queues with what it then holds
// (drivers/nvme/host/sysfs.c nvme_ctrl_dhchap_secret_store queues dhchap_auth_work; Linux ≥ 6.0
// with CONFIG_NVME_HOST_AUTH); the connection stays up when the target accepts, and the
// target drops it when it refuses (the host then reconnects with the secrets it holds). The
// kernel accepts a new secret only on a controller that connected with one. Errors name the
// attribute, never the secret.
func (in *Initiator) Reauthenticate(name, secret, ctrlSecret string) error {
	dir := in.sys("class", "nvme", name)
	if ctrlSecret != "" {
		if err := in.write(filepath.Join(dir, "dhchap_ctrl_secret"), []byte(ctrlSecret)); err != nil {
			return fmt.Errorf("write %s/dhchap_ctrl_secret: %w", dir, unwrapPath(err))
		}
	}
	if err := in.write(filepath.Join(dir, "dhchap_secret"), []byte(secret)); err != nil {
		return fmt.Errorf("write %s/dhchap_secret: %w", dir, unwrapPath(err))
	}
	return nil
}

// unwrapPath drops the path of an *os.PathError (the caller names it once).
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
