package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/controller"
	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/node"
	"github.com/plinth-storage/plinth/csi/nvme"
	"github.com/plinth-storage/plinth/csi/stage"
	"github.com/plinth-storage/plinth/internal/failpoint"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Modes of Run.
const (
	ModeController = "controller"
	ModeNode       = "node"
	ModeAll        = "all"
)

// Options configure a Driver.
type Options struct {
	// Mode is ModeController, ModeNode or ModeAll.
	Mode string
	// Endpoint is the gRPC listen address: unix:///path/csi.sock (or a bare path).
	Endpoint string
	// NodeName is this node's Node name (node id and topology value); node and all modes.
	NodeName string
	// Config reaches the API server. Required in controller and all modes; in node mode it is
	// used to label and annotate the Node at start and may be nil in tests.
	Config *rest.Config
	// StateDir holds node stage records (default /var/lib/plinth/node).
	StateDir string
	// HostNQNFile is the node's host NQN file (default /etc/nvme/hostnqn).
	HostNQNFile string
	// Keys gives the node plugin this node's DH-HMAC-CHAP keys toward a storage node
	// (docs/design.md#key-distribution): the controller's key server (hostkeys.Client, what the
	// shipped manifests run). Nil reads this node's master Secret in AuthNamespace itself
	// (hostkeys.Secrets: credentials that may get Secrets there).
	Keys hostkeys.Source
	// AuthNamespace holds the DH-HMAC-CHAP host Secrets (default DefaultAuthNamespace), read
	// when Keys is nil.
	AuthNamespace string
	// WaitTimeout bounds each wait for the agent (create, delete, expand, publish) when the
	// caller's context has no earlier deadline (default 5 minutes).
	WaitTimeout time.Duration
	// RegistrationDir is kubelet's plugin registration folder, where the node and all modes
	// serve kubelet's plugin registration API on RegistrationSocketName (registration.go).
	// Empty disables registration (a node plugin driven by something other than kubelet).
	RegistrationDir string
	// KubeletRegistrationPath is the CSI socket path as kubelet sees it, announced by the
	// registration (default DefaultKubeletRegistrationPath).
	KubeletRegistrationPath string
	// ProbeTimeout bounds each call of the liveness check Healthz makes: the CSI Probe and the
	// registration GetInfo (default 1 second, livenessprobe's default).
	ProbeTimeout time.Duration
	// Version is the vendor version GetPluginInfo reports.
	Version string
	// Registerer receives the metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// Log receives the gRPC log lines.
	Log logr.Logger
	// MaxVolumesPerNode is the most volumes that may be published to this node at once
	// (NodeGetInfo max_volumes_per_node, the Node's plinth.dev/max-volumes-per-node that
	// ControllerPublishVolume enforces); 0 means no limit. Node and all modes.
	MaxVolumesPerNode int64
	// VolumeHealthInterval is the period of the node plugin's check of its staged volumes
	// (volumehealth.go; default DefaultVolumeHealthInterval, negative disables).
	VolumeHealthInterval time.Duration
	// KeyRotationInterval is the period of the controller's key rotation round
	// (controller.RotateVolumeKeys; default controller.KeyRotationInterval, negative disables).
	KeyRotationInterval time.Duration
	// LimitsInterval is the period of the node plugin's round over the I/O limits of its
	// staged volumes (node.Limits; default DefaultLimitsInterval, negative disables the limits).
	LimitsInterval time.Duration
	// CgroupRoot is the cgroup mount the limits are written under (default /sys/fs/cgroup).
	CgroupRoot string
	// Initiator and Mounter override the node's kernel access (tests); nil means the real ones.
	Initiator *nvme.Initiator
	Mounter   *mount.Mounter
}

