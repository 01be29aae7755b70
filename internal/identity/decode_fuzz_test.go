package identity

import (
	"errors"
	"testing"
)

// FuzzParseText feeds arbitrary record contents (a torn write, a disk error or a hand edit
// can leave anything beside a volume) to the decoder the agents use. Properties: no panic;
// a refusal wraps ErrNoStamp, ErrUnknownVersion or ErrTorn; an accepted stamp is valid and
// is exactly its own canonical encoding (one record decodes to one stamp, never two
// different texts to the same stamp), and the one-line form decodes to it too.
func FuzzParseText(f *testing.F) {
	s := sample()
	text, _ := s.Text()
	f.Add(text)
	f.Add(text[:len(text)-1])
	f.Add("v=2\nvol=x\n")
	f.Add("v=1\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, data string) {
		got, err := ParseText(data)
		if err != nil {
			if !errors.Is(err, ErrNoStamp) && !errors.Is(err, ErrUnknownVersion) && !errors.Is(err, ErrTorn) {
				t.Fatalf("ParseText(%q) = %v: not one of the documented errors", data, err)
			}
			return
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("ParseText(%q) accepted an invalid stamp: %v", data, err)
		}
		again, err := got.Text()
		if err != nil || again != data {
			t.Fatalf("ParseText(%q) = %+v, whose encoding is %q (%v)", data, got, again, err)
		}
		line, _ := got.Line()
		if back, err := ParseLine(line); err != nil || back != got {
			t.Fatalf("line form %q decodes to %+v, %v", line, back, err)
		}
	})
}
