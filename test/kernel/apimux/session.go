package apimux

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// session is one end of a framed byte stream: the streams it carries and the
// serialized writer. Mux and Demux differ only in who opens streams.
type session struct {
	up  io.ReadWriter
	wmu sync.Mutex // serializes frames on up

	mu    sync.Mutex
	conns map[uint32]net.Conn

	pumps sync.WaitGroup
}

func newSession(up io.ReadWriter) *session {
	return &session{up: up, conns: map[uint32]net.Conn{}}
}

func (s *session) send(f Frame) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return WriteFrame(s.up, f)
}

// register makes c the connection of stream id, for Data and Close frames.
func (s *session) register(id uint32, c net.Conn) {
	s.mu.Lock()
	s.conns[id] = c
	s.mu.Unlock()
}

// startPump copies what c reads into Data frames of stream id.
func (s *session) startPump(id uint32, c net.Conn) {
	s.pumps.Add(1)
	go s.pump(id, c)
}

// pump sends what c reads as Data frames of stream id and a Close when c
// ends (EOF, error, or closed on the peer's Close).
func (s *session) pump(id uint32, c net.Conn) {
	defer s.pumps.Done()
	buf := make([]byte, chunk)
	for {
		n, err := c.Read(buf)
		if n > 0 && s.send(Frame{Stream: id, Type: Data, Payload: buf[:n]}) != nil {
			return
		}
		if err != nil {
			s.send(Frame{Stream: id, Type: Close}) //nolint:errcheck // the stream is gone either way
			return
		}
	}
}

// run reads frames until up fails and delivers Data and Close to the
// streams' connections. open handles an Open frame; nil makes an Open a
// protocol error (the guest side never receives one).
func (s *session) run(open func(id uint32)) error {
	for {
		f, err := ReadFrame(s.up)
		if err != nil {
			return err
		}
		switch f.Type {
		case Open:
			if open == nil {
				return fmt.Errorf("%w: open of stream %d from the host side", ErrFrame, f.Stream)
			}
			open(f.Stream)
		case Data:
			s.mu.Lock()
			c := s.conns[f.Stream]
			s.mu.Unlock()
			if c != nil {
				c.Write(f.Payload) //nolint:errcheck // a failed connection ends in its pump, which sends Close
			}
		case Close:
			s.mu.Lock()
			c := s.conns[f.Stream]
			delete(s.conns, f.Stream)
			s.mu.Unlock()
			if c != nil {
				c.Close()
			}
		}
	}
}

// closeAll closes every carried connection and waits for their pumps.
func (s *session) closeAll() {
	s.mu.Lock()
	for id, c := range s.conns {
		c.Close()
		delete(s.conns, id)
	}
	s.mu.Unlock()
	s.pumps.Wait()
}
