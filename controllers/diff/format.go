package diff

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/plinth-storage/plinth/controllers/move"
)

// Output formats of Write.
const (
	FormatText     = "text"
	FormatJSON     = "json"
	FormatMarkdown = "markdown"
)

// MarkdownMarker starts every markdown report, so a CI job can find and update its own
// pull-request comment instead of adding one per push.
const MarkdownMarker = "<!-- plinth-diff -->"

// Write prints r in format (FormatText, FormatJSON or FormatMarkdown). The same report always
// gives the same bytes.
func Write(w io.Writer, r *Report, format string) error {
	switch format {
	case FormatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case FormatMarkdown:
		_, err := io.WriteString(w, markdown(r))
		return err
	case FormatText, "":
		_, err := io.WriteString(w, text(r))
		return err
	}
	return fmt.Errorf("unknown format %q (text, json or markdown)", format)
}

// Summary is one line: what changes, and how many violations.
func Summary(r *Report) string {
	if len(r.Problems) > 0 {
		return fmt.Sprintf("the policy set has %d problems: nothing compared", len(r.Problems))
	}
	c := r.Counts
	s := fmt.Sprintf("%d policy objects changed; rendered objects: %d to create, %d to change, %d to replace, %d to prune, %d kept, %d unchanged",
		len(r.Policy), c.Create, c.Change, c.Replace, c.Prune, c.Keep, c.Unchanged)
	if c.Drift > 0 {
		s += fmt.Sprintf(", %d drifted", c.Drift)
	}
	blocked := 0
	for _, ci := range r.Storage.Classes {
		if ci.Action == ActionReplace && ci.AllowedKnown && !ci.Allowed {
			blocked++
		}
	}
	if blocked > 0 {
		// Each is a violation too when this change causes it; say up front what stalls.
		s += fmt.Sprintf("; %d StorageClass replacements not allowed (their Placements will stall with ReplacementRequired)", blocked)
	}
	if m := r.Storage.Moves; m != nil {
		s += fmt.Sprintf("; %d volume moves planned (%s, about %s; not carried out yet)", len(m.Moves)-m.Blocked, FormatBytes(m.Bytes), seconds(m.Seconds))
		if m.Blocked > 0 {
			s += fmt.Sprintf(", %d blocked", m.Blocked)
		}
	}
	switch len(r.Violations) {
	case 0:
		s += "; no violations"
	case 1:
		s += "; 1 violation"
	default:
		s += fmt.Sprintf("; %d violations", len(r.Violations))
	}
	return s
}

var actionSign = map[string]string{
	ActionCreate: "+", ActionChange: "~", ActionReplace: "!", ActionPrune: "-", ActionKeep: "=", ActionDrift: "?", "delete": "-",
}

func objectLine(o ObjectChange) string {
	s := fmt.Sprintf("%s %s/%s %s", actionSign[o.Action], o.Kind, o.Name, o.Action)
	if len(o.Fields) > 0 {
		s += ": " + strings.Join(o.Fields, ", ")
	}
	if o.Reason != "" {
		s += " (" + o.Reason + ")"
	}
	return s
}

func policyLine(p PolicyChange) string {
	s := fmt.Sprintf("%s %s/%s %s", actionSign[p.Action], p.Kind, p.Name, p.Action)
	if len(p.Fields) > 0 {
		s += ": " + strings.Join(p.Fields, ", ")
	}
	if p.File != "" {
		s += fmt.Sprintf(" [%s:%d]", p.File, p.Line)
	}
	return s
}

func classLines(c ClassImpact) (head string, details []string) {
	switch c.Action {
	case ActionReplace:
		head = fmt.Sprintf("StorageClass %s needs a replacement (%s): %s", c.Name, describe(c), c.Outcome)
	default:
		head = fmt.Sprintf("StorageClass %s leaves the policy: %s", c.Name, c.Outcome)
	}
	for _, cl := range c.Claims {
		d := fmt.Sprintf("PVC %s/%s %s %s", cl.Namespace, cl.Name, FormatBytes(cl.SizeBytes), cl.Phase)
		if cl.Volume != "" {
			d += " (PV " + cl.Volume + ")"
		}
		details = append(details, d)
	}
	for _, pv := range c.Volumes {
		d := fmt.Sprintf("PV %s %s", pv.Name, FormatBytes(pv.SizeBytes))
		if pv.Claim != "" {
			d += " bound to " + pv.Claim
		}
		details = append(details, d)
	}
	return head, details
}

