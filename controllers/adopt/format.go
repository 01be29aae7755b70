package adopt

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Output formats.
const (
	FormatText     = "text"
	FormatJSON     = "json"
	FormatMarkdown = "markdown"
)

// Report is a plan and, after --confirm, what was done.
type Report struct {
	Plan *Plan `json:"plan"`
	// Confirmed is true when the plan was applied.
	Confirmed bool     `json:"confirmed"`
	Results   []Result `json:"results,omitempty"`
}

// Write prints r in format (text, json or markdown). Errors: an unknown format, write errors.
func Write(w io.Writer, r *Report, format string) error {
	switch format {
	case FormatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case FormatText, FormatMarkdown:
	default:
		return fmt.Errorf("unknown format %q", format)
	}
	md := format == FormatMarkdown
	var b strings.Builder
	p := r.Plan
	head := func(s string) {
		if md {
			fmt.Fprintf(&b, "\n### %s\n\n", s)
		} else {
			fmt.Fprintf(&b, "\n%s\n", s)
		}
	}
	item := func(format string, args ...any) {
		if md {
			b.WriteString("- ")
		} else {
			b.WriteString("  ")
		}
		fmt.Fprintf(&b, format+"\n", args...)
	}
	verb := "plan"
	if r.Confirmed {
		verb = "done"
	}
	if md {
		b.WriteString("## plinth adopt\n\n")
	}
	fmt.Fprintf(&b, "%s: adopt %d / ambiguous %d / orphan %d / missing %d\n", verb, len(p.Adopt), len(p.Ambiguous), len(p.Orphan), len(p.Missing))
	if len(p.Adopt) > 0 {
		head("adopt (PVC ↔ volume: same identity, size and policy)")
		for _, a := range p.Adopt {
			pv := "PV " + a.PV + " (new, pre-bound)"
			if !a.CreatePV {
				pv = "PV " + a.PV + " (exists)"
			}
			item("%s ↔ %s on Store %s (node %s), %d bytes, StorageClass %s, %s", a.Claim, a.VolumeID, a.Store, a.Node, a.SizeBytes, a.StorageClass, pv)
		}
	}
	for _, l := range []struct {
		name string
		fs   []Finding
	}{{"ambiguous (reported, left alone)", p.Ambiguous}, {"orphan (no claim: left alone)", p.Orphan}, {"missing (claim in Git, no volume: nothing created)", p.Missing}} {
		if len(l.fs) == 0 {
			continue
		}
		head(l.name)
		for _, f := range l.fs {
			var who []string
			if f.VolumeID != "" {
				who = append(who, f.VolumeID)
			}
			if f.Store != "" {
				who = append(who, "Store "+f.Store)
			}
			if f.Claim != "" {
				who = append(who, "PVC "+f.Claim)
			}
			item("%s: %s", strings.Join(who, ", "), f.Reason)
		}
	}
	if len(p.Warnings) > 0 {
		head("warnings")
		for _, w := range p.Warnings {
			item("%s", w)
		}
	}
	if r.Confirmed {
		head("results")
		for _, res := range r.Results {
			state := "Ready"
			if !res.Ready {
				state = "NOT done: " + res.Error
			}
			item("%s ↔ %s: %s", res.Claim, res.VolumeID, state)
		}
	} else if len(p.Adopt) > 0 {
		b.WriteString("\nNothing was written. Run again with --confirm to adopt.\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
