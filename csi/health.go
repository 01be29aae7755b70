package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// Healthz returns the liveness handler (served at /healthz): it checks the driver from the
// outside, the way the livenessprobe sidecar and node-driver-registrar's health endpoint do,
// so a hung or vanished socket fails it while the process itself still runs. It calls the
// CSI Probe on the driver's own endpoint and, with kubelet registration on, GetInfo on the
// registration socket, each bounded by Options.ProbeTimeout. It answers 200 "ok", or 500
// with the reason: the socket cannot be reached or answers an error, Probe says not ready,
// the registration socket is gone or names another driver.
func (d *Driver) Healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d.opts.ProbeTimeout)
		defer cancel()
		if err := d.checkHealth(ctx); err != nil {
			d.log.Error(err, "health check failed")
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
	})
}

func (d *Driver) checkHealth(ctx context.Context) error {
	network, addr := endpointAddress(d.opts.Endpoint)
	conn, err := dialLocal(network, addr)
	if err != nil {
		return fmt.Errorf("CSI endpoint %s: %w", d.opts.Endpoint, err)
	}
	defer conn.Close()
	resp, err := csipb.NewIdentityClient(conn).Probe(ctx, &csipb.ProbeRequest{})
	if err != nil {
		return fmt.Errorf("CSI Probe on %s: %w", d.opts.Endpoint, err)
	}
	// An absent ready field means ready (CSI spec Probe).
	if r := resp.GetReady(); r != nil && !r.GetValue() {
		return errors.New("CSI Probe: the driver answers but is not ready")
	}
	if d.regPath == "" {
		return nil
	}
	if _, err := os.Stat(d.regPath); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kubelet registration socket %s does not exist", d.regPath)
	}
	rconn, err := dialLocal("unix", d.regPath)
	if err != nil {
		return fmt.Errorf("kubelet registration socket %s: %w", d.regPath, err)
	}
	defer rconn.Close()
	info, err := registerapi.NewRegistrationClient(rconn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo on kubelet registration socket %s: %w", d.regPath, err)
	}
	if info.GetName() != policyv1.DriverName {
		return fmt.Errorf("kubelet registration socket %s names driver %q, not %s", d.regPath, info.GetName(), policyv1.DriverName)
	}
	return nil
}

// endpointAddress splits an endpoint as listen reads it: unix:///path or a bare path (unix),
// tcp://host:port.
func endpointAddress(endpoint string) (network, addr string) {
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		return "unix", strings.TrimPrefix(endpoint, "unix://")
	case strings.HasPrefix(endpoint, "tcp://"):
		return "tcp", strings.TrimPrefix(endpoint, "tcp://")
	}
	return "unix", endpoint
}

// dialLocal returns a gRPC client of a unix socket or TCP address; it connects on first use.
func dialLocal(network, addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///plinth-csi", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}))
}