// Driver is the CSI driver; build it with New and serve it with Run.
type Driver struct {
	opts Options
	log  logr.Logger

	scheme *runtime.Scheme
	kube   client.Client   // cache-backed reads in controller modes, direct otherwise
	live   client.Reader   // direct reads where freshness matters
	keys   hostkeys.Source // this node's DH-HMAC-CHAP keys (Options.Keys)
	// volumes and snapshots are the volume layer's access to VolumeStates and
	// VolumeSnapshotStates (controller modes; nil in node mode), sharing locks
	volumes   *volume.Kind[*storev1.VolumeState]
	snapshots *volume.Kind[*storev1.VolumeSnapshotState]

	stages    stage.Dir
	mounter   *mount.Mounter
	initiator *nvme.Initiator

	locks      *volume.Locks // per volume or snapshot id
	node       *node.Service // node modes, built by Run
	ready      atomic.Bool
	serving    chan struct{}
	regPath    string // the registration socket while registration is on
	duration   *prometheus.HistogramVec
	registered prometheus.Gauge
	events     events.EventRecorder // events.go; nil without an API config
	metrics    node.Metrics         // the node service's volume health series
}

// Scheme returns the scheme the driver reads and writes with: core, apps (StatefulSets),
// storage.plinth.dev and policy.plinth.dev types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = appsv1.AddToScheme(s) // StatefulSets: the workload of a spread volume's claim
	_ = storev1.AddToScheme(s)
	_ = policyv1.AddToScheme(s)
	return s
}

// New checks opts and returns a Driver.
func New(opts Options) (*Driver, error) {
	switch opts.Mode {
	case ModeController, ModeNode, ModeAll:
	default:
		return nil, fmt.Errorf("mode %q: want controller, node or all", opts.Mode)
	}
	if opts.Endpoint == "" {
		return nil, errors.New("endpoint is required")
	}
	if opts.Mode != ModeNode && opts.Config == nil {
		return nil, errors.New("the controller needs an API server config")
	}
	if opts.Mode != ModeController && opts.NodeName == "" {
		return nil, errors.New("the node service needs the node name")
	}
	if opts.StateDir == "" {
		opts.StateDir = "/var/lib/plinth/node"
	}
	if opts.HostNQNFile == "" {
		opts.HostNQNFile = "/etc/nvme/hostnqn"
	}
	if opts.WaitTimeout == 0 {
		opts.WaitTimeout = 5 * time.Minute
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.KubeletRegistrationPath == "" {
		opts.KubeletRegistrationPath = DefaultKubeletRegistrationPath
	}
	if opts.ProbeTimeout == 0 {
		opts.ProbeTimeout = time.Second
	}
	if opts.LimitsInterval == 0 {
		opts.LimitsInterval = DefaultLimitsInterval
	}
	if opts.CgroupRoot == "" {
		opts.CgroupRoot = "/sys/fs/cgroup"
	}
	if opts.VolumeHealthInterval == 0 {
		opts.VolumeHealthInterval = DefaultVolumeHealthInterval
	}
	if opts.KeyRotationInterval == 0 {
		opts.KeyRotationInterval = controller.KeyRotationInterval
	}
	d := &Driver{
		keys:      opts.Keys,
		opts:      opts,
		log:       opts.Log,
		scheme:    Scheme(),
		stages:    stage.Dir{Path: opts.StateDir},
		mounter:   opts.Mounter,
		initiator: opts.Initiator,
		locks:     &volume.Locks{},
		serving:   make(chan struct{}),
		metrics:   node.NewMetrics(),
	}
	if d.nodeMode() && opts.RegistrationDir != "" {
		d.regPath = filepath.Join(opts.RegistrationDir, RegistrationSocketName)
	}
	if d.mounter == nil {
		d.mounter = mount.New()
	}
	if d.initiator == nil {
		d.initiator = &nvme.Initiator{}
	}
	d.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "plinth_csi_operation_duration_seconds",
		Help:    "Duration of CSI gRPC calls in seconds, by method and gRPC status code.",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"method", "code"})
	// The successful series of the calls that change a volume exist from the start at 0, so
	// that rate() sees the first call as an increase (a series born at 1 shows no rate until
	// a second call: a single publish would never reach the latency panels).
	var methods []string
	if d.controllerMode() {
		methods = append(methods, "CreateVolume", "DeleteVolume", "ControllerPublishVolume", "ControllerUnpublishVolume", "ControllerExpandVolume")
	}
	if d.nodeMode() {
		methods = append(methods, "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeExpandVolume")
	}
	for _, m := range methods {
		d.duration.WithLabelValues(m, codes.OK.String())
	}
	d.registered = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "plinth_csi_kubelet_registered",
		Help: "1 when kubelet's last registration status for the node plugin said registered, 0 before that or when it said failed.",
	})
	if opts.Registerer != nil {
		cs := []prometheus.Collector{d.duration}
		if d.regPath != "" {
			cs = append(cs, d.registered)
		}
		if d.nodeMode() {
			cs = append(cs, d.metrics.Inaccessible, d.metrics.Failures)
		}
		for _, c := range cs {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("register metrics: %w", err)
			}
		}
	}
	return d, nil
}

