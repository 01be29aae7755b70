package backend

import (
	"errors"
	"fmt"
	"strings"
)

// Typed errors every backend returns (wrapped with context; test with
// errors.Is). The agent maps them to VolumeState reasons, e.g.
// ErrInsufficientCapacity → reason InsufficientCapacity → CSI RESOURCE_EXHAUSTED.
var (
	// ErrNotFound: the volume (or VG, pool, file) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the id or name exists with incompatible properties
	// (smaller than requested, or not created by Plinth).
	ErrAlreadyExists = errors.New("already exists")
	// ErrInsufficientCapacity: not enough room once the reserve is honoured.
	ErrInsufficientCapacity = errors.New("insufficient capacity")
	// ErrDeviceNotEmpty: a declared device carries a signature (filesystem,
	// partition table, LVM label, ...) and is refused.
	ErrDeviceNotEmpty = errors.New("device not empty")
	// ErrInvalidArgument: a malformed id, name or size.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrInUse: the kernel refuses because the device is open.
	ErrInUse = errors.New("in use")
	// ErrOutOfRange: the volume cannot take this size whatever the free space (a raw
	// partition with no free space right after it, a whole-disk volume asked to outgrow its
	// disk). The agent reports it as reason ExpansionRefused; the CSI controller answers
	// OUT_OF_RANGE.
	ErrOutOfRange = errors.New("out of range")
	// ErrMissingKernelModule: the Store's declaration needs a kernel module the node does not
	// have (bcache for an LVM cache). No retry helps until the node or the policy changes: the
	// agent reports the Store Stalled with reason MissingKernelModules, never a plain volume.
	ErrMissingKernelModule = errors.New("missing kernel module")
)

// CommandError is a failed external command (lvcreate, losetup, ...). Its
// message names the command and carries its stderr, so the cause reaches
// conditions and logs. Unwrap yields Kind (one of the errors above, or nil)
// and then the underlying exec error.
type CommandError struct {
	// Args is the command line, Args[0] the program.
	Args []string
	// ExitCode is the exit status, -1 when the command did not run to its end.
	ExitCode int
	// Stderr is the command's standard error, trimmed.
	Stderr string
	// Kind classifies the failure when known (e.g. ErrNotFound), else nil.
	Kind error
	// Err is the error from os/exec.
	Err error
}

func (e *CommandError) Error() string {
	msg := fmt.Sprintf("%s: exit %d", strings.Join(e.Args, " "), e.ExitCode)
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	} else if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns Kind and Err for errors.Is / errors.As.
func (e *CommandError) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}
