package bench

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Table renders the results of one fleet shape (same N and health checks, one result per variant)
// as a Markdown table with the ratios CAPR/CAPI for the same limits.
func Table(results []*Result) string {
	if len(results) == 0 {
		return ""
	}
	byName := map[string]*Result{}
	var cols []string
	for _, r := range results {
		byName[r.Config.Variant.Name] = r
		cols = append(cols, r.Config.Variant.Name)
	}
	// The ratios compare shipped defaults with shipped defaults, and CAPR without limits (its
	// defaults, unless a variant says otherwise) with CAPI without limits.
	type ratio struct{ name, capr, capi string }
	var ratios []ratio
	pairs := []ratio{{"CAPR/CAPI defaults", "CAPR defaults", "CAPI defaults"}}
	for _, r := range results {
		if v := r.Config.Variant; v.System == "capr" && v.Unlimited() {
			pairs = append(pairs, ratio{"CAPR/CAPI unlimited", v.Name, "CAPI unlimited"})
			break
		}
	}
	for _, p := range pairs {
		if byName[p.capr] != nil && byName[p.capi] != nil {
			ratios = append(ratios, p)
		}
	}

	type row struct {
		name  string
		value func(*Result) (float64, string)
	}
	secs := func(d time.Duration) (float64, string) { return d.Seconds(), fmt.Sprintf("%.2f", d.Seconds()) }
	perChange := func(ph Phase, keep func(string) bool) (float64, string) {
		if ph.Changed == 0 {
			return 0, "-"
		}
		v := float64(total(ph.Stats.Requests, keep)) / float64(ph.Changed)
		return v, fmt.Sprintf("%.2f", v)
	}
	isEvent := isEventWrite
	nonEventWrite := func(k string) bool { return isWrite(k) && !isEvent(k) }
	machineWrite := func(k string) bool {
		_, resource, _ := strings.Cut(k, " ")
		return isWrite(k) && (resource == "machines" || strings.HasPrefix(resource, "machines/"))
	}
	rows := []row{
		{"mark: last Machine (s)", func(r *Result) (float64, string) { return markedOrNot(r.Mark, r.Mark.Max) }},
		{"mark: last remediation requested (s)", func(r *Result) (float64, string) {
			if r.Mark.Requested < r.Mark.Changed {
				return r.Mark.LastRequest.Seconds(), fmt.Sprintf("%d/%d", r.Mark.Requested, r.Mark.Changed)
			}
			return secs(r.Mark.LastRequest)
		}},
		{"mark: p50 (s)", func(r *Result) (float64, string) { return secs(r.Mark.P50) }},
		{"mark: p99 (s)", func(r *Result) (float64, string) { return secs(r.Mark.P99) }},
		{"mark: writes per mark, events excluded", func(r *Result) (float64, string) { return perChange(r.Mark, nonEventWrite) }},
		{"mark: Machine writes per mark", func(r *Result) (float64, string) { return perChange(r.Mark, machineWrite) }},
		{"mark: event writes per mark", func(r *Result) (float64, string) { return perChange(r.Mark, isEvent) }},
		{"mark: health checker's writes per mark, events included", func(r *Result) (float64, string) {
			return perChange(r.Mark, func(k string) bool { return isWrite(k) && byHealthChecker(r.Config.Variant.System, k) })
		}},
		{"mark: requests per mark, all verbs", func(r *Result) (float64, string) { return perChange(r.Mark, nil) }},
		{"mark: CPU (s)", func(r *Result) (float64, string) {
			return r.Mark.Stats.CPUSeconds, fmt.Sprintf("%.2f", r.Mark.Stats.CPUSeconds)
		}},
		{"mark: API server + etcd CPU (s)", func(r *Result) (float64, string) {
			return r.Mark.ServerCPUSeconds, fmt.Sprintf("%.2f", r.Mark.ServerCPUSeconds)
		}},
		{"mark: health-check reconciles", func(r *Result) (float64, string) {
			return float64(r.Mark.Stats.Reconciles), fmt.Sprintf("%d", r.Mark.Stats.Reconciles)
		}},
		{"mark: targets evaluated (CAPR's count)", func(r *Result) (float64, string) {
			if r.Config.Variant.System != "capr" {
				return 0, "-"
			}
			return float64(r.Mark.Stats.TargetsEvaluated), fmt.Sprintf("%d", r.Mark.Stats.TargetsEvaluated)
		}},
		{"mark: peak heap (MiB)", func(r *Result) (float64, string) { return mib(r.Mark.Stats.PeakHeapBytes) }},
		{"recover: last mark cleared (s)", func(r *Result) (float64, string) { return markedOrNot(r.Recover, r.Recover.Max) }},
		{"recover: p50 (s)", func(r *Result) (float64, string) { return secs(r.Recover.P50) }},
		{"recover: writes per Machine, events excluded", func(r *Result) (float64, string) { return perChange(r.Recover, nonEventWrite) }},
		{"recover: CPU (s)", func(r *Result) (float64, string) {
			return r.Recover.Stats.CPUSeconds, fmt.Sprintf("%.2f", r.Recover.Stats.CPUSeconds)
		}},
		{"heartbeat of every Node: CPU above idle (s)", func(r *Result) (float64, string) {
			return ran(r.Heartbeat, r.Heartbeat.Stats.CPUSeconds, "%.2f")
		}},
		{"heartbeat of every Node: health-check reconciles", func(r *Result) (float64, string) {
			return ran(r.Heartbeat, float64(r.Heartbeat.Stats.Reconciles), "%.0f")
		}},
		{"heartbeat of every Node: requests", func(r *Result) (float64, string) {
			return ran(r.Heartbeat, float64(total(r.Heartbeat.Stats.Requests, nil)), "%.0f")
		}},
		{"one Node: marked after (s)", func(r *Result) (float64, string) {
			if r.Single.Changed == 0 {
				return 0, "-"
			}
			return markedOrNot(r.Single, r.Single.Max)
		}},
		{"one Node: CPU (s)", func(r *Result) (float64, string) { return ran(r.Single, r.Single.Stats.CPUSeconds, "%.3f") }},
		{"one Node: health-check reconciles", func(r *Result) (float64, string) {
			return ran(r.Single, float64(r.Single.Stats.Reconciles), "%.0f")
		}},
		{"one Node: targets evaluated (CAPR's count)", func(r *Result) (float64, string) {
			if r.Config.Variant.System != "capr" {
				return 0, "-"
			}
			return ran(r.Single, float64(r.Single.Stats.TargetsEvaluated), "%.0f")
		}},
		{"one Node: requests", func(r *Result) (float64, string) {
			return ran(r.Single, float64(total(r.Single.Stats.Requests, nil)), "%.0f")
		}},
		{"setup: every target healthy (s)", func(r *Result) (float64, string) { return secs(r.Setup) }},
	}

	first := results[0].Config
	var b strings.Builder
	fmt.Fprintf(&b, "N = %d Machines, %d health check(s), %d flipped, %d workers\n\n", first.Machines, first.HealthChecks,
		results[0].Mark.Changed, first.Workers)
	b.WriteString("| |")
	for _, c := range cols {
		b.WriteString(" " + c + " |")
	}
	for _, p := range ratios {
		b.WriteString(" " + p.name + " |")
	}
	b.WriteString("\n|---|")
	b.WriteString(strings.Repeat("---|", len(cols)+len(ratios)))
	b.WriteString("\n")
	for _, rw := range rows {
		b.WriteString("| " + rw.name + " |")
		for _, c := range cols {
			_, s := rw.value(byName[c])
			b.WriteString(" " + s + " |")
		}
		for _, p := range ratios {
			a, _ := rw.value(byName[p.capr])
			c, _ := rw.value(byName[p.capi])
			if c == 0 {
				b.WriteString(" - |")
				continue
			}
			fmt.Fprintf(&b, " %.2f |", a/c)
		}
		b.WriteString("\n")
	}
	b.WriteString("\nRequests during the mark phase, by verb and resource:\n\n")
	for _, c := range cols {
		fmt.Fprintf(&b, "- %s: %s\n", c, verbs(byName[c].Mark.Stats))
	}
	b.WriteString("\nRequests during the one-Node phase:\n\n")
	for _, c := range cols {
		if byName[c].Single.Changed == 0 {
			fmt.Fprintf(&b, "- %s: not run\n", c)
			continue
		}
		fmt.Fprintf(&b, "- %s: %s\n", c, verbs(byName[c].Single.Stats))
	}
	for _, c := range cols {
		r := byName[c]
		for _, ph := range []struct {
			name  string
			phase Phase
		}{{"mark", r.Mark}, {"recover", r.Recover}, {"heartbeat", r.Heartbeat}, {"one Node", r.Single}} {
			if ph.phase.Unsettled {
				fmt.Fprintf(&b, "- %s: the controller was still busy 20 s after the %s batch; its counts and CPU are cut there\n", c, ph.name)
			}
		}
		if r.Single.Wrong > 0 {
			fmt.Fprintf(&b, "- %s: %d Machines marked in the one-Node phase that were not flipped\n", c, r.Single.Wrong)
		}
		if r.Mark.Overran {
			fmt.Fprintf(&b, "- %s: the Node batch (%.2f s) overran the expiry instant; latencies are from the batch's end\n", c, r.Mark.BatchDuration.Seconds())
		}
		if r.Mark.Wrong > 0 {
			fmt.Fprintf(&b, "- %s: %d Machines marked that were not flipped\n", c, r.Mark.Wrong)
		}
	}
	return b.String()
}

