package csi

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plinth-storage/plinth/csi/internal/volume"
)

// kindCodes maps each kind of the volume layer's errors to its gRPC code (CSI spec, "Error
// Scheme" of each RPC).
var kindCodes = []struct {
	kind error
	code codes.Code
}{
	{volume.ErrInvalid, codes.InvalidArgument},
	{volume.ErrNotFound, codes.NotFound},
	{volume.ErrExists, codes.AlreadyExists},
	{volume.ErrBusy, codes.Aborted},
	{volume.ErrConflict, codes.Aborted},
	{volume.ErrPrecondition, codes.FailedPrecondition},
	{volume.ErrInsufficientCapacity, codes.ResourceExhausted},
	{volume.ErrAttachLimit, codes.ResourceExhausted},
	{volume.ErrOutOfRange, codes.OutOfRange},
	{volume.ErrUnavailable, codes.Unavailable},
	{volume.ErrTimeout, codes.DeadlineExceeded},
	{volume.ErrInternal, codes.Internal},
}

// rpcError is the one place where the services' errors become gRPC statuses: an error of the
// volume layer answers its kind's code (kindCodes; the outermost kind in the chain counts)
// with its message; a status passes as it is; nil stays nil; any other error answers UNKNOWN.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	if k := volume.KindOf(err); k != nil {
		for _, kc := range kindCodes {
			if k == kc.kind {
				return status.Error(kc.code, err.Error())
			}
		}
	}
	// a status (from a gRPC client the service called) as it is; anything else UNKNOWN, as
	// gRPC itself answers an error without a status
	return status.Convert(err).Err()
}
