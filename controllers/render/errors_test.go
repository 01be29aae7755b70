package render

import (
	"errors"
	"slices"
	"testing"
)

func TestErrors(t *testing.T) {
	a, b, c := &Error{Kind: "Placement", Name: "a"}, &Error{Kind: "Placement", Name: "b"}, errors.New("c")
	if got := Errors(nil); got != nil {
		t.Errorf("Errors(nil) = %v", got)
	}
	if got := Errors(a); !slices.Equal(got, []error{a}) {
		t.Errorf("Errors(a) = %v", got)
	}
	if got := Errors(joinErrors([]error{a, errors.Join(b, c)})); !slices.Equal(got, []error{a, b, c}) {
		t.Errorf("nested join: %v, want [a b c] in order", got)
	}
}
