package csi

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plinth-storage/plinth/csi/internal/volume"
)

// TestRPCError: every kind of the volume layer answers its code with the error's own message;
// the outermost kind counts; statuses pass unchanged; other errors answer UNKNOWN, as gRPC does.
func TestRPCError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{nil, codes.OK, ""},
		{volume.Errorf(volume.ErrInvalid, "volume id is required"), codes.InvalidArgument, "volume id is required"},
		{volume.Errorf(volume.ErrNotFound, "volume %s does not exist", "vol-a"), codes.NotFound, "volume vol-a does not exist"},
		{volume.Errorf(volume.ErrExists, "taken"), codes.AlreadyExists, "taken"},
		{volume.Errorf(volume.ErrBusy, "busy"), codes.Aborted, "busy"},
		{volume.Errorf(volume.ErrConflict, "moved"), codes.Aborted, "moved"},
		{volume.Errorf(volume.ErrPrecondition, "not staged"), codes.FailedPrecondition, "not staged"},
		{volume.Errorf(volume.ErrInsufficientCapacity, "full"), codes.ResourceExhausted, "full"},
		{volume.Errorf(volume.ErrOutOfRange, "too big"), codes.OutOfRange, "too big"},
		{volume.Errorf(volume.ErrAttachLimit, "node n has 3 volumes published"), codes.ResourceExhausted, "node n has 3 volumes published"},
		{volume.Errorf(volume.ErrUnavailable, "no API"), codes.Unavailable, "no API"},
		{volume.Errorf(volume.ErrTimeout, "slow"), codes.DeadlineExceeded, "slow"},
		{volume.Errorf(volume.ErrInternal, "broken"), codes.Internal, "broken"},
		// the outermost kind wins; wrapping with fmt keeps it
		{volume.Errorf(volume.ErrConflict, "reread: %w", volume.Errorf(volume.ErrUnavailable, "no API")), codes.Aborted, "reread: no API"},
		{fmt.Errorf("delete volume vol-a: %w", volume.Errorf(volume.ErrUnavailable, "no API")), codes.Unavailable, "delete volume vol-a: no API"},
		{volume.WaitError("create volume vol-a", volume.ErrAgentNoRoom), codes.ResourceExhausted, "create volume vol-a: insufficient capacity"},
		{status.Error(codes.PermissionDenied, "from a peer"), codes.PermissionDenied, "from a peer"},
		{errors.New("plain"), codes.Unknown, "plain"},
	} {
		got := rpcError(tc.err)
		st, _ := status.FromError(got)
		if st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("rpcError(%v) = %v %q, want %v %q", tc.err, st.Code(), st.Message(), tc.code, tc.msg)
		}
	}
	// every kind has its code
	for _, kc := range kindCodes {
		if kc.code == codes.Unknown || kc.code == codes.OK {
			t.Errorf("kind %v has code %v", kc.kind, kc.code)
		}
	}
}
