package backend

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// Runner runs name with args and returns stdout, stderr and the exit code;
// err is non-nil only when the command could not run or did not exit.
type Runner func(ctx context.Context, name string, args ...string) (stdout, stderr []byte, exitCode int, err error)

// ExecRunner returns a Runner that uses os/exec with the process environment
// plus LC_ALL=C (so messages are stable for classification) and env.
func ExecRunner(env ...string) Runner {
	return ExecRunnerStdin(nil, env...)
}

// ExecRunnerStdin is ExecRunner with stdin written to each command's standard input (nil:
// none), for commands that read a script there (sfdisk).
func ExecRunnerStdin(stdin []byte, env ...string) Runner {
	return func(ctx context.Context, name string, args ...string) ([]byte, []byte, int, error) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(append(os.Environ(), "LC_ALL=C"), env...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.Exited() {
			return stdout.Bytes(), stderr.Bytes(), ee.ExitCode(), nil
		}
		if err != nil {
			return stdout.Bytes(), stderr.Bytes(), -1, err
		}
		return stdout.Bytes(), stderr.Bytes(), 0, nil
	}
}

// Commands runs a backend's external commands: a failure (exit code ≠ 0 or a
// command that could not run) becomes a *CommandError whose Kind is
// Classify(stderr); stderr of a successful command is logged at V(1) as a
// warning, never treated as an error (LVM thin over-provisioning warnings).
type Commands struct {
	// Run runs the command (required).
	Run Runner
	// Classify maps a failed command's stderr to a typed error, or nil.
	Classify func(stderr string) error
	// OnCommand, when set, is called after every command with its program
	// name, arguments, duration and error.
	OnCommand func(name string, args []string, d time.Duration, err error)
	// Label names the backend in log lines ("lvm", "zfs").
	Label string
}

// Exec runs name with args and returns its stdout.
func (c Commands) Exec(ctx context.Context, name string, args ...string) ([]byte, error) {
	start := time.Now()
	stdout, stderr, code, err := c.Run(ctx, name, args...)
	se := strings.TrimSpace(string(stderr))
	if err != nil || code != 0 {
		var kind error
		if c.Classify != nil {
			kind = c.Classify(se)
		}
		err = &CommandError{Args: append([]string{name}, args...), ExitCode: code, Stderr: se, Kind: kind, Err: err}
	}
	if c.OnCommand != nil {
		c.OnCommand(name, args, time.Since(start), err)
	}
	if err != nil {
		return stdout, err
	}
	if se != "" {
		logr.FromContextOrDiscard(ctx).V(1).Info(c.Label+" command warning", "command", name+" "+strings.Join(args, " "), "stderr", se)
	}
	return stdout, nil
}
