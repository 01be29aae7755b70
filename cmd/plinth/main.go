// Command plinth is Plinth's one binary: vet and render policy offline, and run the
// controller, the node agent and the CSI driver in the cluster.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// Exit codes shared by the subcommands.
const (
	exitOK      = 0
	exitInvalid = 1 // the policy has problems (vet), or differences (diff)
	exitUsage   = 2 // usage, I/O or internal errors
)

// exitError carries an exit code out of a subcommand.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	root := newRootCommand()
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "plinth:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "plinth:", err)
	return exitUsage
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "plinth",
		Short:         "Plinth: a GitOps storage fleet manager for bare-metal Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, newCmd := range subcommands {
		root.AddCommand(newCmd())
	}
	return root
}

// subcommands holds the constructors of the subcommands; each subcommand's file registers
// its own in an init function, so adding one touches no other file.
var subcommands []func() *cobra.Command