func snapshotClassLines(c SnapshotClassImpact) (head string, details []string) {
	switch c.Action {
	case ActionPrune:
		head = fmt.Sprintf("VolumeSnapshotClass %s leaves the policy: %s", c.Name, c.Outcome)
	default:
		head = fmt.Sprintf("VolumeSnapshotClass %s changes (%s): %s", c.Name, strings.Join(c.Fields, ", "), c.Outcome)
	}
	for _, sn := range c.Snapshots {
		d := fmt.Sprintf("VolumeSnapshot %s/%s", sn.Namespace, sn.Name)
		if sn.Source != "" {
			d += " of " + sn.Source
		}
		if sn.ReadyToUse {
			d += " (ready)"
		} else {
			d += " (not ready)"
		}
		details = append(details, d)
	}
	return head, details
}

func describe(c ClassImpact) string {
	s := make([]string, len(c.Changes))
	for i, ch := range c.Changes {
		s[i] = ch.String()
	}
	return strings.Join(s, "; ")
}

func removalLines(r StoreRemoval, mode string) (head string, details []string) {
	switch {
	case r.Drains:
		head = fmt.Sprintf("Store %s (pool %s, node %s) drains: %d volumes, %s provisioned stay until deleted; no new volumes",
			r.Name, r.Pool, r.Node, len(r.Volumes), FormatBytes(r.ProvisionedBytes))
	case mode == ModeOffline:
		head = fmt.Sprintf("Store %s (pool %s, node %s) leaves the policy: deleted when empty, drained otherwise", r.Name, r.Pool, r.Node)
	default:
		head = fmt.Sprintf("Store %s (pool %s, node %s) leaves the policy: empty, deleted", r.Name, r.Pool, r.Node)
	}
	for _, v := range r.Volumes {
		d := fmt.Sprintf("VolumeState %s %s %s", v.ID, FormatBytes(v.SizeBytes), v.Phase)
		if v.Exported {
			d += " exported"
		}
		if v.Claim != "" {
			d += " PVC " + v.Claim
		}
		if v.PV != "" {
			d += " PV " + v.PV
		}
		details = append(details, d)
	}
	return head, details
}

func text(r *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "plinth diff (%s): %s\n", r.Mode, Summary(r))
	if len(r.Problems) > 0 {
		b.WriteString("\nProblems:\n")
		for _, p := range r.Problems {
			b.WriteString("  " + p.String() + "\n")
		}
		return b.String()
	}
	if len(r.Policy) > 0 {
		b.WriteString("\nPolicy:\n")
		for _, p := range r.Policy {
			b.WriteString("  " + policyLine(p) + "\n")
		}
	}
	if len(r.Objects) > 0 {
		b.WriteString("\nObjects:\n")
		for _, o := range r.Objects {
			b.WriteString("  " + objectLine(o) + "\n")
		}
	}
	s := r.Storage
	if len(s.Classes)+len(s.SnapshotClasses)+len(s.AttributesClasses)+len(s.StoresAdded)+len(s.StoresRemoved)+len(s.Pools) > 0 {
		b.WriteString("\nStorage impact:\n")
	}
	for _, c := range s.Classes {
		head, details := classLines(c)
		b.WriteString("  " + head + "\n")
		for _, d := range details {
			b.WriteString("    " + d + "\n")
		}
	}
	for _, sc := range s.SnapshotClasses {
		head, details := snapshotClassLines(sc)
		b.WriteString("  " + head + "\n")
		for _, d := range details {
			b.WriteString("    " + d + "\n")
		}
	}
	for _, ac := range s.AttributesClasses {
		head, details := attributesClassLines(ac)
		b.WriteString("  " + head + "\n")
		for _, d := range details {
			b.WriteString("    " + d + "\n")
		}
	}
	for _, a := range s.StoresAdded {
		fmt.Fprintf(&b, "  Store %s (pool %s, node %s) added\n", a.Name, a.Pool, a.Node)
	}
	for _, rm := range s.StoresRemoved {
		head, details := removalLines(rm, r.Mode)
		b.WriteString("  " + head + "\n")
		for _, d := range details {
			b.WriteString("    " + d + "\n")
		}
	}
	if len(s.Pools) > 0 {
		b.WriteString("  Capacity (before → after):\n")
		tw := [][]string{{"POOL", "STORES", "ALLOCATABLE", "LIMIT", "PROVISIONED", "DRAINING", "UNREPORTED"}}
		for _, p := range s.Pools {
			tw = append(tw, poolRow(p))
		}
		b.WriteString(table(tw, "    "))
	}
	if m := s.Moves; m != nil {
		b.WriteString("\n" + movesHead(m) + ":\n")
		b.WriteString(table(moveRows(m), "  "))
		b.WriteString("  Capacity with the moves (before → after):\n")
		b.WriteString(table(movePoolRows(m), "    "))
	}
	if len(r.Violations) > 0 {
		b.WriteString("\nViolations:\n")
		for _, v := range r.Violations {
			b.WriteString("  " + v.String() + "\n")
		}
	}
	return b.String()
}

