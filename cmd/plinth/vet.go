package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

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
unique, the local protocol needs WaitForFirstConsumer, ...). A folder with a kustomization.yaml
is built with kustomize first, as Flux would. A folder that holds several kustomizations (a
policy repository: base/, clusters/<name>/) is vetted the way Flux syncs it: each overlay (a
kustomization no other one includes) is built and vetted on its own, and the bases only through
the overlays that include them. Plain files and folders are read recursively and vetted
together. Documents of other kinds pass through untouched.

Problems are printed one per line on stderr as PATH:LINE:COL: KIND/NAME: FIELD: MESSAGE
(-o json prints them as JSON on stdout); when several overlays were vetted, each line ends with
the overlays it was found in. A base vetted alone that names a pool or protocol defined in
another base says so, and names the overlays that include it. Exit status: 0 valid, 1
invalid, 2 usage or I/O error.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return &exitError{code: exitUsage, err: fmt.Errorf("-o must be text or json, not %q", output)}
			}
			results, err := vetUnits(args)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			invalid := false
			for _, r := range results {
				invalid = invalid || len(r.Problems) > 0
			}
			if output == "json" {
				writeUnitsJSON(cmd.OutOrStdout(), results)
			} else {
				for _, line := range problemLines(results) {
					fmt.Fprintln(cmd.ErrOrStderr(), line)
				}
			}
			if invalid {
				return &exitError{code: exitInvalid}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

// vetPaths loads and vets the policy set at paths; a folder of several overlays is an error
// (vet.OneSet).
func vetPaths(paths []string) (*vet.Policies, []vet.Problem, error) {
	if err := vet.OneSet(paths...); err != nil {
		return nil, nil, err
	}
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

// unitResult is the verdict on one vetted unit (an overlay, or the plain files).
type unitResult struct {
	// Path is the overlay's folder, "" for the plain files and folders.
	Path     string        `json:"path"`
	Valid    bool          `json:"valid"`
	Problems []vet.Problem `json:"problems"`
}

// vetUnits loads paths as units (vet.LoadUnits: each overlay on its own) and vets each; a
// kustomization that relies on a base it does not include gets the problems of vet.Reliance.
func vetUnits(paths []string) ([]unitResult, error) {
	units, err := vet.LoadUnits(paths...)
	if err != nil {
		return nil, err
	}
	v, err := vet.NewVetter()
	if err != nil {
		return nil, err
	}
	out := make([]unitResult, 0, len(units))
	for _, u := range units {
		_, problems := v.Vet(u.Set)
		problems = append(problems, vet.Reliance(u)...)
		vet.SortProblems(problems)
		if problems == nil {
			problems = []vet.Problem{}
		}
		out = append(out, unitResult{Path: u.Path, Valid: len(problems) == 0, Problems: problems})
	}
	return out, nil
}

// problemLines formats the problems of results, one line each; with several overlays, a
// problem found in more than one (a base's, seen through each overlay) is printed once and
// names the overlays.
func problemLines(results []unitResult) []string {
	named := 0
	for _, r := range results {
		if r.Path != "" {
			named++
		}
	}
	var lines []string
	where := map[string][]string{}
	for _, r := range results {
		for _, p := range r.Problems {
			s := p.String()
			if _, ok := where[s]; !ok {
				lines = append(lines, s)
			}
			if r.Path != "" {
				where[s] = append(where[s], r.Path)
			} else if where[s] == nil {
				where[s] = []string{}
			}
		}
	}
	if named < 2 {
		return lines
	}
	for i, s := range lines {
		if w := where[s]; len(w) > 0 {
			lines[i] = s + " (overlay " + strings.Join(w, ", ") + ")"
		}
	}
	return lines
}

// writeUnitsJSON prints {valid, problems, units}: problems of every unit (a base's once per
// overlay that includes it), and each unit's verdict.
func writeUnitsJSON(w io.Writer, results []unitResult) {
	all := []vet.Problem{}
	for _, r := range results {
		all = append(all, r.Problems...)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"valid": len(all) == 0, "problems": all, "units": results})
}
