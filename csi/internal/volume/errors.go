package volume

import (
	"context"
	"errors"
	"fmt"
)

// Kinds of error. Each is a sentinel that errors.Is finds in an *Error of that kind; the
// driver answers each with one gRPC code (named here for the reader; the mapping itself is the
// driver's).
var (
	// ErrInvalid: the request is malformed or names what cannot be (INVALID_ARGUMENT).
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound: the volume, snapshot, node or path does not exist (NOT_FOUND).
	ErrNotFound = errors.New("not found")
	// ErrExists: the name is taken by an incompatible volume or snapshot (ALREADY_EXISTS).
	ErrExists = errors.New("already exists")
	// ErrBusy: another operation holds the object's lock (ABORTED, the CO retries).
	ErrBusy = errors.New("operation in progress")
	// ErrConflict: the object changed or is being deleted meanwhile (ABORTED, retry).
	ErrConflict = errors.New("conflict")
	// ErrPrecondition: the object is not in a state that allows the operation
	// (FAILED_PRECONDITION).
	ErrPrecondition = errors.New("failed precondition")
	// ErrInsufficientCapacity: no store has room (RESOURCE_EXHAUSTED).
	ErrInsufficientCapacity = errors.New("insufficient capacity")
	// ErrAttachLimit: the node has as many volumes published as its limit allows
	// (RESOURCE_EXHAUSTED).
	ErrAttachLimit = errors.New("attach limit reached")
	// ErrOutOfRange: no size the store can have lies in the requested range (OUT_OF_RANGE).
	ErrOutOfRange = errors.New("out of range")
	// ErrUnavailable: the API server or an agent cannot answer now (UNAVAILABLE).
	ErrUnavailable = errors.New("unavailable")
	// ErrTimeout: the agent has not finished within the wait (DEADLINE_EXCEEDED).
	ErrTimeout = errors.New("timeout")
	// ErrInternal: anything else that went wrong (INTERNAL).
	ErrInternal = errors.New("internal")
)

// Error is an error of one kind. Its text is the message alone (the kind is not repeated), so
// the text the CO sees is what the code that made it said.
type Error struct {
	// Kind is one of the Err* sentinels above.
	Kind error
	// Err is the cause, which holds the message.
	Err error
}

func (e *Error) Error() string { return e.Err.Error() }

// Unwrap lets errors.Is and errors.As find both the kind and the cause's chain.
func (e *Error) Unwrap() []error { return []error{e.Kind, e.Err} }

// Errorf returns an Error of kind with the message fmt.Errorf makes of format and args (%w
// keeps a cause findable).
func Errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Err: fmt.Errorf(format, args...)}
}

// KindOf returns the kind of the outermost Error in err's chain, or nil when there is none.
func KindOf(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return nil
}

// The causes a wait condition reports from an agent's status.
var (
	// ErrAgentNoRoom marks an agent's InsufficientCapacity report.
	ErrAgentNoRoom = errors.New("insufficient capacity")
	// ErrAgentRefused marks an agent's ExpansionRefused report: the volume cannot take the
	// size at all.
	ErrAgentRefused = errors.New("expansion refused")
	// ErrSnapshotUnsupported marks an agent's SnapshotUnsupported report.
	ErrSnapshotUnsupported = errors.New("the backend takes no snapshots")
	// ErrFreezeLost: a consumer's filesystem freeze of a group snapshot ended (its timeout, a
	// failed FIFREEZE) before every member was taken; the group is not of one instant.
	ErrFreezeLost = errors.New("the group's consumer freeze ended before every member was taken")
)

// WaitError classifies the failure err of a wait for the agent on what ("create volume
// vol-…"): no room → ErrInsufficientCapacity, a size the volume cannot take (a raw partition
// without free space after it) → ErrOutOfRange (CSI spec, ControllerExpandVolume: unsupported
// capacity), over time → ErrTimeout (the CO retries and finds the volume by name), others →
// ErrInternal. The cause stays findable.
func WaitError(what string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, ErrAgentNoRoom):
		return Errorf(ErrInsufficientCapacity, "%s: %w", what, err)
	case errors.Is(err, ErrAgentRefused):
		return Errorf(ErrOutOfRange, "%s: %w", what, err)
	case errors.Is(err, ErrFreezeLost):
		return Errorf(ErrUnavailable, "%s: %w", what, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return Errorf(ErrTimeout, "%s: the agent has not finished: %w", what, err)
	}
	return Errorf(ErrInternal, "%s: %w", what, err)
}
