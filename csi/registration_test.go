package csi_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// kubeletEndpoint is what the DaemonSet announces: the CSI socket as kubelet on the host sees it.
const kubeletEndpoint = "/var/lib/kubelet/plugins/csi.plinth.dev/csi.sock"

// regEnv is a node plugin's folders: a short root (unix socket paths hold 108 bytes) with the
// CSI socket, the stage records and a stand-in for kubelet's plugins_registry folder.
type regEnv struct {
	dir, csiSock, regDir, regSock string
}

func newRegEnv(t *testing.T) regEnv {
	t.Helper()
	dir, err := os.MkdirTemp("", "plinth-reg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := regEnv{dir: dir, csiSock: filepath.Join(dir, "csi.sock"), regDir: filepath.Join(dir, "plugins_registry")}
	e.regSock = filepath.Join(e.regDir, csi.RegistrationSocketName)
	if err := os.Mkdir(e.regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e regEnv) options(t *testing.T, reg prometheus.Registerer) csi.Options {
	return csi.Options{
		Mode: csi.ModeNode, NodeName: "reg-node", Endpoint: "unix://" + e.csiSock,
		StateDir: filepath.Join(e.dir, "state"), HostNQNFile: filepath.Join(e.dir, "no-hostnqn"),
		RegistrationDir: e.regDir, KubeletRegistrationPath: kubeletEndpoint,
		ProbeTimeout: 30 * time.Second, // generous: the 200 case must not depend on a loaded machine
		Registerer:   reg, Log: testr.NewWithOptions(t, testr.Options{Verbosity: 2}),
	}
}

// running is a Driver whose Run is in progress.
type running struct {
	d      *csi.Driver
	cancel context.CancelFunc
	done   chan error
}

// runDriver starts d.Run and returns once both sockets listen (Driver.Serving), or fails t.
func runDriver(t *testing.T, d *csi.Driver) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{d: d, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- d.Run(ctx) }()
	t.Cleanup(r.stopQuiet)
	select {
	case <-d.Serving():
	case err := <-r.done:
		t.Fatalf("driver stopped before serving: %v", err)
	}
	return r
}

// stop ends Run and returns its error.
func (r *running) stop() error {
	if r.done == nil {
		return nil
	}
	r.cancel()
	err := <-r.done
	r.done = nil
	return err
}

func (r *running) stopQuiet() { _ = r.stop() }

// dialUnix returns a gRPC client of a unix socket, dialled as kubelet's plugin watcher does,
// closed when t ends.
func dialUnix(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+path, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// leaveStaleSocket leaves a socket file nobody listens on at path, as a killed plugin does.
func leaveStaleSocket(t *testing.T, path string) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	lis.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("stale socket: %v", err)
	}
}

