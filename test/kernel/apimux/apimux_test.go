package apimux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// hangGuard bounds a wait that only a bug makes long, so that a broken stream
// fails with a message instead of the package timeout.
const hangGuard = time.Minute

// backend is a TCP server on 127.0.0.1 that runs handle for each connection,
// closes it afterwards and reports it on ended.
type backend struct {
	l     net.Listener
	ended chan struct{}
}

func startBackend(t *testing.T, handle func(net.Conn)) *backend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{l: l, ended: make(chan struct{}, 100)}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
				c.Close()
				b.ended <- struct{}{}
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return b
}

func (b *backend) addr() string { return b.l.Addr().String() }

// waitEnded waits until n backend connections have ended.
func (b *backend) waitEnded(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		select {
		case <-b.ended:
		case <-time.After(hangGuard):
			t.Fatalf("backend: %d of %d connections ended", i, n)
		}
	}
}

func echo(c net.Conn) { io.Copy(c, c) } //nolint:errcheck // ends with the connection

// pair runs a Demux in front of backend and a Mux whose upstream is a
// connection to it, as qemu's chardev would be. It returns the Mux's local
// address (what the guest's API clients dial), the Demux and Mux's result.
func pair(t *testing.T, backend string) (string, *Demux, <-chan error) {
	t.Helper()
	d, err := Start(backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	up, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(d.Port())))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Mux(l, up); close(done) }()
	t.Cleanup(func() { l.Close(); <-done })
	return l.Addr().String(), d, done
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// roundTrip writes p to c while reading back len(p) bytes, and returns an
// error unless they are p.
func roundTrip(c net.Conn, p []byte) error {
	werr := make(chan error, 1)
	go func() { _, err := c.Write(p); werr <- err }()
	got := make([]byte, len(p))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, p) {
		i := 0
		for got[i] == p[i] {
			i++
		}
		return fmt.Errorf("%d bytes differ from byte %d on", len(p), i)
	}
	return nil
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

// readAll reads c to its end and fails t when that takes longer than
// hangGuard (a stream whose Close got lost).
func readAll(t *testing.T, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(hangGuard)) //nolint:errcheck
	p, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read to the end: %v", err)
	}
	return p
}

func TestMuxDemuxConcurrentEcho(t *testing.T) {
	be := startBackend(t, echo)
	addr, _, _ := pair(t, be.addr())
	const conns, size = 8, 300 << 10 // several Data frames of chunk bytes each way
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			// two round trips on the same stream, then close
			for j := range 2 {
				if err := roundTrip(c, randomBytes(uint64(i*10+j), size)); err != nil {
					errs <- fmt.Errorf("connection %d, round trip %d: %w", i, j, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// each client's close reached its backend connection
	be.waitEnded(t, conns)
}

func TestMuxDemuxBackendClosesFirst(t *testing.T) {
	be := startBackend(t, func(c net.Conn) {
		c.Write([]byte("hello from " + c.LocalAddr().String())) //nolint:errcheck
	})
	addr, _, _ := pair(t, be.addr())
	// open, read to the backend's close, open again: streams come and go
	for i := range 3 {
		c := dial(t, addr)
		got := string(readAll(t, c))
		c.Close()
		if want := "hello from " + be.addr(); got != want {
			t.Fatalf("connection %d read %q, want %q", i, got, want)
		}
	}
	be.waitEnded(t, 3)
}

func TestMuxDemuxRefused(t *testing.T) {
	be := startBackend(t, echo)
	addr, _, done := pair(t, be.addr())
	a := dial(t, addr)
	defer a.Close()
	if err := roundTrip(a, []byte("before")); err != nil {
		t.Fatal(err)
	}
	be.l.Close() // the backend refuses new connections; a's stays
	for i := range 2 {
		b := dial(t, addr)
		if got := readAll(t, b); len(got) != 0 {
			t.Fatalf("refused connection %d read %q", i, got)
		}
		b.Close()
	}
	// the refusal ended only its own streams
	if err := roundTrip(a, []byte("after")); err != nil {
		t.Fatalf("the open stream after a refusal: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Mux returned after a refused open: %v", err)
	default:
	}
}

func TestMuxDemuxHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body) // whole, before the response: net/http closes it then
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(body) //nolint:errcheck
	}))
	t.Cleanup(srv.Close)
	addr, _, _ := pair(t, srv.Listener.Addr().String())
	for _, keepAlive := range []bool{true, false} {
		t.Run(fmt.Sprintf("keep-alive=%v", keepAlive), func(t *testing.T) {
			tr := &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
				},
				DisableKeepAlives: !keepAlive,
				MaxConnsPerHost:   4,
			}
			t.Cleanup(tr.CloseIdleConnections)
			client := &http.Client{Transport: tr, Timeout: hangGuard}
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for i := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := randomBytes(uint64(100+i), 50<<10)
					resp, err := client.Post("http://apiserver/", "application/octet-stream", bytes.NewReader(body))
					if err != nil {
						errs <- err
						return
					}
					defer resp.Body.Close()
					got, err := io.ReadAll(resp.Body)
					if err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(got, body) {
						errs <- fmt.Errorf("request %d: %d bytes back, want the %d sent", i, len(got), len(body))
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

func TestDemuxCloseEndsMux(t *testing.T) {
	be := startBackend(t, echo)
	addr, d, done := pair(t, be.addr())
	c := dial(t, addr)
	defer c.Close()
	if err := roundTrip(c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	be.waitEnded(t, 1) // Close closed the backend connection
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Mux returned nil")
		}
	case <-time.After(hangGuard):
		t.Fatal("Mux did not return when its upstream closed")
	}
	if got := readAll(t, c); len(got) != 0 {
		t.Fatalf("read %q after the upstream closed", got)
	}
	if err := d.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v, want net.ErrClosed", err)
	}
}

