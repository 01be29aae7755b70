package apimux

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFrameEncoding(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Frame
		wire []byte
	}{
		{"open", Frame{Stream: 1, Type: Open}, []byte{0, 0, 0, 1, 0, 0, 0, 0, 0}},
		{"data big endian", Frame{Stream: 0x01020304, Type: Data, Payload: []byte("hi")},
			[]byte{1, 2, 3, 4, 1, 0, 0, 0, 2, 'h', 'i'}},
		{"close of the last id", Frame{Stream: 0xffffffff, Type: Close}, []byte{0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0}},
		{"data of 300 bytes", Frame{Stream: 7, Type: Data, Payload: bytes.Repeat([]byte{0xaa}, 300)},
			append([]byte{0, 0, 0, 7, 1, 0, 0, 1, 0x2c}, bytes.Repeat([]byte{0xaa}, 300)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteFrame(&b, tc.f); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b.Bytes(), tc.wire) {
				t.Fatalf("wire\n got %x\nwant %x", b.Bytes(), tc.wire)
			}
			got, err := ReadFrame(&b)
			if err != nil {
				t.Fatal(err)
			}
			if got.Stream != tc.f.Stream || got.Type != tc.f.Type || !bytes.Equal(got.Payload, tc.f.Payload) {
				t.Fatalf("read back %+v, want %+v", got, tc.f)
			}
			if _, err := ReadFrame(&b); err != io.EOF {
				t.Fatalf("after the frame: %v, want io.EOF", err)
			}
		})
	}
}

func TestReadFrameErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		wire []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"short header", []byte{0, 0, 0, 1, 1}, io.ErrUnexpectedEOF},
		{"short payload", []byte{0, 0, 0, 1, 1, 0, 0, 0, 4, 'a', 'b'}, io.ErrUnexpectedEOF},
		{"header only, payload missing", []byte{0, 0, 0, 1, 1, 0, 0, 0, 4}, io.ErrUnexpectedEOF},
		{"unknown type", []byte{0, 0, 0, 1, 3, 0, 0, 0, 0}, ErrFrame},
		{"payload over MaxPayload", []byte{0, 0, 0, 1, 1, 0, 0x10, 0, 1}, ErrFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tc.wire))
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}

// FuzzReadFrame: whatever ReadFrame accepts, WriteFrame writes back as the
// same bytes.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 2, 3, 4, 1, 0, 0, 0, 2, 'h', 'i'})
	f.Add([]byte{0, 0, 0, 1, 2, 0, 0, 0, 0, 9})
	f.Fuzz(func(t *testing.T, wire []byte) {
		fr, err := ReadFrame(bytes.NewReader(wire))
		if err != nil {
			return
		}
		var b bytes.Buffer
		if err := WriteFrame(&b, fr); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), wire[:b.Len()]) {
			t.Fatalf("re-encoded %x, read from %x", b.Bytes(), wire)
		}
	})
}
