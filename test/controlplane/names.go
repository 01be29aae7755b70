package controlplane

import icp "github.com/plinth-storage/plinth/internal/controlplane"

// The harness itself is internal/controlplane (product code: `plinth dev`
// runs it). Tests import this package for the testing helpers of testing.go;
// the names below let them keep writing controlplane.Options and friends.

type (
	// Options configure Start; see internal/controlplane.Options.
	Options = icp.Options
	// ControlPlane is a running control plane; see internal/controlplane.ControlPlane.
	ControlPlane = icp.ControlPlane
	// User is a client identity AddUser issues credentials for.
	User = icp.User
	// Credentials are a user's client certificate, rest.Config and kubeconfig.
	Credentials = icp.Credentials
	// ProcessSpec describes a process the control plane starts beside its own.
	ProcessSpec = icp.ProcessSpec
	// Process is a started process (PID, log, tail).
	Process = icp.Process
	// ProcessError is a process that failed to start or died, with its log's tail.
	ProcessError = icp.ProcessError
	// MissingBinaryError says a test binary is not built (`make testbin`).
	MissingBinaryError = icp.MissingBinaryError
)

// Names of the test binaries and environment variables; see internal/controlplane.
const (
	BinEtcd                  = icp.BinEtcd
	BinKubeAPIServer         = icp.BinKubeAPIServer
	BinKubeControllerManager = icp.BinKubeControllerManager
	BinKubectl               = icp.BinKubectl
	BinKubelet               = icp.BinKubelet
	BinKubeProxy             = icp.BinKubeProxy
	BinPlinthScheduler       = icp.BinPlinthScheduler
	BinCSIProvisioner        = icp.BinCSIProvisioner
	BinCSIAttacher           = icp.BinCSIAttacher
	BinCSIResizer            = icp.BinCSIResizer
	BinCSISanity             = icp.BinCSISanity
	BinCSISnapshotter        = icp.BinCSISnapshotter
	BinSnapshotController    = icp.BinSnapshotController

	EnvTestBin     = icp.EnvTestBin
	EnvIntegration = icp.EnvIntegration
	GuestHostIP    = icp.GuestHostIP
)

// Functions of the harness; see internal/controlplane.
var (
	Start           = icp.Start
	ModuleRoot      = icp.ModuleRoot
	TestBinDir      = icp.TestBinDir
	BinaryPath      = icp.BinaryPath
	PinnedVersions  = icp.PinnedVersions
	IsMissingBinary = icp.IsMissingBinary
	FreePort        = icp.FreePort
	HTTPReady       = icp.HTTPReady
	SocketReady     = icp.SocketReady
)
