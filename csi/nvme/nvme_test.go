package nvme

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeKernel lays out sysfs the way drivers/nvme/host/core.c does for a connected subsystem:
// class/nvme-subsystem/nvme-subsysS/{subsysnqn,nvmeC,nvmeCnN}, class/nvme/nvmeC/{subsysnqn,
// hostnqn,transport,address,delete_controller}, plus the hidden per-path node nvmeCc0nN the
// plugin must not return, and the /dev node of the head.
type fakeKernel struct {
	t        *testing.T
	sys, dev string
	connects []string
	next     int
}

func newFakeKernel(t *testing.T) *fakeKernel {
	root := t.TempDir()
	k := &fakeKernel{t: t, sys: filepath.Join(root, "sys"), dev: filepath.Join(root, "dev")}
	for _, d := range []string{filepath.Join(k.sys, "class", "nvme-subsystem"), filepath.Join(k.sys, "class", "nvme"), k.dev} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return k
}

func (k *fakeKernel) write(p, v string) {
	k.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		k.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
		k.t.Fatal(err)
	}
}

// connect makes controller nvme<next> of the subsystem nqn (creating the subsystem) for hostnqn.
func (k *fakeKernel) connect(nqn, hostnqn, addr string) {
	c := "nvme" + itoa(k.next)
	k.next++
	sub := filepath.Join(k.sys, "class", "nvme-subsystem", "nvme-subsys-"+strings.ReplaceAll(nqn, ":", "_"))
	k.write(filepath.Join(sub, "subsysnqn"), nqn)
	if err := os.MkdirAll(filepath.Join(sub, c), 0o755); err != nil {
		k.t.Fatal(err)
	}
	head := "nvme" + strings.TrimPrefix(filepath.Base(firstCtrl(sub, c)), "nvme") + "n1"
	if err := os.MkdirAll(filepath.Join(sub, head), 0o755); err != nil {
		k.t.Fatal(err)
	}
	ctrl := filepath.Join(k.sys, "class", "nvme", c)
	k.write(filepath.Join(ctrl, "subsysnqn"), nqn)
	k.write(filepath.Join(ctrl, "hostnqn"), hostnqn)
	k.write(filepath.Join(ctrl, "transport"), "tcp")
	k.write(filepath.Join(ctrl, "address"), addr)
	k.write(filepath.Join(ctrl, "delete_controller"), "")
	if err := os.MkdirAll(filepath.Join(ctrl, c+"c0n1"), 0o755); err != nil { // hidden path node
		k.t.Fatal(err)
	}
	k.write(filepath.Join(k.dev, head), "")
}

func firstCtrl(sub, fallback string) string {
	entries, _ := os.ReadDir(sub)
	for _, e := range entries {
		if ctrlName.MatchString(e.Name()) {
			return e.Name()
		}
	}
	return fallback
}

func itoa(i int) string { return strconv.Itoa(i) }

func (k *fakeKernel) initiator() *Initiator {
	return &Initiator{
		SysRoot: k.sys, DevRoot: k.dev, PollInterval: time.Millisecond, Timeout: 5 * time.Second,
		Fabrics: func(opts string) error {
			k.connects = append(k.connects, opts)
			kv := map[string]string{}
			for _, p := range strings.Split(opts, ",") {
				a, b, _ := strings.Cut(p, "=")
				kv[a] = b
			}
			// The kernel refuses a duplicate controller with the same host NQN: EALREADY.
			in := &Initiator{SysRoot: k.sys}
			ok, _ := in.connected(Target{NQN: kv["nqn"], HostNQN: kv["hostnqn"], Address: kv["traddr"], Port: atoi(kv["trsvcid"])})
			if ok {
				return syscall.EALREADY
			}
			k.connect(kv["nqn"], kv["hostnqn"], "traddr="+kv["traddr"]+",trsvcid="+kv["trsvcid"])
			return nil
		},
		WriteFile: func(p string, data []byte) error {
			if filepath.Base(p) != "delete_controller" {
				return os.WriteFile(p, data, 0o644)
			}
			ctrl := filepath.Dir(p)
			nqn := readAttr(filepath.Join(ctrl, "subsysnqn"))
			c := filepath.Base(ctrl)
			if err := os.RemoveAll(ctrl); err != nil {
				return err
			}
			sub := filepath.Join(k.sys, "class", "nvme-subsystem", "nvme-subsys-"+strings.ReplaceAll(nqn, ":", "_"))
			os.RemoveAll(filepath.Join(sub, c))
			if firstCtrl(sub, "") == "" { // last controller gone: the subsystem goes too
				return os.RemoveAll(sub)
			}
			return nil
		},
	}
}

