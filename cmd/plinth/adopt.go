package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/plinth-storage/plinth/controllers/adopt"
	"github.com/plinth-storage/plinth/schema/vet"
)

func init() { subcommands = append(subcommands, newAdoptCommand) }

func newAdoptCommand() *cobra.Command {
	var (
		kubeconfig, output string
		confirm            bool
		timeout, readyWait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "adopt PATH... [--confirm]",
		Short: "Re-adopt the volumes on the nodes after the control plane was lost",
		Long: `adopt matches the volumes that the agents list as unclaimed (Store status.unclaimed, each
with the identity stamp it carries on its node) to the PVCs of the Git checkout at PATH (PVCs and
StatefulSets' volumeClaimTemplates; the policy there is vetted as plinth vet does) and of the live
cluster, and prints the plan:

  adopt N      PVC ↔ volume with the same identity, StorageClass, size and policy
  ambiguous M  a torn or unknown stamp, two volumes for one PVC, a PVC bound to another volume,
               a StorageClass, size, mode or policy that differs: reported, left alone
  orphan K     no PVC in the checkout or the cluster: left alone
  missing      a PVC of the checkout whose volume no Store lists: listed, nothing created

Nothing is written without --confirm. With --confirm it creates, for each adoption, the
VolumeState (the agent then retires the volume's old fencing lifecycle and starts a new one, so
any old attachment is fenced) and a PV pre-bound to the PVC, and waits until the agents report
the VolumeStates Ready. A second run finds nothing to do. Runbook: docs/operations.md
"Disaster recovery: re-adopting volumes".

Exit status: 0 nothing (left) to do, 1 adoptions planned (without --confirm), 3 ambiguous or
missing volumes, or adoptions not Ready after --confirm, 2 errors.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch output {
			case adopt.FormatText, adopt.FormatJSON, adopt.FormatMarkdown:
			default:
				return &exitError{code: exitUsage, err: fmt.Errorf("-o must be text, json or markdown, not %q", output)}
			}
			if err := vet.OneSet(args...); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			git, err := adopt.LoadGit(args)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			c, err := liveClient(kubeconfig, adopt.Scheme)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			in, err := adopt.LoadInput(ctx, c, git)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			rep := &adopt.Report{Plan: adopt.Build(in)}
			code := rep.Plan.ExitCode(!confirm)
			if confirm {
				rep.Confirmed = true
				rep.Results, err = adopt.Apply(ctx, c, rep.Plan, readyWait)
				for _, r := range rep.Results {
					if !r.Ready {
						code = adopt.ExitAttention
					}
				}
			}
			if werr := adopt.Write(cmd.OutOrStdout(), rep, output); werr != nil {
				return &exitError{code: exitUsage, err: werr}
			}
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			if code != exitOK {
				return &exitError{code: code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "path of a kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)")
	f.StringVarP(&output, "output", "o", adopt.FormatText, "output format: text, json or markdown")
	f.BoolVar(&confirm, "confirm", false, "create the VolumeStates and PVs of the plan (without it nothing is written)")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "give up on the API server after this long")
	f.DurationVar(&readyWait, "ready-timeout", 2*time.Minute, "with --confirm: how long to wait for the adopted VolumeStates to be Ready")
	return cmd
}
