package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/plinth-storage/plinth/schema/vet"
)

func init() { subcommands = append(subcommands, newVetCommand) }

func newVetCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "vet PATH...",
		Short: "Check policy files, folders and kustomize overlays against Plinth's schema",
		Long: `vet checks every policy.plinth.dev document in the given files and folders against the
embedded CUE schema and the rules across documents (references resolve, StorageClass names are
unique, the local protocol needs WaitForFirstConsumer, ...). Folders are read recursively; a
folder with a kustomization.yaml is built with kustomize first, as Flux would. Documents of other
kinds pass through untouched.

Problems are printed one per line on stderr as PATH:LINE:COL: KIND/NAME: FIELD: MESSAGE
(-o json prints them as JSON on stdout). Exit status: 0 valid, 1 invalid, 2 usage or I/O error.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return &exitError{code: exitUsage, err: fmt.Errorf("-o must be text or json, not %q", output)}
			}
			_, problems, err := vetPaths(args)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			if output == "json" {
				writeProblemsJSON(cmd.OutOrStdout(), problems)
			} else {
				for _, p := range problems {
					fmt.Fprintln(cmd.ErrOrStderr(), p.String())
				}
			}
			if len(problems) > 0 {
				return &exitError{code: exitInvalid}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

// vetPaths loads and vets the policy set at paths.
func vetPaths(paths []string) (*vet.Policies, []vet.Problem, error) {
	set, err := vet.Load(paths...)
	if err != nil {
		return nil, nil, err
	}
	v, err := vet.NewVetter()
	if err != nil {
		return nil, nil, err
	}
	pol, problems := v.Vet(set)
	return pol, problems, nil
}

func writeProblemsJSON(w io.Writer, problems []vet.Problem) {
	if problems == nil {
		problems = []vet.Problem{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"valid": len(problems) == 0, "problems": problems})
}