func markedOrNot(ph Phase, d time.Duration) (float64, string) {
	if ph.Done < ph.Changed {
		return d.Seconds(), fmt.Sprintf("%d/%d after %.0f s", ph.Done, ph.Changed, d.Seconds())
	}
	return d.Seconds(), fmt.Sprintf("%.2f", d.Seconds())
}

// ran formats v for a phase that ran, "-" for one that did not (an earlier phase did not finish).
func ran(ph Phase, v float64, format string) (float64, string) {
	if ph.Changed == 0 {
		return 0, "-"
	}
	return v, fmt.Sprintf(format, v)
}

func mib(b uint64) (float64, string) {
	v := float64(b) / (1 << 20)
	return v, fmt.Sprintf("%.0f", v)
}

// verbs lists the requests by verb and resource with their mean round trip.
func verbs(s Stats) string {
	keys := make([]string, 0, len(s.Requests))
	for k := range s.Requests {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		n := s.Requests[k]
		if strings.HasPrefix(k, "watch ") {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %d (%.0f ms)", k, n, 1000*s.LatencySeconds[k]/float64(n)))
	}
	return strings.Join(parts, ", ")
}

// isEventWrite reports whether a request key is an event written ("create events (reporter)").
func isEventWrite(key string) bool {
	_, resource, _ := strings.Cut(key, " ")
	return isWrite(key) && (resource == "events" || strings.HasPrefix(resource, "events ("))
}

// byHealthChecker reports whether a request key is the health checker's: in CAPI's process every
// request (it runs the MachineHealthCheck reconciler alone); in CAPR's, which also runs the
// remediators, what the health checker writes: Machines, health checks, the creation and withdrawal
// of MachineRemediations and its own events (not a request's status, nor the remediators' events);
// an event write that names no reporter is counted as its own.
func byHealthChecker(system, key string) bool {
	if system != "capr" {
		return true
	}
	verb, resource, _ := strings.Cut(key, " ")
	switch {
	case resource == "machines", strings.HasPrefix(resource, "machines/"),
		resource == "machinehealthchecks", strings.HasPrefix(resource, "machinehealthchecks/"):
		return true
	case resource == "machineremediations":
		return verb == "create" || verb == "delete"
	case resource == "events":
		return true // an event write that does not name its reporter is counted against the health checker
	case strings.HasPrefix(resource, "events ("):
		return resource == "events (capr-machinehealthcheck)"
	}
	return false
}
