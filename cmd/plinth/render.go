package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/plinth-storage/plinth/controllers/render"
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
same bytes. Exit status: 0 rendered, 1 invalid policy, 2 usage or I/O error.`,
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
