package apimux

import (
	"io"
	"net"
)

// Mux is the guest side: it carries each connection accepted on l as a
// stream over up (the guest's connection to the guestfwd address), numbering
// the streams 1, 2, 3, … and sending Open, Data and Close frames (see the
// package comment); Data and Close from up go to the streams' connections.
//
// Mux runs until up fails (the error is io.EOF when the host end closes
// cleanly, one wrapping ErrFrame when it sends an Open or a malformed frame)
// or accepting on l fails (net.ErrClosed when the caller closed l). It then
// closes l, up and every carried connection, waits for its goroutines and
// returns that first error; it never returns nil.
func Mux(l net.Listener, up io.ReadWriteCloser) error {
	s := newSession(up)
	errc := make(chan error, 2)
	go func() { errc <- s.run(nil) }()
	go func() {
		var next uint32
		for {
			c, err := l.Accept()
			if err != nil {
				errc <- err
				return
			}
			next++
			// registered before the Open goes out, so that the host's
			// open-failed Close finds it; pumped after, so that no Data
			// precedes the Open
			s.register(next, c)
			if err := s.send(Frame{Stream: next, Type: Open}); err != nil {
				errc <- err
				return
			}
			s.startPump(next, c)
		}
	}()
	err := <-errc
	l.Close()
	up.Close()
	<-errc
	s.closeAll()
	return err
}
