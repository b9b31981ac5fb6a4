package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// column is one column of a table: every run of one system, or a single run.
type column struct {
	label string
	runs  []*run
}

// row is one row of a table: a label and how a column's runs fill its cell. With one run a cell is
// that run's value; with more, the median and the range (min–max) of the times, the worst margin, the
// median and the maximum of Machines created, and how many runs completed or stalled.
type row struct {
	label string
	cell  func(rs []*run) string
}

var rows = []row{
	{"outcome", outcomeCell},
	{"minimum failure margin", marginCell},
	{"seconds at margin ≤ 0", func(rs []*run) string {
		return spread(collect(rs, func(r *run) (time.Duration, bool) { return r.atMostZero, true }), "")
	}},
	{"fault → mark", durationCell("not marked", (*run).markedAfter)},
	{"fault → healthy replacement", durationCell("—", func(r *run) (time.Duration, bool) { return r.since(r.replacement) })},
	{"fault → full voting strength", durationCell("—", func(r *run) (time.Duration, bool) { return r.since(r.fullStrength) })},
	{"Machines created", machinesCell},
	{"fenced before delete", fencedCell},
}

// table is the scenario's table: one column per system, over all of its runs.
func (o scenarioOutcome) table() string {
	var cols []column
	for j, rs := range o.runs {
		if len(rs) > 0 {
			cols = append(cols, column{label: string(systems[j]), runs: rs})
		}
	}
	return renderTable(o.heading(), cols)
}

// everyRun is the scenario's table with one column per run.
func (o scenarioOutcome) everyRun() string {
	var cols []column
	for j, rs := range o.runs {
		for k, r := range rs {
			cols = append(cols, column{label: fmt.Sprintf("%s, run %d", systems[j], k+1), runs: []*run{r}})
		}
	}
	return renderTable(o.heading(), cols)
}

func (o scenarioOutcome) heading() string {
	return fmt.Sprintf("### %s (%d control-plane Machines)", o.sc.name, o.sc.controlPlane)
}

func renderTable(heading string, cols []column) string {
	var b strings.Builder
	b.WriteString(heading + "\n\n| |")
	for _, c := range cols {
		b.WriteString(" " + c.label + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, rw := range rows {
		b.WriteString("| " + rw.label + " |")
		for _, c := range cols {
			b.WriteString(" " + rw.cell(c.runs) + " |")
		}
		b.WriteString("\n")
	}
	return b.String() + "\n"
}

func outcomeCell(rs []*run) string {
	completed := 0
	var reasons []string
	for _, r := range rs {
		switch {
		case !r.fullStrength.IsZero():
			completed++
		case r.waiting != "" && !slices.Contains(reasons, r.waiting):
			reasons = append(reasons, r.waiting)
		}
	}
	stalled := "**stalled**"
	if len(reasons) > 0 {
		stalled += ": " + strings.Join(reasons, "; ")
	}
	switch {
	case len(rs) == 1 && completed == 1:
		return "completed"
	case len(rs) == 1:
		return stalled
	case completed == len(rs):
		return fmt.Sprintf("%d completed", completed)
	}
	return fmt.Sprintf("%d completed, %d %s", completed, len(rs)-completed, stalled)
}

// marginCell is the worst (lowest) minimum failure margin, with every run's when they differ.
func marginCell(rs []*run) string {
	margins := make([]string, len(rs))
	worst := rs[0].minMargin
	for i, r := range rs {
		margins[i] = fmt.Sprint(r.minMargin)
		worst = min(worst, r.minMargin)
	}
	if len(slices.Compact(slices.Clone(margins))) == 1 {
		return fmt.Sprint(worst)
	}
	return fmt.Sprintf("%d (per run: %s)", worst, strings.Join(margins, ", "))
}

func machinesCell(rs []*run) string {
	created := make([]float64, len(rs))
	for i, r := range rs {
		created[i] = float64(r.created())
	}
	med, mx := median(created), slices.Max(created)
	if med == mx {
		return fmt.Sprint(med)
	}
	return fmt.Sprintf("%g (max %g)", med, mx)
}

// fencedCell is every distinct fencing outcome, with how many runs had it when they differ.
func fencedCell(rs []*run) string {
	var distinct []string
	count := map[string]int{}
	for _, r := range rs {
		if count[r.fenced] == 0 {
			distinct = append(distinct, r.fenced)
		}
		count[r.fenced]++
	}
	if len(distinct) == 1 {
		return distinct[0]
	}
	for i, f := range distinct {
		distinct[i] = fmt.Sprintf("%s (%d of %d)", f, count[f], len(rs))
	}
	return strings.Join(distinct, "; ")
}

// durationCell fills a time row: the median and range over the runs that reached the point, and in
// how many runs it was never reached (missing names that).
func durationCell(missing string, at func(*run) (time.Duration, bool)) func([]*run) string {
	return func(rs []*run) string {
		values := collect(rs, at)
		if len(values) == 0 {
			return missing
		}
		s := spread(values, " s")
		if n := len(rs) - len(values); n > 0 {
			s += fmt.Sprintf(", %s in %d of %d", missing, n, len(rs))
		}
		return s
	}
}

// collect is the seconds of every run whose value is known.
func collect(rs []*run, at func(*run) (time.Duration, bool)) []float64 {
	var out []float64
	for _, r := range rs {
		if d, ok := at(r); ok {
			out = append(out, d.Seconds())
		}
	}
	return out
}

// spread is "median<unit>" for one value, "median<unit> (min–max)" for more.
func spread(values []float64, unit string) string {
	s := fmt.Sprintf("%.1f%s", median(values), unit)
	if len(values) > 1 {
		s += fmt.Sprintf(" (%.1f–%.1f)", slices.Min(values), slices.Max(values))
	}
	return s
}

// median of a non-empty list: the middle value, or the mean of the two middle ones.
func median(values []float64) float64 {
	v := slices.Sorted(slices.Values(values))
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// since is how long after the fault t came, if it came.
func (r *run) since(t time.Time) (time.Duration, bool) {
	if t.IsZero() {
		return 0, false
	}
	return t.Sub(r.fault), true
}

// markedAfter is when the last victim was marked, if every victim was.
func (r *run) markedAfter() (time.Duration, bool) {
	var last time.Time
	for _, v := range r.victims {
		t, ok := r.marked[v]
		if !ok {
			return 0, false
		}
		if t.After(last) {
			last = t
		}
	}
	return r.since(last)
}

func (r *run) created() int { return len(r.seen) - len(r.initial) }

// brief is one line on a finished run, for the progress log.
func (r *run) brief() string {
	line := outcomeCell([]*run{r})
	for _, rw := range rows[1:] {
		line += "; " + rw.label + " " + rw.cell([]*run{r})
	}
	if r.diagnosis != "" {
		line += "; " + r.diagnosis
	}
	return line
}