// readStream reads frames from r until it has n Data bytes of stream id and
// fails t on any other frame.
func readStream(t *testing.T, r net.Conn, id uint32, n int) []byte {
	t.Helper()
	r.SetReadDeadline(time.Now().Add(hangGuard)) //nolint:errcheck
	var got []byte
	for len(got) < n {
		f, err := ReadFrame(r)
		if err != nil {
			t.Fatal(err)
		}
		if f.Stream != id || f.Type != Data {
			t.Fatalf("frame %s of stream %d, want data of stream %d", f.Type, f.Stream, id)
		}
		got = append(got, f.Payload...)
	}
	return got
}

func expectFrame(t *testing.T, r net.Conn, want Frame) {
	t.Helper()
	r.SetReadDeadline(time.Now().Add(hangGuard)) //nolint:errcheck
	f, err := ReadFrame(r)
	if err != nil {
		t.Fatal(err)
	}
	if f.Stream != want.Stream || f.Type != want.Type || !bytes.Equal(f.Payload, want.Payload) {
		t.Fatalf("frame %s of stream %d (%q), want %s of stream %d (%q)", f.Type, f.Stream, f.Payload, want.Type, want.Stream, want.Payload)
	}
}

// TestDemuxWire drives a Demux with frames written by hand, as apimux in the
// guest would.
func TestDemuxWire(t *testing.T) {
	be := startBackend(t, echo)
	d, err := Start(be.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	up := dial(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(d.Port())))
	defer up.Close()
	write := func(f Frame) {
		t.Helper()
		if err := WriteFrame(up, f); err != nil {
			t.Fatal(err)
		}
	}
	write(Frame{Stream: 7, Type: Open})
	write(Frame{Stream: 7, Type: Data, Payload: []byte("ping")})
	if got := readStream(t, up, 7, 4); string(got) != "ping" {
		t.Fatalf("stream 7 echoed %q", got)
	}
	write(Frame{Stream: 8, Type: Open})
	write(Frame{Stream: 8, Type: Data, Payload: []byte("pong")})
	if got := readStream(t, up, 8, 4); string(got) != "pong" {
		t.Fatalf("stream 8 echoed %q", got)
	}
	write(Frame{Stream: 99, Type: Data, Payload: []byte("nobody")}) // unknown stream: ignored
	write(Frame{Stream: 7, Type: Close})
	be.waitEnded(t, 1)
	expectFrame(t, up, Frame{Stream: 7, Type: Close}) // its backend connection's end
	be.l.Close()
	write(Frame{Stream: 9, Type: Open})
	expectFrame(t, up, Frame{Stream: 9, Type: Close}) // the open-failed frame
	write(Frame{Stream: 8, Type: Data, Payload: []byte("still")})
	if got := readStream(t, up, 8, 5); string(got) != "still" {
		t.Fatalf("stream 8 echoed %q after the refusal", got)
	}
	up.Close()
	be.waitEnded(t, 1) // the framed connection's end closed stream 8's backend
}