func atoi(s string) int32 {
	var n int32
	for _, c := range s {
		n = n*10 + int32(c-'0')
	}
	return n
}

const (
	nqn  = "nqn.2014-08.dev.plinth:vol-0123456789abcdef0123456789abcdef01234567"
	host = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"
)

// A retried stage reuses the existing controller; a kernel EALREADY is success; another
// host NQN is a real new connection.
func TestConnectIdempotent(t *testing.T) {
	k := newFakeKernel(t)
	in := k.initiator()
	tgt := Target{NQN: nqn, Address: "192.0.2.5", Port: 4420, HostNQN: host}
	dev, err := in.Connect(t.Context(), tgt)
	if err != nil {
		t.Fatal(err)
	}
	if dev != filepath.Join(k.dev, "nvme0n1") {
		t.Errorf("device %s, want the head nvme0n1 (never the hidden nvme0c0n1)", dev)
	}
	dev2, err := in.Connect(t.Context(), tgt)
	if err != nil {
		t.Fatalf("second connect: %v", err)
	}
	if dev2 != dev || len(k.connects) != 1 {
		t.Errorf("second connect: device %s, %d fabrics writes; want %s and 1 (reuse)", dev2, len(k.connects), dev)
	}
	// The kernel answering EALREADY (a controller made by someone else meanwhile) is success.
	in.Fabrics = func(string) error { return syscall.EALREADY }
	os.WriteFile(filepath.Join(k.sys, "class", "nvme", "nvme0", "address"), []byte("traddr=192.0.2.6,trsvcid=4420\n"), 0o644)
	if _, err := in.Connect(t.Context(), tgt); err != nil {
		t.Errorf("connect answered EALREADY: %v", err)
	}
	// Another host NQN is a separate connection (nvme-cli PR #1993).
	in = k.initiator()
	if _, err := in.Connect(t.Context(), Target{NQN: "nqn.2014-08.dev.plinth:other", Address: "192.0.2.5", Port: 4420, HostNQN: host}); err != nil {
		t.Fatal(err)
	}
	before := len(k.connects)
	if _, err := in.Connect(t.Context(), Target{NQN: "nqn.2014-08.dev.plinth:other", Address: "192.0.2.5", Port: 4420, HostNQN: host + "-2"}); err != nil {
		t.Errorf("connect with another host NQN: %v", err)
	}
	if len(k.connects) != before+1 {
		t.Errorf("connect with another host NQN wrote %d times, want a new connection", len(k.connects)-before)
	}
	// A kernel error other than EALREADY fails.
	in.Fabrics = func(string) error { return syscall.ECONNREFUSED }
	if _, err := in.Connect(t.Context(), Target{NQN: "nqn.x:y", Address: "192.0.2.9", Port: 4420}); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("connect refused: %v", err)
	}
}