func poolRow(p PoolCapacity) []string {
	arrow := func(a, b int64) string { return FormatBytes(a) + " → " + FormatBytes(b) }
	return []string{p.Pool, fmt.Sprintf("%d → %d", p.StoresBefore, p.StoresAfter),
		arrow(p.Before.Allocatable, p.After.Allocatable), arrow(p.Before.Limit, p.After.Limit),
		arrow(p.Before.Provisioned, p.After.Provisioned), FormatBytes(p.DrainingBytes), fmt.Sprint(p.Unreported)}
}

// table aligns rows in columns separated by two spaces (no trailing spaces).
func table(rows [][]string, indent string) string {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		line := indent
		for i, c := range r {
			line += c
			if i < len(r)-1 {
				line += strings.Repeat(" ", width[i]-len([]rune(c))+2)
			}
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

func markdown(r *Report) string {
	var b strings.Builder
	b.WriteString(MarkdownMarker + "\n")
	b.WriteString("### plinth diff\n\n")
	icon := "✅"
	switch {
	case len(r.Problems) > 0, len(r.Violations) > 0:
		icon = "❌"
	case r.Changed():
		icon = "📝"
	}
	mode := "against the live cluster"
	if r.Mode == ModeOffline {
		mode = "against `" + strings.Join(r.Against, " ") + "` (offline: no live usage)"
	}
	fmt.Fprintf(&b, "%s %s — %s\n", icon, Summary(r), mode)
	if len(r.Problems) > 0 {
		b.WriteString("\n#### Problems\n\n")
		for _, p := range r.Problems {
			b.WriteString("- `" + p.String() + "`\n")
		}
		return b.String()
	}
	if len(r.Violations) > 0 {
		b.WriteString("\n#### Violations\n\n| rule | where | object | message |\n| --- | --- | --- | --- |\n")
		for _, v := range r.Violations {
			where := v.File
			if v.Line > 0 {
				where = fmt.Sprintf("%s:%d", v.File, v.Line)
			}
			obj := v.Object
			if v.Field != "" {
				obj += " `" + v.Field + "`"
			}
			fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", v.Rule, where, obj, cell(v.Message))
		}
	}
	s := r.Storage
	if len(s.Classes)+len(s.SnapshotClasses)+len(s.AttributesClasses)+len(s.StoresAdded)+len(s.StoresRemoved) > 0 {
		b.WriteString("\n#### Storage impact\n\n")
		for _, c := range s.Classes {
			head, details := classLines(c)
			b.WriteString("- " + cell(head) + "\n")
			for _, d := range details {
				b.WriteString("  - " + d + "\n")
			}
		}
		for _, sc := range s.SnapshotClasses {
			head, details := snapshotClassLines(sc)
			b.WriteString("- " + cell(head) + "\n")
			for _, d := range details {
				b.WriteString("  - " + d + "\n")
			}
		}
		for _, ac := range s.AttributesClasses {
			head, details := attributesClassLines(ac)
			b.WriteString("- " + cell(head) + "\n")
			for _, d := range details {
				b.WriteString("  - " + d + "\n")
			}
		}
		for _, a := range s.StoresAdded {
			fmt.Fprintf(&b, "- Store `%s` (pool %s, node %s) added\n", a.Name, a.Pool, a.Node)
		}
		for _, rm := range s.StoresRemoved {
			head, details := removalLines(rm, r.Mode)
			b.WriteString("- " + head + "\n")
			for _, d := range details {
				b.WriteString("  - " + d + "\n")
			}
		}
	}
	if len(s.Pools) > 0 {
		b.WriteString("\n#### Capacity (before → after)\n\n| pool | stores | allocatable | limit | provisioned | draining | unreported |\n| --- | --- | --- | --- | --- | --- | --- |\n")
		for _, p := range s.Pools {
			b.WriteString("| " + strings.Join(poolRow(p), " | ") + " |\n")
		}
	}
	if m := s.Moves; m != nil {
		b.WriteString("\n#### " + movesHead(m) + "\n\n")
		rows := moveRows(m)
		b.WriteString("| " + strings.Join(rows[0], " | ") + " |\n|" + strings.Repeat(" --- |", len(rows[0])) + "\n")
		for _, row := range rows[1:] {
			for i := range row {
				row[i] = cell(row[i])
			}
			b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		}
		b.WriteString("\nCapacity with the moves (before → after):\n\n")
		rows = movePoolRows(m)
		b.WriteString("| " + strings.Join(rows[0], " | ") + " |\n|" + strings.Repeat(" --- |", len(rows[0])) + "\n")
		for _, row := range rows[1:] {
			b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		}
	}
	if len(r.Policy) > 0 {
		b.WriteString("\n#### Policy\n\n")
		for _, p := range r.Policy {
			b.WriteString("- `" + policyLine(p) + "`\n")
		}
	}
	if len(r.Objects) > 0 {
		fmt.Fprintf(&b, "\n<details><summary>Rendered objects (%d listed, %d unchanged)</summary>\n\n", len(r.Objects), r.Counts.Unchanged)
		for _, o := range r.Objects {
			b.WriteString("- `" + objectLine(o) + "`\n")
		}
		b.WriteString("\n</details>\n")
	}
	return b.String()
}

// cell escapes a string for a markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// seconds writes whole seconds as a duration ("1h2m3s", "0s").
func seconds(n int64) string { return (time.Duration(n) * time.Second).String() }

// movesHead titles the move plan: what is planned, the rate assumed, and that nothing is
// carried out yet.
func movesHead(m *move.Result) string {
	s := fmt.Sprintf("Volume moves (plan only, not carried out yet): %d planned, %s to copy, about %s", len(m.Moves)-m.Blocked, FormatBytes(m.Bytes), seconds(m.Seconds))
	if m.Blocked > 0 {
		s += fmt.Sprintf(", %d blocked", m.Blocked)
	}
	if m.AssumedRate > 0 {
		s += fmt.Sprintf("; durations marked * assume a copy rate of %s/s (--move-rate: no Store reports a measured one)", FormatBytes(m.AssumedRate))
	}
	return s
}

// moveRows is the table of moves, header first.
func moveRows(m *move.Result) [][]string {
	rows := [][]string{{"VOLUME", "CLAIM", "FROM", "TO", "BYTES", "START", "DURATION", "DISRUPTION", "WHY"}}
	for _, mv := range m.Moves {
		claim := mv.Claim
		if claim == "" {
			claim = "-"
		}
		to, start, dur, disruption := mv.Target, "+"+seconds(mv.StartSeconds), seconds(mv.DurationSeconds), string(mv.Disruption)
		if mv.Disruption == move.DisruptionBlocked {
			to, start, dur, disruption = "-", "-", "-", "Blocked ("+mv.Blocked+")"
		} else if !mv.RateMeasured {
			dur += "*"
		}
		rows = append(rows, []string{mv.Volume, claim, mv.Source, to, FormatBytes(mv.Bytes), start, dur, disruption, mv.Reason})
	}
	return rows
}

// movePoolRows is the table of pool capacity before and after the moves, header first.
func movePoolRows(m *move.Result) [][]string {
	arrow := func(a, b int64) string { return FormatBytes(a) + " → " + FormatBytes(b) }
	rows := [][]string{{"POOL", "PROVISIONED", "AVAILABLE", "MOVES IN", "MOVES OUT", "LEFT ON EVACUATED"}}
	for _, p := range m.Pools {
		rows = append(rows, []string{p.Pool, arrow(p.ProvisionedBefore, p.ProvisionedAfter), arrow(p.AvailableBefore, p.AvailableAfter),
			fmt.Sprint(p.MovesIn), fmt.Sprint(p.MovesOut), FormatBytes(p.Left)})
	}
	return rows
}

// attributesClassLines is a tier's head line and its details: the outcome, then its claims.
func attributesClassLines(c AttributesClassImpact) (head string, details []string) {
	switch c.Action {
	case ActionChange:
		head = fmt.Sprintf("VolumeAttributesClass %s changes (%s)", c.Name, strings.Join(c.Fields, ", "))
	case ActionKeep:
		head = fmt.Sprintf("VolumeAttributesClass %s leaves the policy, kept in use", c.Name)
	default:
		head = fmt.Sprintf("VolumeAttributesClass %s leaves the policy", c.Name)
	}
	details = append(details, c.Outcome)
	for _, cl := range c.Claims {
		details = append(details, "PVC "+cl)
	}
	return head, details
}
