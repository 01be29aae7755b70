package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/plinth-storage/plinth/controllers/moveexec"
	"github.com/plinth-storage/plinth/csi"
)

func init() { subcommands = append(subcommands, newCSICommand) }

func newCSICommand() *cobra.Command {
	var (
		opts        csi.Options
		kubeconfig  string
		metricsAddr string
		healthAddr  string
		pprofAddr   string
		verbosity   int
		qps         float32
		burst       int
		keys        keyServerFlags
		moves       moveExecutorFlags
	)
	cmd := &cobra.Command{
		Use:   "csi --mode controller|node|all --endpoint unix:///csi/csi.sock",
		Short: "Run the CSI driver csi.plinth.dev (controller service, node service, or both)",
		Long: `csi serves the CSI driver csi.plinth.dev on a unix socket for the CSI sidecars and kubelet.

The controller service talks only to the API server: CreateVolume picks a Store of the
StorageClass's pool, creates a VolumeState with the policy frozen in it and waits (watching)
until the node agent reports it Ready. The node service attaches (local device or NVMe-oF/TCP
connect), formats blank devices only, mounts, and keeps stage records in --state-dir.

Sidecars: csi-provisioner --feature-gates=Topology=true --enable-capacity --extra-create-metadata;
csi-attacher; csi-resizer; csi-snapshotter --extra-create-metadata. CSIDriver: attachRequired: true, storageCapacity: true,
fsGroupPolicy: File.

The node and all modes register the driver with kubelet themselves (no node-driver-registrar):
they serve kubelet's plugin registration API on <registration-dir>/csi.plinth.dev-reg.sock,
announcing --kubelet-registration-path as the CSI socket. Liveness (no livenessprobe sidecar):
/healthz on --health-address calls the driver's own CSI Probe through its socket and, in node
modes, GetInfo on the registration socket; 200 "ok" or 500 with the reason.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.NodeName == "" {
				opts.NodeName = os.Getenv("NODE_NAME")
			}
			if opts.Mode != csi.ModeNode || kubeconfig != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
				cfg, err := kubeRestConfig(kubeconfig, qps, burst)
				if err != nil {
					return &exitError{code: exitUsage, err: err}
				}
				opts.Config = cfg
			}
			opts.Log = funcr.New(func(prefix, args string) {
				fmt.Fprintln(cmd.ErrOrStderr(), time.Now().UTC().Format(time.RFC3339Nano), prefix, args)
			}, funcr.Options{Verbosity: verbosity})
			// Only the controller service follows the API server's flow control: the node
			// service runs on every node and keeps its limits.
			if opts.Mode == csi.ModeController && opts.Config != nil {
				mode, err := clientLimits(cmd.Context(), cmd, opts.Config, qps, burst)
				opts.Log.Info("client-side rate limit", "mode", mode, "qps", opts.Config.QPS, "burst", opts.Config.Burst, "probeError", errString(err))
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			opts.Registerer = reg
			ks, err := keys.source(opts.Config)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			if ks != nil {
				opts.Keys = ks
			}
			d, err := csi.New(opts)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			mgr, err := moves.manager(opts, reg)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			mgrDone := make(chan error, 1)
			if mgr != nil {
				go func() {
					err := mgr.Start(ctx)
					if err != nil {
						stop() // the driver stops with it: a controller without its executor is not half-run
					}
					mgrDone <- err
				}()
			} else {
				close(mgrDone)
			}
			routes := map[string]map[string]http.Handler{}
			if metricsAddr != "" {
				routes[metricsAddr] = map[string]http.Handler{"/metrics": promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
			}
			if healthAddr != "" {
				if routes[healthAddr] == nil {
					routes[healthAddr] = map[string]http.Handler{}
				}
				routes[healthAddr]["/healthz"] = d.Healthz()
			}
			if pprofAddr != "" {
				if routes[pprofAddr] == nil {
					routes[pprofAddr] = map[string]http.Handler{}
				}
				routes[pprofAddr]["/debug/pprof/"] = http.HandlerFunc(pprof.Index)
				routes[pprofAddr]["/debug/pprof/profile"] = http.HandlerFunc(pprof.Profile)
			}
			for addr, handlers := range routes {
				if err := serveHTTP(ctx, addr, handlers); err != nil {
					return &exitError{code: exitUsage, err: err}
				}
			}
			err = d.Run(ctx)
			stop()
			if merr := <-mgrDone; merr != nil {
				return fmt.Errorf("move executor: %w", merr)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Mode, "mode", csi.ModeAll, "services to serve: controller, node or all")
	f.StringVar(&opts.Endpoint, "endpoint", "unix:///csi/csi.sock", "gRPC endpoint: unix:///path or a bare socket path")
	f.StringVar(&opts.NodeName, "node-name", "", "this node's Node name (default $NODE_NAME); node and all modes")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config")
	f.StringVar(&opts.StateDir, "state-dir", "/var/lib/plinth/node", "folder of the node's stage records")
	f.Int64Var(&opts.MaxVolumesPerNode, "max-volumes-per-node", 0, "most volumes published to this node at once (NodeGetInfo, enforced by ControllerPublishVolume); 0 means no limit")
	f.StringVar(&opts.HostNQNFile, "host-nqn-file", "/etc/nvme/hostnqn", "the node's NVMe host NQN")
	f.StringVar(&opts.AuthNamespace, "auth-namespace", csi.DefaultAuthNamespace, "namespace of the DH-HMAC-CHAP host Secrets nvme-auth-<node> (the controller's); without --key-server the node plugin reads its own node's")
	keys.bind(f)
	moves.bind(f)
	f.DurationVar(&opts.WaitTimeout, "wait-timeout", 5*time.Minute, "bound of each wait for the agent when the caller sets no earlier deadline")
	f.StringVar(&metricsAddr, "metrics-address", "", "serve Prometheus metrics on this address (e.g. :8080); empty disables")
	f.StringVar(&pprofAddr, "pprof-address", "", "serve Go's /debug/pprof profiles (heap, CPU) on this address (may equal --metrics-address); empty disables")
	f.StringVar(&healthAddr, "health-address", ":9474", "serve the liveness check /healthz on this address (may equal --metrics-address); empty disables")
	f.DurationVar(&opts.KeyRotationInterval, "key-rotation-interval", csi.DefaultKeyRotationInterval, "period of the controller's key rotation round (Placement encryption.keyGeneration: new keys into the volumes' key Secrets); negative disables")
	f.DurationVar(&opts.VolumeHealthInterval, "volume-health-interval", csi.DefaultVolumeHealthInterval, "period of the node plugin's check of its staged volumes (device gone, mount dead: event + metric); negative disables")
	f.DurationVar(&opts.LimitsInterval, "limits-interval", csi.DefaultLimitsInterval, "period of the node plugin's round over the I/O limits of VolumeAttributesClass tiers (also re-applied on every VolumeState change); negative disables")
	f.StringVar(&opts.CgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup mount the node plugin writes I/O limits under (v2 when it is the unified hierarchy, else v1 blkio)")
	f.DurationVar(&opts.ProbeTimeout, "probe-timeout", time.Second, "bound of each call /healthz makes (CSI Probe, registration GetInfo)")
	f.StringVar(&opts.RegistrationDir, "registration-dir", csi.DefaultRegistrationDir, "kubelet's plugin registration folder, where node and all modes register the driver; empty disables")
	f.StringVar(&opts.KubeletRegistrationPath, "kubelet-registration-path", csi.DefaultKubeletRegistrationPath, "the CSI socket path as kubelet on the host sees it (announced by the registration)")
	f.IntVarP(&verbosity, "v", "v", 0, "log verbosity: 2 logs each call, 5 each payload (secrets stripped)")
	f.Float32Var(&qps, "kube-api-qps", 50, "requests per second to the API server (client-side limit; client-go's own default of 5 queues CreateVolume's writes behind each other). Controller mode: "+clientLimitHelp)
	f.IntVar(&burst, "kube-api-burst", 100, "burst of requests to the API server above --kube-api-qps. Controller mode: "+clientLimitHelp)
	return cmd
}

// moveExecutorFlags wire the move executor (controllers/moveexec) into the controller
// service's process: the CSI controller already writes VolumeStates, which is what the
// executor writes (spec.move, the switch of spec.storeName).
type moveExecutorFlags struct {
	enabled                 bool
	leaderElectionNamespace string
	lease                   leaseFlags
	// skipNameValidation: tests make several executors in one process
	skipNameValidation bool
}

func (m *moveExecutorFlags) bind(f *pflag.FlagSet) {
	f.BoolVar(&m.enabled, "move-executor", true, "controller and all modes: run the volume move executor (start the moves plinth diff plans, up to each pool's maxParallelMovesPerStore; switch and end them; report the pool's Evacuating condition)")
	f.StringVar(&m.leaderElectionNamespace, "leader-election-namespace", os.Getenv("NAMESPACE"), "namespace of the move executor's leader election Lease (default $NAMESPACE); empty runs it without leader election (one replica only)")
	m.lease.bind(f)
}

// manager returns the move executor's manager, or nil when this process runs none (node
// mode, --move-executor=false, no API server).
func (m *moveExecutorFlags) manager(opts csi.Options, reg prometheus.Registerer) (ctrl.Manager, error) {
	if !m.enabled || opts.Mode == csi.ModeNode || opts.Config == nil {
		return nil, nil
	}
	leaseDuration, renewDeadline, retryPeriod, err := m.lease.timings()
	if err != nil {
		return nil, err
	}
	return moveexec.NewManager(moveexec.ManagerOptions{
		Config: opts.Config, LeaderElection: m.leaderElectionNamespace != "", LeaderElectionNamespace: m.leaderElectionNamespace,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		Registerer: reg, Log: opts.Log.WithName("move-executor"), SkipNameValidation: m.skipNameValidation,
	})
}

// serveHTTP serves handlers (path → handler) on addr until ctx ends.
func serveHTTP(ctx context.Context, addr string, handlers map[string]http.Handler) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("http listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	for path, h := range handlers {
		mux.Handle(path, h)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "plinth csi: http server on", addr+":", err)
		}
	}()
	return nil
}
