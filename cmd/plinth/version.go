package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newVersionCommand) }

// version is Plinth's version, printed by `plinth version` and reported by the agent in its
// Agent status. `make build` and `make images` set it from the Makefile's VERSION with
// -ldflags "-X main.version=...".
var version = "dev"

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print Plinth's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "plinth %s\n", version)
			return err
		},
	}
}
