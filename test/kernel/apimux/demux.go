package apimux

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// dialTimeout bounds one backend dial (an Open); the read loop waits for it.
const dialTimeout = 30 * time.Second

// Demux is the host side: it listens on 127.0.0.1 (the port a
// guest.Forward's HostPort names) and serves each connection to it (qemu
// makes one per guest boot) as a framed stream (see the package comment):
// for every Open it dials the backend over TCP, answering a failed dial with
// a Close for that stream, and copies bytes both ways as Data frames until a
// Close from either end.
type Demux struct {
	l       net.Listener
	backend string

	mu     sync.Mutex
	ups    map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // the accept loop and every serve
}

// Start listens on a free port of 127.0.0.1 and serves until Close. backend
// is the TCP address ("host:port") each stream is dialled to, for the guest
// suites the API server's (the host of controlplane's URL). It returns the
// listen error.
func Start(backend string) (*Demux, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("apimux: listen: %w", err)
	}
	d := &Demux{l: l, backend: backend, ups: map[net.Conn]struct{}{}}
	d.wg.Add(1)
	go d.accept()
	return d, nil
}

// Port returns the TCP port Demux listens on, on 127.0.0.1.
func (d *Demux) Port() int { return d.l.Addr().(*net.TCPAddr).Port }

// Close stops listening, closes every framed connection and every backend
// connection, and waits for Demux's goroutines. It returns the listener's
// close error; calling it again returns net.ErrClosed.
func (d *Demux) Close() error {
	err := d.l.Close()
	d.mu.Lock()
	d.closed = true
	for up := range d.ups {
		up.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
	return err
}

func (d *Demux) accept() {
	defer d.wg.Done()
	for {
		up, err := d.l.Accept()
		if err != nil {
			return
		}
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			up.Close()
			return
		}
		d.ups[up] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.serve(up)
	}
}

// serve demultiplexes one framed connection until it fails or closes.
func (d *Demux) serve(up net.Conn) {
	defer d.wg.Done()
	s := newSession(up)
	dialer := net.Dialer{Timeout: dialTimeout}
	s.run(func(id uint32) { //nolint:errcheck // the guest's end closed or broke: nothing to report to
		b, err := dialer.Dial("tcp", d.backend)
		if err != nil {
			s.send(Frame{Stream: id, Type: Close}) //nolint:errcheck // a broken up ends run next
			return
		}
		s.register(id, b)
		s.startPump(id, b)
	})
	up.Close()
	s.closeAll()
	d.mu.Lock()
	delete(d.ups, up)
	d.mu.Unlock()
}