// Disconnect of an absent NQN is a no-op; a controller that refuses fails; success means gone.
func TestDisconnect(t *testing.T) {
	k := newFakeKernel(t)
	in := k.initiator()
	if err := in.Disconnect(t.Context(), nqn); err != nil {
		t.Errorf("disconnect with empty nvme-subsystem: %v", err)
	}
	if err := (&Initiator{SysRoot: filepath.Join(t.TempDir(), "nosys")}).Disconnect(t.Context(), nqn); err != nil {
		t.Errorf("disconnect without any nvme sysfs: %v", err)
	}
	if _, err := in.Connect(t.Context(), Target{NQN: nqn, Address: "192.0.2.5", Port: 4420, HostNQN: host}); err != nil {
		t.Fatal(err)
	}
	failing := k.initiator()
	failing.WriteFile = func(string, []byte) error { return syscall.EBUSY }
	if err := failing.Disconnect(t.Context(), nqn); err == nil {
		t.Error("disconnect whose delete_controller write fails returned nil")
	}
	if err := in.Disconnect(t.Context(), nqn); err != nil {
		t.Fatal(err)
	}
	if dev, _ := in.Device(nqn); dev != "" {
		t.Errorf("device %s still visible after disconnect", dev)
	}
	// A controller that never goes: bounded wait, then an error.
	k.connect(nqn, host, "traddr=192.0.2.5,trsvcid=4420")
	stuck := k.initiator()
	stuck.Timeout = 20 * time.Millisecond
	stuck.WriteFile = func(string, []byte) error { return nil }
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := stuck.Disconnect(ctx, nqn); err == nil {
		t.Error("disconnect of a subsystem that stays returned nil")
	}
}

func TestConnectOptions(t *testing.T) {
	tmo := int32(-1)
	got := ConnectOptions(Target{NQN: "n", Address: "10.0.0.1", Port: 4420, HostNQN: "h", CtrlLossTmo: &tmo, ReconnectDelay: 2})
	want := "nqn=n,transport=tcp,traddr=10.0.0.1,trsvcid=4420,hostnqn=h,hostid=27d5482e-ebd0-55de-8438-9774fce28c69,ctrl_loss_tmo=-1,reconnect_delay=2"
	if got != want {
		t.Errorf("ConnectOptions = %q, want %q", got, want)
	}
	// a UUID-based host NQN travels with its UUID as host id; secrets as dhchap options
	got = ConnectOptions(Target{NQN: "n", Address: "10.0.0.1", Port: 4420, HostNQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000A1",
		DHCHAPSecret: "DHHC-1:00:a:", DHCHAPCtrlSecret: "DHHC-1:00:b:"})
	if want := "nqn=n,transport=tcp,traddr=10.0.0.1,trsvcid=4420,hostnqn=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000A1," +
		"hostid=00000000-0000-4000-8000-0000000000a1,dhchap_secret=DHHC-1:00:a:,dhchap_ctrl_secret=DHHC-1:00:b:"; got != want {
		t.Errorf("ConnectOptions = %q, want %q", got, want)
	}
	// Protocol.nvmeofTcp.maxQueueSize reaches the fabrics write as queue_size.
	got = ConnectOptions(Target{NQN: "n", Address: "10.0.0.1", Port: 4420, QueueSize: 256})
	if want := "nqn=n,transport=tcp,traddr=10.0.0.1,trsvcid=4420,queue_size=256"; got != want {
		t.Errorf("ConnectOptions with QueueSize = %q, want %q", got, want)
	}
}

// Unstage without a stage record finds the volume's connections by subsystem NQN in sysfs:
// only the subsystems whose NQN ends in ":<volume id>", and after Disconnect none is left.
func TestSubsystemNQNsOfVolume(t *testing.T) {
	k := newFakeKernel(t)
	in := k.initiator()
	const id = "vol-0123456789abcdef0123456789abcdef01234567"
	if got, err := in.SubsystemNQNsOfVolume(id); err != nil || len(got) != 0 {
		t.Errorf("nothing connected: %q, %v", got, err)
	}
	if got, err := (&Initiator{SysRoot: filepath.Join(t.TempDir(), "nosys")}).SubsystemNQNsOfVolume(id); err != nil || len(got) != 0 {
		t.Errorf("no nvme sysfs: %q, %v", got, err)
	}
	k.connect(nqn, host, "traddr=192.0.2.5,trsvcid=4420")
	k.connect("nqn.2014-08.dev.plinth:vol-0123456789abcdef0123456789abcdef01234567x", host, "traddr=192.0.2.5,trsvcid=4420")
	k.connect("nqn.2014-08.dev.plinth:vol-ffffffffffffffffffffffffffffffffffffffff", host, "traddr=192.0.2.5,trsvcid=4420")
	got, err := in.SubsystemNQNsOfVolume(id)
	if err != nil || len(got) != 1 || got[0] != nqn {
		t.Fatalf("SubsystemNQNsOfVolume = %q, %v; want [%s]", got, err, nqn)
	}
	if err := in.Disconnect(t.Context(), got[0]); err != nil {
		t.Fatal(err)
	}
	if got, err := in.SubsystemNQNsOfVolume(id); err != nil || len(got) != 0 {
		t.Errorf("after disconnect: %q, %v", got, err)
	}
	if _, err := in.SubsystemNQNsOfVolume(""); err == nil {
		t.Error("empty volume id: no error")
	}
}