func (d *Driver) controllerMode() bool { return d.opts.Mode != ModeNode }
func (d *Driver) nodeMode() bool       { return d.opts.Mode != ModeController }

// Run connects to the API server (informers on VolumeStates, Stores, policy objects and
// Nodes in controller modes; labels the Node in node modes), serves gRPC on the endpoint and,
// in node modes with a RegistrationDir, kubelet's plugin registration API until ctx ends, then
// removes the registration socket (kubelet deregisters the driver) and stops gracefully.
// Probe reports ready once the informers have synced; Serving is closed once both sockets
// listen. Run is called once per Driver (a restart is a new Driver).
func (d *Driver) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Crash points named in $PLINTH_FAILPOINTS (empty in production) are armed first, "once"
	// points recorded in the state folder so that the restarted plugin runs through.
	armed, err := failpoint.Configure(os.Getenv(failpoint.Env), filepath.Join(d.opts.StateDir, "failpoints"))
	if err != nil {
		return fmt.Errorf("csi: %w", err)
	}
	if len(armed) > 0 {
		d.log.Info("crash points armed: this process exits on purpose at them", "failpoints", armed, "exitCode", failpoint.ExitCode)
	}
	if err := d.connect(ctx); err != nil {
		return err
	}
	if err := d.startEvents(ctx); err != nil {
		return err
	}
	if d.nodeMode() {
		d.node = node.New(node.Config{NodeName: d.opts.NodeName, HostNQNFile: d.opts.HostNQNFile, MaxVolumes: d.opts.MaxVolumesPerNode, Stages: d.stages,
			Mounter: d.mounter, Initiator: d.initiator, Kube: d.kube, Live: d.live, Keys: d.keys, Events: d.events,
			Metrics: d.metrics, Locks: d.locks, Log: d.log})
		if err := d.node.Init(ctx); err != nil {
			return err
		}
		if err := d.followFreezes(ctx); err != nil {
			return err
		}
		if d.opts.LimitsInterval > 0 && d.opts.Config != nil {
			if err := d.startLimits(ctx); err != nil {
				return err
			}
		}
		if d.opts.VolumeHealthInterval > 0 {
			// the volume health monitor, and the key rotation follower on the same period: both
			// only read sysfs while nothing needs the API
			go every(ctx, d.opts.VolumeHealthInterval, d.node.CheckVolumes)
			go every(ctx, d.opts.VolumeHealthInterval, d.node.RotateKeys)
		}
	}
	lis, err := listen(d.opts.Endpoint)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.intercept))
	csipb.RegisterIdentityServer(srv, &identity{d: d})
	if d.controllerMode() {
		cs := controller.New(controller.Config{Kube: d.kube, Live: d.live,
			Volumes: d.volumes, Snapshots: d.snapshots, Events: d.events, Log: d.log})
		csipb.RegisterControllerServer(srv, cs)
		csipb.RegisterGroupControllerServer(srv, controller.NewGroup(cs))
		// key rotation by a Git change (Placement encryption.keyGeneration): new keys into
		// the volumes' key Secrets, the previous key dropped once a node re-wrapped the header
		if d.opts.KeyRotationInterval > 0 {
			go every(ctx, d.opts.KeyRotationInterval, cs.RotateVolumeKeys)
		}
	}
	if d.nodeMode() {
		csipb.RegisterNodeServer(srv, d.node)
	}
	d.ready.Store(true)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	d.log.Info("serving CSI", "driver", policyv1.DriverName, "mode", d.opts.Mode, "endpoint", d.opts.Endpoint, "node", d.opts.NodeName)
	// Kubelet calls NodeGetInfo as soon as it sees the registration socket, so that socket
	// appears only once the CSI socket serves.
	var reg *registrationServer
	if d.regPath != "" {
		if reg, err = d.serveRegistration(); err != nil {
			srv.Stop()
			<-errc
			return err
		}
	}
	close(d.serving)
	select {
	case <-ctx.Done():
		var regErr error
		if reg != nil {
			regErr = reg.stop()
		}
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			srv.Stop()
		}
		return regErr
	case err := <-errc:
		if reg != nil {
			err = errors.Join(err, reg.stop())
		}
		return err
	case err := <-reg.failed():
		// Without it kubelet cannot register the driver again after its own restart: exit,
		// and let the restarted container serve anew.
		srv.Stop()
		os.Remove(reg.path)
		return fmt.Errorf("registration server stopped: %w", err)
	}
}