// TestMuxWire reads and writes the guest side's frames by hand over a
// net.Pipe standing in for qemu's chardev.
func TestMuxWire(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host, guestEnd := net.Pipe()
	defer host.Close()
	done := make(chan error, 1)
	go func() { done <- Mux(l, guestEnd) }()

	c1 := dial(t, l.Addr().String())
	defer c1.Close()
	expectFrame(t, host, Frame{Stream: 1, Type: Open})
	if _, err := c1.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	if got := readStream(t, host, 1, 3); string(got) != "abc" {
		t.Fatalf("stream 1 carried %q", got)
	}
	if err := WriteFrame(host, Frame{Stream: 1, Type: Data, Payload: []byte("xyz")}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 3)
	if _, err := io.ReadFull(c1, got); err != nil || string(got) != "xyz" {
		t.Fatalf("connection 1 read %q, %v", got, err)
	}
	c2 := dial(t, l.Addr().String())
	defer c2.Close()
	expectFrame(t, host, Frame{Stream: 2, Type: Open})
	// the host's Close (here: an open-failed answer) ends the connection,
	// whose end the guest side reports back
	if err := WriteFrame(host, Frame{Stream: 1, Type: Close}); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, c1); len(got) != 0 {
		t.Fatalf("connection 1 read %q after Close", got)
	}
	expectFrame(t, host, Frame{Stream: 1, Type: Close})
	// the client's close
	c2.Close()
	expectFrame(t, host, Frame{Stream: 2, Type: Close})
	// an Open from the host side is a protocol error that ends Mux
	c3 := dial(t, l.Addr().String())
	defer c3.Close()
	expectFrame(t, host, Frame{Stream: 3, Type: Open})
	if err := WriteFrame(host, Frame{Stream: 5, Type: Open}); err != nil {
		t.Fatal(err)
	}
	host.SetReadDeadline(time.Time{}) //nolint:errcheck
	go io.Copy(io.Discard, host)      //nolint:errcheck // c3's Close, if Mux sends it before closing up
	select {
	case err := <-done:
		if !errors.Is(err, ErrFrame) {
			t.Fatalf("Mux returned %v, want ErrFrame", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("Mux did not return on an Open from the host side")
	}
	if got := readAll(t, c3); len(got) != 0 {
		t.Fatalf("connection 3 read %q after Mux returned", got)
	}
	if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
		t.Fatal("Mux left its listener open")
	}
}

// TestStartForTest: the Demux fronts the URL's host:port and carries a
// request to it; t's cleanup closes it.
func TestStartForTest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "served "+r.URL.Path) //nolint:errcheck
	}))
	t.Cleanup(srv.Close)
	var d *Demux
	t.Run("inner", func(t *testing.T) {
		d = StartForTest(t, srv.URL)
		up := dial(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(d.Port())))
		defer up.Close()
		req := []byte("GET /readyz HTTP/1.0\r\nHost: x\r\n\r\n")
		for _, f := range []Frame{{Stream: 1, Type: Open}, {Stream: 1, Type: Data, Payload: req}} {
			if err := WriteFrame(up, f); err != nil {
				t.Fatal(err)
			}
		}
		var resp []byte
		for {
			up.SetReadDeadline(time.Now().Add(hangGuard)) //nolint:errcheck
			f, err := ReadFrame(up)
			if err != nil {
				t.Fatal(err)
			}
			if f.Type == Close {
				break
			}
			resp = append(resp, f.Payload...)
		}
		if !bytes.HasSuffix(resp, []byte("\r\n\r\nserved /readyz")) {
			t.Fatalf("response %q", resp)
		}
	})
	if err := d.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Close after the test's cleanup: %v, want net.ErrClosed", err)
	}
}
