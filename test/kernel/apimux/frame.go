// Package apimux carries many TCP connections over one byte stream, so that a
// qemu guest of test/kernel can open as many connections to the host's
// kube-apiserver as it likes.
//
// qemu's guestfwd to a host socket is a chardev: qemu connects it once at
// boot and carries every guest connection to the forwarded address (for the
// guest suites 10.0.2.100:6443) over that ONE byte stream, unframed (checked
// in a guest: the host sees one connection, opened before the guest runs).
// So the guest runs Mux (through test/kernel/cmd/apimux), which listens on
// the guest's loopback and frames each accepted connection as a stream, and
// the host test runs a Demux on the guestfwd's host port, which dials the
// backend (the API server) once per stream.
//
// The wire format, both directions, is a sequence of frames:
//
//	offset  size  field
//	0       4     stream id, uint32 big endian (chosen by the guest side: 1, 2, 3, …)
//	4       1     type: 0 Open, 1 Data, 2 Close (FrameType)
//	5       4     payload length in bytes, uint32 big endian (at most MaxPayload)
//	9       n     payload (empty for Open and Close)
//
// A Close ends the stream in both directions: its receiver closes its
// connection (there is no half-close). The host answers an Open it cannot
// dial with a Close for that stream (the open-failed frame). Data or Close
// for a stream the receiver does not know is ignored. There is no flow
// control: a receiver writes each Data payload to its connection before it
// reads the next frame, so one slow reader stalls every stream.
package apimux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// FrameType is the byte at offset 4 of a frame header.
type FrameType byte

const (
	// Open (0) starts a stream; only the guest side sends it, with an empty
	// payload.
	Open FrameType = 0
	// Data (1) carries payload bytes of a stream, in order.
	Data FrameType = 1
	// Close (2) ends a stream in both directions, with an empty payload; the
	// host also sends it in answer to an Open whose backend dial failed.
	Close FrameType = 2
)

// String returns "open", "data", "close" or "type(N)".
func (t FrameType) String() string {
	switch t {
	case Open:
		return "open"
	case Data:
		return "data"
	case Close:
		return "close"
	}
	return fmt.Sprintf("type(%d)", byte(t))
}

const (
	// HeaderLen is the size of a frame header in bytes: stream id (4), type
	// (1), payload length (4).
	HeaderLen = 9
	// MaxPayload is the largest payload in bytes that ReadFrame accepts
	// (1 MiB); Mux and Demux send at most chunk bytes per Data frame.
	MaxPayload = 1 << 20
	// chunk is the read buffer of a carried connection, in bytes: the
	// largest Data payload Mux and Demux send.
	chunk = 32 << 10
)

// ErrFrame is wrapped by the errors ReadFrame returns for a frame that breaks
// the format (unknown type, payload over MaxPayload).
var ErrFrame = errors.New("apimux: bad frame")

// Frame is one frame of the wire format (see the package comment).
type Frame struct {
	// Stream is the stream id.
	Stream uint32
	// Type is Open, Data or Close.
	Type FrameType
	// Payload is the frame's data; nil or empty for Open and Close.
	Payload []byte
}

// AppendFrame appends the encoding of f (header, then payload) to b and
// returns the extended slice. It does not check f.
func AppendFrame(b []byte, f Frame) []byte {
	b = binary.BigEndian.AppendUint32(b, f.Stream)
	b = append(b, byte(f.Type))
	b = binary.BigEndian.AppendUint32(b, uint32(len(f.Payload)))
	return append(b, f.Payload...)
}

// WriteFrame writes f to w in a single Write call. Callers that share w
// between goroutines serialize the calls. It returns w's error.
func WriteFrame(w io.Writer, f Frame) error {
	_, err := w.Write(AppendFrame(make([]byte, 0, HeaderLen+len(f.Payload)), f))
	return err
}

// ReadFrame reads one frame from r. It returns io.EOF when r ends before the
// first header byte, io.ErrUnexpectedEOF when it ends inside a frame, and an
// error wrapping ErrFrame for an unknown type or a payload length over
// MaxPayload. The payload is a new slice (nil when empty).
func ReadFrame(r io.Reader) (Frame, error) {
	var h [HeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	f := Frame{Stream: binary.BigEndian.Uint32(h[0:4]), Type: FrameType(h[4])}
	n := binary.BigEndian.Uint32(h[5:9])
	if f.Type > Close {
		return Frame{}, fmt.Errorf("%w: stream %d: %s", ErrFrame, f.Stream, f.Type)
	}
	if n > MaxPayload {
		return Frame{}, fmt.Errorf("%w: stream %d: %s payload of %d bytes, over %d", ErrFrame, f.Stream, f.Type, n, MaxPayload)
	}
	if n == 0 {
		return f, nil
	}
	f.Payload = make([]byte, n)
	if _, err := io.ReadFull(r, f.Payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return f, nil
}
