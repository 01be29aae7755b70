package agent

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Defaults of Options.
const (
	DefaultStateDir    = "/var/lib/plinth"
	DefaultHostNQNFile = "/etc/nvme/hostnqn"
	// DefaultAuthNamespace is the namespace of the shipped manifests (kustomize/default).
	DefaultAuthNamespace   = "plinth-system"
	DefaultRefreshInterval = 30 * time.Second
	DefaultMetricsAddr     = ":8080"
	DefaultProbeAddr       = ":8081"
	// DefaultOrphanGracePeriod is how long a volume no VolumeState names must stay so before
	// a Store under driftPolicy Correct deletes it.
	DefaultOrphanGracePeriod = 10 * time.Minute
	// DefaultVolumeWorkers is how many VolumeStates the agent reconciles at once: a burst
	// of new volumes is not queued behind one another, while each backend still
	// serialises what must be (the file backend its capacity check, LVM its VG lock).
	DefaultVolumeWorkers = 8
	// DefaultKubeAPIQPS and DefaultKubeAPIBurst are the client-side limits of `plinth agent`
	// (--kube-api-qps, --kube-api-burst), in requests per second and requests. A new volume
	// costs the agent one write (its Ready status; the CSI controller sets the finalizer, and
	// Creating is written only for a create slower than ProgressAfter), a deleted one two
	// (Deleting likewise only when slow, then the finalizer's release): a burst of 100 volumes
	// fits a burst allowance of 300 at once instead of spreading over seconds at 50 per second. An idle agent writes its Agent and Stores once per refresh; the
	// API server's priority and fairness, not this limit, protects it from many nodes — and
	// where the API server runs it, `plinth agent` given neither flag uses no client-side
	// limit at all (internal/clientlimit).
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 300
	// DefaultProgressAfter is how long a volume's creation or deletion runs before the agent
	// writes its progress phase (Creating, Deleting): work done sooner costs no status write
	// of its own, a slow one (a clone's copy, a thick LV's wipe) still says it is under way.
	DefaultProgressAfter = time.Second
)

// FinalizerVolume keeps a VolumeState until the agent removed its export and
// its volume.
const FinalizerVolume = storev1.FinalizerVolume

// Options configure the agent. The zero value of every field but NodeName
// takes the default noted.
type Options struct {
	// NodeName is the Node this agent serves (required).
	NodeName string
	// StateDir holds durable state; fencing marks go to <StateDir>/agent/marks
	// (default /var/lib/plinth).
	StateDir string
	// RefreshInterval is the period of the Agent heartbeat and of each Store's
	// observation (one vgs+lvs pair per LVM store), default 30 s.
	RefreshInterval time.Duration
	// MetricsAddr and ProbeAddr are the listen addresses of /metrics and of
	// /healthz, /readyz (defaults :8080, :8081; "0" disables).
	MetricsAddr string
	ProbeAddr   string
	// PprofAddr is the listen address of Go's /debug/pprof endpoints (heap, CPU, goroutines:
	// what a memory or CPU figure is made of); empty or "0" (the default) serves none.
	PprofAddr string
	// Version is reported in Agent status.
	Version string

	// Keys gives the DH-HMAC-CHAP keys of the hosts its volumes with authentication allow,
	// for this node as target (docs/design.md#key-distribution): the controller's key server
	// (hostkeys.Client, what the shipped manifests run). Nil reads the hosts' master Secrets in
	// AuthNamespace itself (hostkeys.Secrets: credentials that may get Secrets there).
	Keys hostkeys.Source
	// AuthNamespace is the namespace of the per-host DH-HMAC-CHAP Secrets the controller
	// makes (internal/dhchap; default $POD_NAMESPACE, then DefaultAuthNamespace), read when
	// Keys is nil.
	AuthNamespace string

	// HostNQNFile is the host NQN file (default /etc/nvme/hostnqn).
	HostNQNFile string
	// NVMetRoot is the nvmet configfs tree (default nvmet.DefaultRoot).
	NVMetRoot string
	// SysRoot, ProcRoot and DevRoot default to /sys, /proc and /dev.
	SysRoot, ProcRoot, DevRoot string
	// Addrs lists the node addresses (default net.InterfaceAddrs).
	Addrs AddrLister
	// LookPath finds tools (default exec.LookPath).
	LookPath func(string) (string, error)
	// NewBackend builds the backend of a Store (default: lvm, zfs (sparse
	// zvols) or file from spec.backend). reserveBytes is the Store's
	// reserve resolved against its physical size; onCommand counts commands.
	NewBackend func(s *storev1.Store, reserveBytes int64, onCommand func(name string, args []string, d time.Duration, err error)) (backend.Backend, error)

	// OrphanGracePeriod is how long a volume that carries Plinth's name but that no
	// VolumeState of this node names must be seen so, on consecutive refreshes of this
	// process, before a Store under driftPolicy Correct deletes it (default
	// DefaultOrphanGracePeriod). Under Report orphans are only reported.
	OrphanGracePeriod time.Duration

	// VolumeWorkers is how many VolumeStates are reconciled at once (default
	// DefaultVolumeWorkers). One volume is never reconciled by two workers at once: the
	// controller's work queue hands a name to one worker at a time, and the volume's
	// fencing lock (agents/fencing Store.Lock) is held for the whole reconcile.
	VolumeWorkers int

	// ProgressAfter is how long the backend's creation (or deletion) of a volume may run before
	// the agent writes the phase Creating (Deleting) to its VolumeState (default
	// DefaultProgressAfter). Work that ends sooner goes straight to Ready (or to the finalizer's
	// release): one status write per new volume instead of two, with the same meaning — the
	// status never claims more than was done. A failed deletion writes Deleting at once.
	ProgressAfter time.Duration

	// AfterVolumeCreate, when set, runs right after the backend created (or
	// adopted) a volume and before anything else; a non-nil error aborts the
	// reconcile there. Tests use it to crash the agent at that point.
	AfterVolumeCreate func(id string) error

	// BeforeFencedStatus, when set, runs after the agent refused work on volume id by fencing
	// and before it writes the Fenced condition. Tests use it to write the VolumeState there,
	// so that the agent's status write conflicts.
	BeforeFencedStatus func(id string)
}

