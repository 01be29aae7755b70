package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/plinth-storage/plinth/controllers/diff"
	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/controllers/render"
	"github.com/plinth-storage/plinth/schema/vet"
)

func init() { subcommands = append(subcommands, newDiffCommand) }

func newDiffCommand() *cobra.Command {
	var (
		kubeconfig, namespace, inventoryName, fieldManager, output, nodesFile, moveRate string
		against                                                                         []string
		timeout                                                                         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "diff PATH... [--kubeconfig FILE] | diff PATH... --against OLDPATH --nodes FILE",
		Short: "Show what a policy change will do to storage before it merges",
		Long: `diff vets and renders the policy set at PATH (exactly as plinth vet and plinth render do,
kustomize overlays included) and compares it with the live cluster without changing anything:
each rendered object is dry-run with server-side apply under the controller's field manager, and
pruning is predicted from the controller's inventory ConfigMap with the controller's rules.

It prints the policy objects that change; the rendered objects created, changed (with the
changed fields), replaced, pruned or kept, and the unchanged count; the storage impact
(StorageClasses whose immutable fields change and whether the Placement's replacement policy
allows it, the PVCs and PVs of each affected class, Stores added and Stores that drain with their
volumes, capacity per pool before → after); and violations with the policy file and line: a
reserve or node selector that leaves less room than is provisioned, overcommit beyond the new
limit, a StorageClass in use that leaves the policy, a protocol change on a pool with exported
volumes, an object the API server rejects.

Volume moves a change asks for (StoragePool spec.evacuateNodes, Placement spec.existingVolumes:
Move) are planned from the live VolumeStates, PVs, VolumeAttachments and snapshots: each volume
and its PVC, source → target Store, bytes to copy, the estimated start and duration (at
--move-rate, marked as assumed, where no Store reports a measured rate), the disruption (none,
a pod restart, or blocked and why), and capacity per pool before → after. A move that cannot
succeed (no room, no target with the protocol, snapshots) is a violation at the field that asks
for it. The moves are a plan only: Plinth does not carry them out yet.

With --against OLDPATH and --nodes FILE (kubectl get nodes -o yaml) it compares two policy trees
offline, such as a pull request's merge base and head: the same report without live usage.

Exit status: 0 no change, 1 changes without violations, 3 violations, 2 errors (usage, I/O, the
API server, or a policy set that does not vet or render: its problems are printed).
-o markdown is meant for a pull-request comment; it starts with ` + diff.MarkdownMarker + `.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch output {
			case diff.FormatText, diff.FormatJSON, diff.FormatMarkdown:
			default:
				return &exitError{code: exitUsage, err: fmt.Errorf("-o must be text, json or markdown, not %q", output)}
			}
			rate, err := resource.ParseQuantity(moveRate)
			if err != nil || rate.Value() <= 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--move-rate must be a positive quantity of bytes per second such as 100Mi, not %q", moveRate)}
			}
			if err := vet.OneSet(append(append([]string(nil), args...), against...)...); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			var rep *diff.Report
			if len(against) > 0 {
				if nodesFile == "" {
					return &exitError{code: exitUsage, err: fmt.Errorf("--against needs --nodes FILE (kubectl get nodes -o yaml > FILE)")}
				}
				nodes, err := render.LoadNodes(nodesFile)
				if err != nil {
					return &exitError{code: exitUsage, err: err}
				}
				if rep, err = diff.Offline(args, against, nodes); err != nil {
					return &exitError{code: exitUsage, err: err}
				}
			} else {
				if nodesFile != "" {
					return &exitError{code: exitUsage, err: fmt.Errorf("--nodes is for the offline mode (with --against); live mode reads the cluster's Nodes")}
				}
				c, err := liveClient(kubeconfig, policy.Scheme)
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				defer cancel()
				rep, err = diff.Live(ctx, args, diff.LiveOptions{Client: c, Namespace: namespace, InventoryName: inventoryName, FieldManager: fieldManager, MoveRate: rate.Value()})
				if err != nil {
					return &exitError{code: exitUsage, err: err}
				}
			}
			if err := diff.Write(cmd.OutOrStdout(), rep, output); err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			if code := rep.ExitCode(); code != exitOK {
				return &exitError{code: code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "path of a kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)")
	f.StringVar(&namespace, "namespace", diff.DefaultNamespace, "namespace of the controller's inventory ConfigMap")
	f.StringVar(&inventoryName, "inventory-name", inventory.DefaultName, "name of the controller's inventory ConfigMap")
	f.StringVar(&fieldManager, "field-manager", policy.DefaultFieldManager, "the controller's server-side apply field manager (dry-runs apply as it)")
	f.StringVarP(&output, "output", "o", diff.FormatText, "output format: text, json or markdown")
	f.StringArrayVar(&against, "against", nil, "offline mode: the old policy tree (repeatable)")
	f.StringVar(&nodesFile, "nodes", "", "offline mode: node inventory, the output of kubectl get nodes -o yaml")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "give up on the API server after this long (live mode)")
	f.StringVar(&moveRate, "move-rate", "100Mi", "copy rate in bytes per second that volume move estimates assume where no Store reports a measured one (a quantity: 100Mi, 1Gi)")
	return cmd
}

// liveClient is the client of the live-cluster commands (diff, adopt): the cluster of
// kubeconfig (when set, else controller-runtime's lookup: $KUBECONFIG, in-cluster,
// ~/.kube/config) with the types of scheme. Its errors are usage errors (exit 2).
func liveClient(kubeconfig string, scheme func() (*runtime.Scheme, error)) (client.Client, error) {
	if kubeconfig != "" {
		os.Setenv("KUBECONFIG", kubeconfig)
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("kubeconfig: %w", err)}
	}
	s, err := scheme()
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	return c, nil
}
