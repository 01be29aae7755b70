package main

import (
	"testing"

	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// TestCommandLine holds plinth-dev to the command line `plinth dev` had before it left the
// plinth binary: up and down, with the same flags and defaults (README's `make dev` section).
func TestCommandLine(t *testing.T) {
	root := newRootCommand()
	want := map[string]map[string]string{
		"up": {
			"dir": devenv.DefaultDir, "bin": "", "images": "", "nodes": "3",
			"flux": "true", "no-flux": "false", "keep": "false",
		},
		"down": {"dir": devenv.DefaultDir},
	}
	subs := root.Commands()
	if len(subs) != len(want) {
		t.Errorf("plinth-dev has %d subcommands, want %d (up, down)", len(subs), len(want))
	}
	for _, sub := range subs {
		flags, ok := want[sub.Name()]
		if !ok {
			t.Errorf("unexpected subcommand %q", sub.Name())
			continue
		}
		for name, def := range flags {
			f := sub.Flags().Lookup(name)
			if f == nil {
				t.Errorf("plinth-dev %s has no --%s", sub.Name(), name)
				continue
			}
			if f.DefValue != def {
				t.Errorf("plinth-dev %s --%s defaults to %q, want %q", sub.Name(), name, f.DefValue, def)
			}
		}
	}
	root.SetArgs([]string{"up", "extra"})
	if err := root.Execute(); err == nil {
		t.Error("plinth-dev up extra: want an error for the extra argument, got none")
	}
}
