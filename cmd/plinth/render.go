package main

import (
	"fmt"
	"sort"

	"github.com/spf13/cobra"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func init() { subcommands = append(subcommands, newRenderCommand) }

func newRenderCommand() *cobra.Command {
	var nodesFile string
	cmd := &cobra.Command{
		Use:   "render PATH... --nodes FILE",
		Short: "Print the StorageClasses, Agents and Stores a policy set renders to for a node inventory",
		Long: `render vets the policy set (exactly as plinth vet does), then renders it for the nodes in
FILE (the output of kubectl get nodes -o yaml) and prints the objects as one YAML stream:
StorageClasses, then Agents, then Stores, each sorted by name. The same input always gives the
same bytes. A StoragePool whose nodeSelector matches no node in FILE renders no Store: a warning
on stderr names it (a typo in a label, or the wrong inventory). A folder that holds several
overlays is refused: render one of them. Exit status: 0 rendered, 1 invalid policy, 2 usage or
I/O error.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if nodesFile == "" {
				return &exitError{code: exitUsage, err: fmt.Errorf("--nodes FILE is required (kubectl get nodes -o yaml > FILE)")}
			}
			pol, problems, err := vetPaths(args)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			if len(problems) > 0 {
				for _, p := range problems {
					fmt.Fprintln(cmd.ErrOrStderr(), p.String())
				}
				return &exitError{code: exitInvalid}
			}
			nodes, err := render.LoadNodes(nodesFile)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			out, err := render.Render(render.Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements, Nodes: nodes})
			if err != nil {
				return &exitError{code: exitInvalid, err: err}
			}
			for _, w := range unmatchedPools(pol.Pools, out.Stores) {
				fmt.Fprintf(cmd.ErrOrStderr(), "plinth: warning: %s\n", w)
			}
			y, err := out.YAML()
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			_, err = cmd.OutOrStdout().Write(y)
			return err
		},
	}
	cmd.Flags().StringVar(&nodesFile, "nodes", "", "node inventory: the output of kubectl get nodes -o yaml")
	return cmd
}

// unmatchedPools says, for each pool with no rendered Store (its nodeSelector matched no node
// of the inventory), which pool and which selector, sorted by pool name.
func unmatchedPools(pools []policyv1.StoragePool, stores []storev1.Store) []string {
	has := make(map[string]bool, len(pools))
	for i := range stores {
		has[stores[i].Spec.Pool] = true
	}
	var out []string
	for i := range pools {
		p := &pools[i]
		if has[p.Name] {
			continue
		}
		sel := "<none>"
		if p.Spec.NodeSelector != nil {
			sel = metav1.FormatLabelSelector(p.Spec.NodeSelector)
		}
		out = append(out, fmt.Sprintf("StoragePool %s: no node matches its nodeSelector %s: it renders no Store, and its StorageClasses cannot provision", p.Name, sel))
	}
	sort.Strings(out)
	return out
}