// The node plugin serves kubelet's plugin registration API on
// <registration dir>/csi.plinth.dev-reg.sock, driven here by kubelet's own generated client the
// way kubelet's plugin watcher drives it: GetInfo, then NodeGetInfo on the CSI socket, then
// NotifyRegistrationStatus. A failed registration is logged and the server keeps serving
// (kubelet retries); a stale socket is replaced at start, the socket is removed at shutdown
// (kubelet deregisters) and made anew by the next run.
func TestKubeletRegistration(t *testing.T) {
	e := newRegEnv(t)
	leaveStaleSocket(t, e.regSock)
	metrics := prometheus.NewPedanticRegistry()
	d, err := csi.New(e.options(t, metrics))
	if err != nil {
		t.Fatal(err)
	}
	r := runDriver(t, d)

	fi, err := os.Stat(e.regSock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("registration socket mode %v, want a socket with permissions 0600", fi.Mode())
	}
	kubelet := registerapi.NewRegistrationClient(dialUnix(t, e.regSock))
	info, err := kubelet.GetInfo(t.Context(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo on a socket that replaced a stale one: %v", err)
	}
	if info.GetType() != registerapi.CSIPlugin || info.GetName() != policyv1.DriverName || info.GetEndpoint() != kubeletEndpoint ||
		!slices.Equal(info.GetSupportedVersions(), []string{"1.0.0"}) {
		t.Errorf("GetInfo = %v, want type %s, name %s, endpoint %s, versions [1.0.0]", info, registerapi.CSIPlugin, policyv1.DriverName, kubeletEndpoint)
	}

	// What kubelet's CSI plugin asks next, on the CSI socket: the node id and the topology it
	// copies into the Node's labels and the CSINode's topologyKeys; the capabilities it checks
	// before NodeGetVolumeStats and NodeGetVolumeHealth.
	node := csipb.NewNodeClient(dialUnix(t, e.csiSock))
	ni, err := node.NodeGetInfo(t.Context(), &csipb.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ni.GetNodeId() != "reg-node" || len(ni.GetAccessibleTopology().GetSegments()) != 1 ||
		ni.GetAccessibleTopology().GetSegments()[policyv1.TopologyKeyNode] != "reg-node" {
		t.Errorf("NodeGetInfo = %v, want node id reg-node and topology {%s: reg-node}", ni, policyv1.TopologyKeyNode)
	}
	caps, err := node.NodeGetCapabilities(t.Context(), &csipb.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var rpcs []csipb.NodeServiceCapability_RPC_Type
	for _, c := range caps.GetCapabilities() {
		rpcs = append(rpcs, c.GetRpc().GetType())
	}
	for _, want := range []csipb.NodeServiceCapability_RPC_Type{csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS, csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH} {
		if !slices.Contains(rpcs, want) {
			t.Errorf("NodeGetCapabilities %v lacks %v", rpcs, want)
		}
	}

	gauge := func() float64 {
		t.Helper()
		mfs, err := metrics.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "plinth_csi_kubelet_registered" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("plinth_csi_kubelet_registered is not registered")
		return 0
	}
	if g := gauge(); g != 0 {
		t.Errorf("plinth_csi_kubelet_registered before any status = %v, want 0", g)
	}
	if _, err := kubelet.NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if g := gauge(); g != 1 {
		t.Errorf("plinth_csi_kubelet_registered after registered = %v, want 1", g)
	}
	if _, err := kubelet.NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: false, Error: "RegisterPlugin error -- plugin registration failed"}); err != nil {
		t.Fatal(err)
	}
	if g := gauge(); g != 0 {
		t.Errorf("plinth_csi_kubelet_registered after a failed registration = %v, want 0", g)
	}
	if _, err := kubelet.GetInfo(t.Context(), &registerapi.InfoRequest{}); err != nil {
		t.Errorf("GetInfo after a failed registration (kubelet's retry): %v", err)
	}

	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(e.regSock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("registration socket after shutdown: %v, want it removed (kubelet deregisters on removal)", err)
	}

	d2, err := csi.New(e.options(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	r2 := runDriver(t, d2)
	info, err = registerapi.NewRegistrationClient(dialUnix(t, e.regSock)).GetInfo(t.Context(), &registerapi.InfoRequest{})
	if err != nil || info.GetName() != policyv1.DriverName {
		t.Fatalf("GetInfo after a restart = %v, %v", info, err)
	}
	if err := r2.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(e.regSock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("registration socket after the second shutdown: %v", err)
	}
}

// A registration folder that does not exist is kubelet's root elsewhere: an error naming the
// folder and the flag, not a socket made where kubelet never looks.
func TestKubeletRegistrationFolderMissing(t *testing.T) {
	e := newRegEnv(t)
	opts := e.options(t, nil)
	opts.RegistrationDir = filepath.Join(e.dir, "no-such-folder")
	d, err := csi.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), opts.RegistrationDir) || !strings.Contains(err.Error(), "--registration-dir") {
		t.Fatalf("Run with a missing registration folder = %v, want an error naming %s and --registration-dir", err, opts.RegistrationDir)
	}
	if _, err := os.Stat(opts.RegistrationDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the missing registration folder was created: %v", err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// Liveness from the driver itself (no livenessprobe sidecar): /healthz calls the CSI Probe
// through the driver's own socket and GetInfo on the registration socket. 500 with the reason
// before the driver serves, when the registration socket is gone and when the CSI socket is
// closed; 200 "ok" while both answer.
func TestHealthzNode(t *testing.T) {
	e := newRegEnv(t)
	d, err := csi.New(e.options(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Healthz())
	t.Cleanup(srv.Close)

	check := func(what string, wantCode int, wantBody string) {
		t.Helper()
		code, body := get(t, srv.URL+"/healthz")
		if code != wantCode || !strings.Contains(body, wantBody) {
			t.Errorf("%s: /healthz = %d %q, want %d with %q", what, code, body, wantCode, wantBody)
		}
	}
	check("before Run", http.StatusInternalServerError, "CSI Probe on unix://"+e.csiSock)
	r := runDriver(t, d)
	check("serving", http.StatusOK, "ok")

	if err := os.Remove(e.regSock); err != nil {
		t.Fatal(err)
	}
	check("registration socket removed", http.StatusInternalServerError, "kubelet registration socket "+e.regSock+" does not exist")
	leaveStaleSocket(t, e.regSock)
	check("registration socket nobody listens on", http.StatusInternalServerError, "GetInfo on kubelet registration socket "+e.regSock)

	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	check("CSI socket closed", http.StatusInternalServerError, "CSI Probe on unix://"+e.csiSock)
}

// The controller's liveness is the same check without registration: its Probe, through its
// socket, against the real API server.
func TestHealthzController(t *testing.T) {
	cp := sharedControlPlane(t)
	dir, err := os.MkdirTemp("", "plinth-hz-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "csi.sock")
	d, err := csi.New(csi.Options{Mode: csi.ModeController, Endpoint: "unix://" + sock, Config: cp.Admin.Config,
		RegistrationDir: filepath.Join(dir, "not-used"), ProbeTimeout: 30 * time.Second, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Healthz())
	t.Cleanup(srv.Close)
	if code, body := get(t, srv.URL); code != http.StatusInternalServerError || !strings.Contains(body, "CSI Probe on unix://"+sock) {
		t.Errorf("before Run: /healthz = %d %q, want 500 naming the socket", code, body)
	}
	r := runDriver(t, d)
	if code, body := get(t, srv.URL); code != http.StatusOK || body != "ok" {
		t.Errorf("serving: /healthz = %d %q, want 200 ok", code, body)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if code, _ := get(t, srv.URL); code != http.StatusInternalServerError {
		t.Errorf("stopped: /healthz = %d, want 500", code)
	}
}
