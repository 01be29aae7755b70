package main

import (
	"bytes"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "plinth "+version+"\n"; got != want {
		t.Errorf("plinth version printed %q, want %q", got, want)
	}
}