// AuthControllers lists the tcp controllers of the host NQN that hold a DH-HMAC-CHAP secret
// (as Linux shows them: "none" without), with their target address and secrets; Reauthenticate
// writes the controller secret before the host secret, exactly the Secret's bytes (no newline),
// and only the host secret for a unidirectional controller.
func TestAuthControllersAndReauthenticate(t *testing.T) {
	k := newFakeKernel(t)
	const host, other = "nqn.2014-08.org.nvmexpress:uuid:a", "nqn.2014-08.org.nvmexpress:uuid:b"
	k.connect("nqn.x:v1", host, "traddr=192.0.2.6,trsvcid=4420,src_addr=192.0.2.9") // nvme0: bidirectional
	k.connect("nqn.x:v2", host, "traddr=192.0.2.7,trsvcid=4420")                    // nvme1: no auth
	k.connect("nqn.x:v3", other, "traddr=192.0.2.6,trsvcid=4420")                   // nvme2: another host
	k.connect("nqn.x:v4", host, "traddr=192.0.2.6,trsvcid=4420")                    // nvme3: unidirectional
	set := func(c, attr, v string) { k.write(filepath.Join(k.sys, "class", "nvme", c, attr), v) }
	set("nvme0", "dhchap_secret", "DHHC-1:00:old:")
	set("nvme0", "dhchap_ctrl_secret", "DHHC-1:00:oldctrl:")
	set("nvme0", "state", "live")
	set("nvme1", "dhchap_secret", "none")
	set("nvme1", "dhchap_ctrl_secret", "none")
	set("nvme2", "dhchap_secret", "DHHC-1:00:b:")
	set("nvme3", "dhchap_secret", "DHHC-1:00:old3:")
	set("nvme3", "dhchap_ctrl_secret", "none")
	var writes []string
	in := &Initiator{SysRoot: k.sys, WriteFile: func(p string, data []byte) error {
		writes = append(writes, filepath.Base(filepath.Dir(p))+"/"+filepath.Base(p)+"="+string(data))
		return nil
	}}
	got, err := in.AuthControllers(host)
	if err != nil {
		t.Fatal(err)
	}
	want := []AuthController{
		{Name: "nvme0", SubsysNQN: "nqn.x:v1", Address: "192.0.2.6", State: "live", Secret: "DHHC-1:00:old:", CtrlSecret: "DHHC-1:00:oldctrl:"},
		{Name: "nvme3", SubsysNQN: "nqn.x:v4", Address: "192.0.2.6", Secret: "DHHC-1:00:old3:"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("AuthControllers:\n got %+v\nwant %+v", got, want)
	}
	if err := in.Reauthenticate("nvme0", "DHHC-1:00:new:", "DHHC-1:00:newctrl:"); err != nil {
		t.Fatal(err)
	}
	if err := in.Reauthenticate("nvme3", "DHHC-1:00:new:", ""); err != nil {
		t.Fatal(err)
	}
	if w := []string{"nvme0/dhchap_ctrl_secret=DHHC-1:00:newctrl:", "nvme0/dhchap_secret=DHHC-1:00:new:", "nvme3/dhchap_secret=DHHC-1:00:new:"}; !slices.Equal(writes, w) {
		t.Errorf("writes %q, want %q", writes, w)
	}
	in.WriteFile = func(string, []byte) error { return &os.PathError{Op: "write", Path: "x", Err: syscall.EINVAL} }
	if err := in.Reauthenticate("nvme0", "DHHC-1:00:new:", ""); err == nil || strings.Contains(err.Error(), "DHHC-1") {
		t.Errorf("a refused write: %v, want an error that names the attribute, not the secret", err)
	}
}
