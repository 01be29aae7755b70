package fencing

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeMark feeds arbitrary mark file contents (a disk, a crash or a hand edit can leave
// anything there) to the decoder Load uses. Properties: no panic; a refusal wraps ErrCorrupt;
// an accepted mark came from one valid JSON document, has a UID and no negative generation,
// and survives Save's encoding unchanged (decode(encode(m)) == m).
func FuzzDecodeMark(f *testing.F) {
	for _, s := range []string{
		`{"uid":"u1","generation":5,"publicationGeneration":3}`,
		`{"uid":"u2","generation":1,"publicationGeneration":0,"released":true,"retired":["u0","u1"],"exportBootID":"6c1f1b2e-0a4d-4f57-9d8e-3f1c1c7f0a11"}` + "\n",
		`{"uid":""}`, `{"uid":"u","generation":-1}`, `{"uid":"u","extra":1}`, "null", "", "{",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeMark(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decodeMark(%q) = %v, want an error wrapping ErrCorrupt", data, err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("decodeMark(%q) accepted input that is not one JSON document: %+v", data, m)
		}
		if m.UID == "" || m.Generation < 0 || m.PublicationGeneration < 0 {
			t.Fatalf("decodeMark(%q) accepted %+v: want a UID and no negative generation", data, m)
		}
		enc, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("encode %+v: %v", m, err)
		}
		back, err := decodeMark(append(enc, '\n'))
		if err != nil || !back.Equal(m) {
			t.Fatalf("round trip of %+v through %s: got %+v, %v", m, enc, back, err)
		}
	})
}