// Serving returns a channel closed once Run listens on the CSI socket and, with
// registration, on the registration socket.
func (d *Driver) Serving() <-chan struct{} { return d.serving }

// listen opens a unix socket (removing a stale socket file) or a TCP address.
func listen(endpoint string) (net.Listener, error) {
	network, addr := endpointAddress(endpoint)
	if network == "unix" {
		if err := os.MkdirAll(filepath.Dir(addr), 0o755); err != nil {
			return nil, err
		}
		if err := os.Remove(addr); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	lis, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", endpoint, err)
	}
	return lis, nil
}

// intercept logs each call (method at V(2), stripped payloads at V(5)) and records its
// duration and code. It is the RPC edge: the services' errors get their gRPC codes here
// (rpcError), nowhere else.
func (d *Driver) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	log := d.log.WithValues("method", method)
	start := time.Now()
	if v := log.V(5); v.Enabled() {
		v.Info("request", "payload", stripSecrets(req))
	}
	resp, err := handler(logr.NewContext(ctx, log), req)
	err = rpcError(err)
	code := status.Code(err)
	d.duration.WithLabelValues(method, code.String()).Observe(time.Since(start).Seconds())
	if err != nil {
		log.V(2).Info("call failed", "code", code.String(), "error", status.Convert(err).Message(), "duration", time.Since(start))
	} else {
		log.V(2).Info("call done", "duration", time.Since(start))
		if v := log.V(5); v.Enabled() {
			v.Info("response", "payload", stripSecrets(resp))
		}
	}
	return resp, err
}

const strippedSecret = "***stripped***"

// stripSecrets returns the text form of a CSI message whose fields marked csi_secret (CSI spec
// "Secrets Requirements") have their values replaced and whose unknown fields are left out.
func stripSecrets(m any) string {
	pm, ok := m.(proto.Message)
	if !ok || pm == nil {
		return fmt.Sprint(m)
	}
	c := proto.Clone(pm)
	strip(c.ProtoReflect())
	return fmt.Sprint(c)
}

func strip(m protoreflect.Message) {
	// Fields this build of the CSI spec does not know print as raw bytes; one may be a secret
	// field of a newer spec version a CO sends, so none is logged.
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if secret, _ := proto.GetExtension(fd.Options(), csipb.E_CsiSecret).(bool); secret {
			if fd.IsMap() {
				mp := m.Mutable(fd).Map()
				mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
					mp.Set(k, protoreflect.ValueOfString(strippedSecret))
					return true
				})
			} else {
				m.Clear(fd)
			}
			return true
		}
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				strip(l.Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				strip(mv.Message())
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			strip(v.Message())
		}
		return true
	})
}

// every calls fn every interval, the first time one interval from now, until ctx ends (the
// node plugin's volume health monitor and its key rotation follower).
func every(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}
