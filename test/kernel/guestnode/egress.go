package guestnode

import (
	"bufio"

	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// Egress is the API server's way to the kubelets inside the guests: an HTTP CONNECT proxy on a
// unix socket that kube-apiserver's "cluster" egress selector dials (EgressSelectorConfig)
// for every connection to a node (logs, exec, port-forward) — the role konnectivity plays in a
// cluster whose control plane cannot route to its nodes. A guest's kubelet listens on its
// node address, which only the guests' private network knows; the host reaches it through a
// qemu hostfwd port. Route maps the node address (host:port, as the Node reports it) to that
// port; any other target is dialled as asked.
type Egress struct {
	// Socket is the unix socket path the proxy listens on.
	Socket string

	l      net.Listener
	srv    *http.Server
	mu     sync.Mutex
	routes map[string]string
	dials  map[string]int
	conns  map[net.Conn]struct{} // both ends of every open tunnel
}

// StartEgress listens on socket (removed first if it exists) and serves CONNECT requests until
// Close. The error names the socket.
func StartEgress(socket string) (*Egress, error) {
	os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	e := &Egress{Socket: socket, l: l, routes: map[string]string{}, dials: map[string]int{}, conns: map[net.Conn]struct{}{}}
	e.srv = &http.Server{Handler: http.HandlerFunc(e.connect), ReadHeaderTimeout: 30 * time.Second}
	go e.srv.Serve(l) //nolint:errcheck // ends with Close
	return e, nil
}

// Route sends connections for target (host:port) to to (host:port).
func (e *Egress) Route(target, to string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.routes[target] = to
}

// Dials returns how many connections the proxy made for target (host:port) so far.
func (e *Egress) Dials(target string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.dials[target]
}

// Close stops the proxy and ends its tunnels.
func (e *Egress) Close() error {
	err := e.srv.Close()
	e.mu.Lock()
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	os.Remove(e.Socket)
	return err
}

func (e *Egress) connect(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "egress proxy: only CONNECT", http.StatusMethodNotAllowed)
		return
	}
	target := r.Host
	e.mu.Lock()
	to, ok := e.routes[target]
	if !ok {
		to = target
	}
	e.dials[target]++
	e.mu.Unlock()
	up, err := net.DialTimeout("tcp", to, 30*time.Second)
	if err != nil {
		http.Error(w, fmt.Sprintf("egress proxy: %s (via %s): %v", target, to, err), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "egress proxy: cannot hijack", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	if _, err := down.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		up.Close()
		down.Close()
		return
	}
	e.mu.Lock()
	e.conns[up], e.conns[down] = struct{}{}, struct{}{}
	e.mu.Unlock()
	go func() {
		pipe(up, down, buf.Reader)
		e.mu.Lock()
		delete(e.conns, up)
		delete(e.conns, down)
		e.mu.Unlock()
	}()
}

// pipe copies both ways until either side ends, then closes both.
func pipe(up, down net.Conn, pending *bufio.Reader) {
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, pending) // bytes the client sent after the CONNECT, then the rest
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(down, up)
		done <- struct{}{}
	}()
	<-done
	up.Close()
	down.Close()
	<-done
}

// EgressSelectorConfig returns kube-apiserver's --egress-selector-config-file content that
// sends the "cluster" egress (API server → kubelets, and webhooks and Services) through the
// HTTP CONNECT proxy at socket.
func EgressSelectorConfig(socket string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %q
`, socket))
}
