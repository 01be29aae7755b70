package vet

import (
	"fmt"
	"sort"
)

// Problem is one finding about the policy set. File, Line and Column locate it in the source
// (Line and Column are 1-based; 0 when unknown). Field is the dotted path inside the document,
// such as "spec.backend.lvm.volumeGroup", or "" for the whole document.
type Problem struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Column  int    `json:"column"`
	Kind    string `json:"kind,omitempty"`
	Name    string `json:"name,omitempty"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// String formats the problem as PATH:LINE:COL: KIND/NAME: FIELD: MESSAGE, leaving out the
// parts that are unknown.
func (p Problem) String() string {
	s := p.File
	if p.Line > 0 {
		s += fmt.Sprintf(":%d:%d", p.Line, p.Column)
	}
	s += ": "
	if p.Kind != "" {
		s += p.Kind + "/" + p.Name + ": "
	}
	if p.Field != "" {
		s += p.Field + ": "
	}
	return s + p.Message
}

// SortProblems orders problems by file, line, column and message, so output is stable.
func SortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Column != b.Column {
			return a.Column < b.Column
		}
		return a.Message < b.Message
	})
}
