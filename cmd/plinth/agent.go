package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/internal/clientlimit"
)

func init() { subcommands = append(subcommands, newAgentCommand) }

func newAgentCommand() *cobra.Command {
	var (
		opts       agent.Options
		kubeconfig string
		verbosity  int
		qps        float32
		burst      int
		keys       keyServerFlags
	)
	cmd := &cobra.Command{
		Use:   "agent --node NAME",
		Short: "Run the node agent: converge LVM/file volumes and the nvmet target toward this node's Agent, Stores and VolumeStates",
		Long: `agent runs on every storage node (a DaemonSet). It watches only the objects of its node —
the Agent named NAME, and the Stores and VolumeStates labelled plinth.dev/node=NAME — and:

  - publishes in Agent status the host NQN (/etc/nvme/hostnqn), the address inside
    spec.nvmeof.bindCIDR, the kernel modules and backends present, its version and a heartbeat;
  - ensures each Store's backend (a VG and thin pool only on declared, empty devices), publishes
    capacity and compares the kernel with the declaration (drift), every --refresh-interval, with
    one vgs+lvs pair per LVM store;
  - creates, expands, exports over NVMe-oF/TCP and deletes the volume of each VolumeState, fenced
    by durable marks under --state-dir/agent/marks.

The API server is found from --kubeconfig, $KUBECONFIG, or the in-cluster config.
Metrics (plinth_store_capacity_bytes, plinth_agent_* ...) are served at --metrics-bind-address
/metrics, probes at --health-probe-bind-address /healthz and /readyz.

Fault tests only: $PLINTH_FAILPOINTS (e.g. agent.volume.created=once) makes the process exit
with code 86 at the named crash points (internal/failpoint; "once": the first hit on this node,
recorded under --state-dir/agent/failpoints/NODE). Unset in production.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.NodeName == "" {
				return &exitError{code: exitUsage, err: fmt.Errorf("--node is required (the Node name, e.g. from the downward API spec.nodeName)")}
			}
			ctrl.SetLogger(textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(verbosity))))
			cfg, err := kubeRestConfig(kubeconfig, qps, burst)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			opts.Version = version
			ks, err := keys.source(cfg)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			if ks != nil {
				opts.Keys = ks
			}
			ctx := ctrl.SetupSignalHandler()
			mode, err := clientLimits(ctx, cmd, cfg, qps, burst)
			ctrl.Log.Info("client-side rate limit", "mode", mode, "qps", cfg.QPS, "burst", cfg.Burst, "probeError", errString(err))
			if err := agent.Run(ctx, cfg, opts); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.NodeName, "node", os.Getenv("NODE_NAME"), "Node this agent serves (default $NODE_NAME)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, then in-cluster)")
	f.StringVar(&opts.StateDir, "state-dir", agent.DefaultStateDir, "folder for durable state (fencing marks in <dir>/agent/marks)")
	f.DurationVar(&opts.RefreshInterval, "refresh-interval", agent.DefaultRefreshInterval, "period of the Agent heartbeat and of each Store's observation")
	f.IntVar(&opts.VolumeWorkers, "volume-workers", agent.DefaultVolumeWorkers, "VolumeStates reconciled at once (one volume never by two workers)")
	f.StringVar(&opts.MetricsAddr, "metrics-bind-address", agent.DefaultMetricsAddr, "listen address of /metrics (\"0\" disables)")
	f.StringVar(&opts.ProbeAddr, "health-probe-bind-address", agent.DefaultProbeAddr, "listen address of /healthz and /readyz (\"0\" disables)")
	f.StringVar(&opts.PprofAddr, "pprof-bind-address", "", "listen address of Go's /debug/pprof profiles (heap, CPU); empty or \"0\" disables")
	f.StringVar(&opts.HostNQNFile, "host-nqn-file", agent.DefaultHostNQNFile, "file holding this node's NVMe host NQN")
	f.StringVar(&opts.NVMetRoot, "nvmet-root", "/sys/kernel/config/nvmet", "nvmet configfs tree")
	f.StringVar(&opts.AuthNamespace, "auth-namespace", "", "namespace of the DH-HMAC-CHAP host Secrets nvme-auth-<node>, read without --key-server (default $POD_NAMESPACE, then "+agent.DefaultAuthNamespace+")")
	keys.bind(f)
	f.IntVar(&verbosity, "v", 0, "log verbosity (0 info, 1 debug)")
	f.Float32Var(&qps, "kube-api-qps", agent.DefaultKubeAPIQPS, "requests per second to the API server (client-side limit; client-go's own default of 5 delays every volume's status writes). "+clientLimitHelp)
	f.IntVar(&burst, "kube-api-burst", agent.DefaultKubeAPIBurst, "burst of requests to the API server above --kube-api-qps. "+clientLimitHelp)
	return cmd
}

// kubeRestConfig loads kubeconfig (then $KUBECONFIG, then the in-cluster config) with the
// client-side rate limit qps (requests per second) and burst. Neither loader sets a limit, and
// client-go's fallback of 5/s with a burst of 10 queues the writes of an agent or CSI driver
// serving many volumes (csi's BenchmarkPVCBound: PVC → Bound p50 628 ms at 5/s, 191 ms at 50/s).
func kubeRestConfig(kubeconfig string, qps float32, burst int) (*rest.Config, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = qps, burst
	return cfg, nil
}

// clientLimitHelp ends the help of every --kube-api-qps and --kube-api-burst whose process
// follows the API server's flow control (clientLimits).
const clientLimitHelp = "Unless either flag is given, none applies when the API server runs API Priority and Fairness (as in Flux)"

// clientLimits sets cfg's client-side rate limit as clientlimit.Apply decides: the flags'
// values when the operator gave --kube-api-qps or --kube-api-burst on cmd's command line,
// otherwise no limiter when the API server runs API Priority and Fairness, else the flags'
// defaults qps and burst. A probe error keeps the defaults and is returned for the log only.
func clientLimits(ctx context.Context, cmd *cobra.Command, cfg *rest.Config, qps float32, burst int) (clientlimit.Mode, error) {
	f := cmd.Flags()
	explicit := f.Changed("kube-api-qps") || f.Changed("kube-api-burst")
	return clientlimit.Apply(ctx, cfg, clientlimit.Limits{QPS: qps, Burst: burst, Explicit: explicit}, nil)
}

// errString is err's message, or "" for nil (a log value).
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
