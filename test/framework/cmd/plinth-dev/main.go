// Command plinth-dev runs Plinth's whole storage loop on this machine for development and
// demonstration: `make dev` builds it and runs `plinth-dev up`. It is part of the test framework
// (test/framework/devenv, in the same Go module as Plinth) and never part of the product: the
// plinth binary of the images links none of it (cmd/plinth's deps_test.go checks that).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// main exits 2 on any error (usage, a failed start or scenario), as `plinth-dev` did.
func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "plinth-dev:", err)
		os.Exit(2)
	}
}

func newRootCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "plinth-dev up|down",
		Short:         "Run the whole GitOps storage loop on this machine: control plane, 3 real nodes, Plinth deployed as pods, Flux, the quickstart",
		SilenceUsage:  true,
		SilenceErrors: true,
		Long: `plinth-dev runs Plinth on this machine with no cloud and no Docker, on real parts: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler from bin/ (make testbin), three real
nodes (a kubelet, containerd and CNI bridge each, one kube-proxy) with the images of make images,
Plinth deployed as users deploy it (kustomize build kustomize/overlays/dev, server-side apply:
controller, agent DaemonSet with the file backend on loop devices, CSI controller with
csi-provisioner, csi-attacher, csi-resizer and csi-snapshotter, CSI node DaemonSet,
plinth-scheduler, the snapshot CRDs and snapshot-controller), Debian's Prometheus on loopback
(its URL printed; scrape configuration generated from the shipped ServiceMonitor, plus the
kubelets and plinth-scheduler; the shipped alert rules), and Flux's
source-controller and kustomize-controller with a Git repository served on loopback.

"plinth-dev up" walks the quickstart (examples/quickstart) step by step: the policy is committed
to the local Git repository and synced by Flux through the GitRepository + Kustomization of
kustomize/flux (--no-flux applies it directly instead); the rendered objects; a PVC and a busybox
pod whose volume the real kubelet stages and mounts, written and read through kubectl exec; a
hand edit shown Drifted (and its alert firing) and corrected; a committed change reconciled; an
invalid policy rejected; a pool filled, a failed volume, kernel drift and a fencing refusal made
by hand with their alerts firing, and every dashboard panel's query run against Prometheus; the
faults are undone and their alerts resolved before it ends (or hands over with --keep). When
another node cluster holds the host's lock, it says so at once, naming the holder, and waits.
It prints a summary with timings, then stops everything, or stays up with --keep until Ctrl-C or
"plinth-dev down". It needs root (containerd, loop devices, mounts).`,
	}
	cmd.AddCommand(newUpCommand(), newDownCommand())
	return cmd
}

func newUpCommand() *cobra.Command {
	var (
		opts   devenv.Options
		keep   bool
		noFlux bool
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start the dev environment and run the quickstart scenario",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Out = cmd.OutOrStdout()
			if noFlux {
				opts.Flux = false
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			env, err := devenv.Up(ctx, opts)
			if err != nil {
				return fmt.Errorf("plinth-dev up: %w (logs under %s)", err, env.Dir)
			}
			defer func() {
				fmt.Fprintln(cmd.OutOrStdout(), "stopping every process plinth-dev started ...")
				if err := env.Down(); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "plinth-dev down:", err)
				}
			}()
			if _, err := devenv.NewWalk(env).Scenario(ctx); err != nil {
				return fmt.Errorf("plinth-dev up: %w (logs under %s)", err, env.Dir)
			}
			if keep {
				fmt.Fprintf(cmd.OutOrStdout(), "\nplinth-dev is up: export KUBECONFIG=%s\nPrometheus (Plinth, plinth-scheduler, kubelets; Plinth's alert rules): %s\nCtrl-C or `plinth-dev down --dir %s` stops it.\n", env.Kubeconfig, env.Prom.URL, env.Dir)
				<-ctx.Done()
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Dir, "dir", devenv.DefaultDir, "work directory (logs, kubeconfig, volumes); recreated")
	f.StringVar(&opts.BinDir, "bin", "", "folder of the test peers (default $PLINTH_TESTBIN, then <checkout>/bin)")
	f.StringVar(&opts.Images, "images", "", "folder of the image archives of make images (default <bin>/images)")
	f.IntVar(&opts.Nodes, "nodes", 3, "number of real nodes")
	f.BoolVar(&opts.Flux, "flux", true, "deliver the policy through a local Git repository synced by Flux (the default; needs the Flux peers of make testbin)")
	f.BoolVar(&noFlux, "no-flux", false, "apply the policy directly instead of through Git and Flux (no Flux binaries needed)")
	f.BoolVar(&keep, "keep", false, "stay up after the scenario until Ctrl-C or plinth-dev down")
	return cmd
}

func newDownCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop every process a plinth-dev up started (by the PIDs it recorded) and release its mounts and loop devices",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pids, err := devenv.DownDir(dir)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "stopped %d processes %v; released mounts and loop devices under %s\n", len(pids), pids, dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", devenv.DefaultDir, "work directory of the plinth-dev up to stop")
	return cmd
}
