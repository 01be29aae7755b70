package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/policy"
)

func init() { subcommands = append(subcommands, newControllerCommand) }

func newControllerCommand() *cobra.Command {
	var (
		kubeconfig, metricsAddr, healthAddr, namespace, inventoryName       string
		leaderElection                                                      bool
		leaderElectionNamespace, fieldManager, argoNamespace, keyServerAddr string
		logFormat, logLevel                                                 string
		resync                                                              time.Duration
		qps                                                                 float32
		burst                                                               int
		lease                                                               leaseFlags
	)
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the policy controller: render StoragePools, Protocols and Placements into StorageClasses, Agents and Stores",
		Long: `controller watches the policy objects (StoragePool, Protocol, Placement), Nodes and the objects it
owns, and keeps the cluster equal to the render of the whole policy set, as plinth render prints it.

Each reconcile vets the set with the embedded CUE schema (an invalid set is reported as
Stalled=True on the offending objects and nothing is applied or pruned), renders it, applies
with server-side apply under one field manager, replaces StorageClasses whose immutable fields
changed only when the Placement's spec.storageClass.replacement allows it, prunes what left Git
using the inventory ConfigMap only (never a StorageClass that PVCs use, never a Store that holds
volumes), reports drift of the objects it owns (Drifted condition, plinth_drift_objects) and
corrects it under driftPolicy Correct. Status: kstatus conditions Ready, Reconciling, Stalled with
observedGeneration, so kubectl wait --for=condition=Ready and Flux health checks work.

The in-cluster configuration is used when --kubeconfig and $KUBECONFIG are unset.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if logFormat != "json" && logFormat != "console" {
				return &exitError{code: exitUsage, err: fmt.Errorf("--log-format must be json or console, not %q", logFormat)}
			}
			// controller-runtime's zap options parse level and encoder from their own flags.
			opts := zap.Options{}
			zfs := flag.NewFlagSet("zap", flag.ContinueOnError)
			zfs.SetOutput(io.Discard)
			opts.BindFlags(zfs)
			if err := zfs.Parse([]string{"--zap-encoder=" + logFormat, "--zap-log-level=" + logLevel}); err != nil {
				return &exitError{code: exitUsage, err: fmt.Errorf("--log-level: %w", err)}
			}
			logger := zap.New(zap.UseFlagOptions(&opts))
			leaseDuration, renewDeadline, retryPeriod, err := lease.timings()
			if err != nil {
				return err
			}
			if kubeconfig != "" {
				os.Setenv("KUBECONFIG", kubeconfig)
			}
			cfg, err := config.GetConfig()
			if err != nil {
				return &exitError{code: exitUsage, err: fmt.Errorf("kubeconfig: %w", err)}
			}
			if namespace == "" {
				namespace = os.Getenv("POD_NAMESPACE")
			}
			if namespace == "" {
				return &exitError{code: exitUsage, err: fmt.Errorf("--namespace (or $POD_NAMESPACE) is required: it holds the inventory ConfigMap")}
			}
			if leaderElectionNamespace == "" {
				leaderElectionNamespace = namespace
			}
			ctx := ctrl.SetupSignalHandler()
			mode, err := clientLimits(ctx, cmd, cfg, qps, burst)
			logger.Info("client-side rate limit", "mode", mode, "qps", cfg.QPS, "burst", cfg.Burst, "probeError", errString(err))
			qps, burst = cfg.QPS, cfg.Burst
			mgr, _, err := policy.NewManager(ctx, policy.Options{
				Config: cfg, MetricsAddr: metricsAddr, HealthAddr: healthAddr,
				LeaderElection: leaderElection, LeaderElectionNamespace: leaderElectionNamespace,
				LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
				Namespace: namespace, InventoryName: inventoryName, FieldManager: fieldManager,
				ArgoNamespace: argoNamespace, Resync: resync, Logger: logger, QPS: qps, Burst: burst,
				KeyServerAddr: keyServerAddr,
			})
			if err != nil {
				return err
			}
			logger.Info("starting plinth controller", "namespace", namespace, "inventory", inventoryName, "fieldManager", fieldManager)
			return mgr.Start(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "path of a kubeconfig file (default: $KUBECONFIG, then the in-cluster configuration)")
	f.StringVar(&metricsAddr, "metrics-bind-address", ":8080", `address of the Prometheus /metrics endpoint ("0" disables it)`)
	f.StringVar(&healthAddr, "health-probe-bind-address", ":8081", `address of /healthz and /readyz ("0" disables them)`)
	f.BoolVar(&leaderElection, "leader-elect", false, "elect a leader with a Lease so only one replica reconciles")
	f.StringVar(&leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: --namespace)")
	lease.bind(f)
	f.StringVar(&namespace, "namespace", "", "namespace of the inventory ConfigMap, usually the controller's own (default: $POD_NAMESPACE)")
	f.StringVar(&inventoryName, "inventory-name", inventory.DefaultName, "name of the inventory ConfigMap")
	f.StringVar(&fieldManager, "field-manager", policy.DefaultFieldManager, "server-side apply field manager of every write")
	f.StringVar(&keyServerAddr, "key-server-bind-address", "", `address of the DH-HMAC-CHAP key server (HTTPS; agents and node plugins get their keys there, docs/design.md#key-distribution); "" serves none`)
	f.StringVar(&argoNamespace, "argocd-namespace", "argocd", "namespace of Argo CD's Applications, to read the synced revision")
	f.DurationVar(&resync, "resync-interval", 10*time.Minute, "reconcile this often without events (revision refresh, missed drift); 0 disables")
	f.Float32Var(&qps, "kube-api-qps", 50, "requests per second to the API server (client-side limit). "+clientLimitHelp)
	f.IntVar(&burst, "kube-api-burst", 300, "burst of requests to the API server above --kube-api-qps. "+clientLimitHelp)
	f.StringVar(&logFormat, "log-format", "json", "log format: json (structured, one object per line) or console")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}
