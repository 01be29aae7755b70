package devenv

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// StepResult is one finished step of `plinth-dev`: its title, what it showed,
// how long it took and its error (nil when it passed).
type StepResult struct {
	Title    string
	Detail   string
	Duration time.Duration
	Err      error
}

// reporter prints one line per step ("✓ title (1.2s)" then indented detail
// lines) and keeps the results for the summary and the tests.
type reporter struct {
	mu      sync.Mutex
	out     io.Writer
	results []StepResult
}

func (r *reporter) run(title string, f func() (string, error)) error {
	start := time.Now()
	detail, err := f()
	d := time.Since(start)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results = append(r.results, StepResult{Title: title, Detail: detail, Duration: d, Err: err})
	mark := "✓"
	if err != nil {
		mark = "✗"
	}
	fmt.Fprintf(r.out, "%s %s (%.1fs)\n", mark, title, d.Seconds())
	for _, l := range strings.Split(strings.TrimRight(detail, "\n"), "\n") {
		if l != "" {
			fmt.Fprintf(r.out, "    %s\n", l)
		}
	}
	if err != nil {
		for _, l := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(r.out, "    error: %s\n", l)
		}
		return fmt.Errorf("step %q: %w", title, err)
	}
	return nil
}

func (r *reporter) printf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.out, format, args...)
}