func (o *Options) defaults() error {
	if o.NodeName == "" {
		return errors.New("agent: node name is required")
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = DefaultRefreshInterval
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = DefaultMetricsAddr
	}
	if o.ProbeAddr == "" {
		o.ProbeAddr = DefaultProbeAddr
	}
	if o.OrphanGracePeriod <= 0 {
		o.OrphanGracePeriod = DefaultOrphanGracePeriod
	}
	if o.VolumeWorkers <= 0 {
		o.VolumeWorkers = DefaultVolumeWorkers
	}
	if o.ProgressAfter <= 0 {
		o.ProgressAfter = DefaultProgressAfter
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.HostNQNFile == "" {
		o.HostNQNFile = DefaultHostNQNFile
	}
	if o.AuthNamespace == "" {
		o.AuthNamespace = os.Getenv("POD_NAMESPACE")
	}
	if o.AuthNamespace == "" {
		o.AuthNamespace = DefaultAuthNamespace
	}
	if o.NVMetRoot == "" {
		o.NVMetRoot = nvmet.DefaultRoot
	}
	if o.SysRoot == "" {
		o.SysRoot = "/sys"
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.DevRoot == "" {
		o.DevRoot = "/dev"
	}
	if o.Addrs == nil {
		o.Addrs = net.InterfaceAddrs
	}
	if o.LookPath == nil {
		o.LookPath = exec.LookPath
	}
	if o.NewBackend == nil {
		sysRoot := o.SysRoot
		o.NewBackend = func(s *storev1.Store, reserveBytes int64, onCommand func(string, []string, time.Duration, error)) (backend.Backend, error) {
			return newBackend(s, reserveBytes, sysRoot, onCommand)
		}
	}
	return nil
}

// MarksDir is where the fencing marks live.
func (o *Options) MarksDir() string { return filepath.Join(o.StateDir, "agent", "marks") }

// FailpointsDir records which "once" crash points this node already hit
// (internal/failpoint): it lives in StateDir so that a restarted agent, armed
// by the same environment, runs through; per node, since nodes played by one
// machine share its StateDir.
func (o *Options) FailpointsDir() string {
	return filepath.Join(o.StateDir, "agent", "failpoints", o.NodeName)
}
