package envtest

import (
	"bytes"
	"fmt"
	"runtime/pprof"
	"strings"
)

// StuckWorkers describes, compactly, the goroutines of controller workers that have not returned: the
// function names of their stacks, innermost first, without file lines, each distinct stack once with
// the number of goroutines on it. A suite prints it when its manager outlives the graceful-shutdown
// timeout, so that the few lines a CI log shows name what the workers were blocked on: a Reconcile's
// call, or the work queue itself (see controllers.controllerOptions).
func StuckWorkers() string {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
		return fmt.Sprintf("cannot dump goroutines: %v", err)
	}
	var order []string
	count := map[string]int{}
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if !strings.Contains(g, "processNextWorkItem") {
			continue
		}
		var stack strings.Builder
		frames := 0
		for _, l := range strings.Split(g, "\n")[1:] {
			if l == "" || strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "created by") || frames >= 14 {
				continue // file:line, creator, or deep frames
			}
			if i := strings.LastIndex(l, "("); i > 0 {
				l = l[:i] // drop the arguments
			}
			fmt.Fprintf(&stack, "  %s\n", l)
			frames++
		}
		if count[stack.String()] == 0 {
			order = append(order, stack.String())
		}
		count[stack.String()]++
	}
	if len(order) == 0 {
		return "no controller worker is left"
	}
	var out strings.Builder
	for i, s := range order {
		fmt.Fprintf(&out, "stuck workers, stack %d (%d goroutines):\n%s", i+1, count[s], s)
	}
	return out.String()
}
