package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// Kubelet plugin registration: the node plugin registers itself with kubelet the way
// node-driver-registrar would, through kubelet's plugin registration API
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1). Kubelet's plugin watcher notices a socket
// in its plugins_registry folder, calls GetInfo, then — for a CSIPlugin — calls NodeGetInfo on
// the returned endpoint, labels the Node with the accessible topology, writes the driver into
// the CSINode object and reports the outcome with NotifyRegistrationStatus. When the socket
// goes away kubelet deregisters the driver.

// DefaultRegistrationDir is kubelet's plugin registration folder (kubelet --root-dir
// /var/lib/kubelet); the registration socket is RegistrationSocketName in it.
const DefaultRegistrationDir = "/var/lib/kubelet/plugins_registry"

// DefaultKubeletRegistrationPath is the CSI socket path as kubelet on the host sees it, which
// GetInfo returns: the DaemonSet mounts the host folder
// /var/lib/kubelet/plugins/csi.plinth.dev at /csi in the container.
const DefaultKubeletRegistrationPath = "/var/lib/kubelet/plugins/csi.plinth.dev/csi.sock"

// RegistrationSocketName is the file name of the registration socket, `<plugin name>-reg.sock`
// as kubelet's plugin watcher recommends (its README: "Plugin Discovery").
const RegistrationSocketName = policyv1.DriverName + "-reg.sock"

// csiSupportedVersions are the CSI versions GetInfo announces; kubelet accepts any 1.x.
var csiSupportedVersions = []string{"1.0.0"}

// registrar answers kubelet's plugin watcher on the registration socket.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	endpoint   string
	log        logr.Logger
	registered prometheus.Gauge
}

// GetInfo names the plugin: a CSI plugin csi.plinth.dev reachable at the kubelet-side socket path.
func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.log.V(2).Info("kubelet asks for the plugin info")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              policyv1.DriverName,
		Endpoint:          r.endpoint,
		SupportedVersions: csiSupportedVersions,
	}, nil
}

// NotifyRegistrationStatus logs kubelet's verdict and keeps serving either way.
// node-driver-registrar exits on a failed registration so that its container restarts and
// recreates the socket; here the same process serves the CSI node service (and may be in the
// middle of staging a volume), and kubelet's plugin reconciler retries a failed registration
// by itself with exponential backoff, so staying up loses nothing.
func (r *registrar) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		r.registered.Set(1)
		r.log.Info("kubelet registered the driver", "driver", policyv1.DriverName, "endpoint", r.endpoint)
	} else {
		r.registered.Set(0)
		r.log.Error(errors.New(st.GetError()), "kubelet did not register the driver; it will retry", "driver", policyv1.DriverName, "endpoint", r.endpoint)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// registrationServer is the running registration service.
type registrationServer struct {
	path string
	srv  *grpc.Server
	done chan error
}

// serveRegistration removes a stale socket left by an earlier run, listens on
// <dir>/RegistrationSocketName (readable by its owner only: kubelet runs as root) and serves
// the registration API. The folder must exist: it is kubelet's, and creating it where kubelet
// does not look would register nothing.
func (d *Driver) serveRegistration() (*registrationServer, error) {
	dir := d.opts.RegistrationDir
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("kubelet registration folder: %w (is kubelet's --root-dir elsewhere? an empty --registration-dir disables registration)", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("kubelet registration folder %s is not a folder", dir)
	}
	path := filepath.Join(dir, RegistrationSocketName)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale registration socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on registration socket: %w", err)
	}
	// Removal is stop's job: a listener unlinking on close could remove the socket of a
	// successor that already listens at the same path.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("registration socket: %w", err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &registrar{
		endpoint:   d.opts.KubeletRegistrationPath,
		log:        d.log.WithName("registration"),
		registered: d.registered,
	})
	rs := &registrationServer{path: path, srv: srv, done: make(chan error, 1)}
	go func() { rs.done <- srv.Serve(lis) }()
	d.log.Info("serving kubelet plugin registration", "socket", path, "kubeletEndpoint", d.opts.KubeletRegistrationPath)
	return rs, nil
}

// failed delivers the error of a registration server that stopped on its own; nil (no
// registration) blocks forever.
func (rs *registrationServer) failed() <-chan error {
	if rs == nil {
		return nil
	}
	return rs.done
}

// stop removes the socket first, so kubelet deregisters the driver (as node-driver-registrar
// does on SIGTERM), then stops the server.
func (rs *registrationServer) stop() error {
	err := os.Remove(rs.path)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	rs.srv.Stop()
	<-rs.done
	if err != nil {
		return fmt.Errorf("remove registration socket: %w", err)
	}
	return nil
}
