package guestnode

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
)

// connect dials the proxy's socket, asks for target and returns the connection and the status
// line of the proxy's answer.
func connect(t *testing.T, e *Egress, target string) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	c, err := net.Dial("unix", e.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	return c, r, resp.Status
}

// Expected: a CONNECT to a routed node address reaches the route's backend (a GET through the
// tunnel answers from it) and counts one dial for that address; an unrouted target is dialled
// as asked; an unreachable one answers 502 naming it; a non-CONNECT request answers 405.
func TestEgress(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "kubelet "+r.URL.Path)
	}))
	defer backend.Close()
	e, err := StartEgress(filepath.Join(t.TempDir(), "egress.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const node = "192.168.77.1:10250"
	e.Route(node, strings.TrimPrefix(backend.URL, "http://"))

	get := func(target string) string {
		c, r, status := connect(t, e, target)
		if !strings.HasPrefix(status, "200") {
			t.Fatalf("CONNECT %s: %s", target, status)
		}
		fmt.Fprintf(c, "GET /containerLogs HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := get(node); got != "kubelet /containerLogs" {
		t.Errorf("through the route: %q", got)
	}
	if n := e.Dials(node); n != 1 {
		t.Errorf("dials of %s: %d, want 1", node, n)
	}
	direct := strings.TrimPrefix(backend.URL, "http://")
	if got := get(direct); got != "kubelet /containerLogs" {
		t.Errorf("unrouted target: %q", got)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	e.Route("192.168.77.2:10250", closed)
	if _, _, status := connect(t, e, "192.168.77.2:10250"); !strings.HasPrefix(status, "502") {
		t.Errorf("CONNECT to a closed port: %s, want 502", status)
	}

	c, err := net.Dial("unix", e.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET to the proxy: %s, want 405", resp.Status)
	}
}
