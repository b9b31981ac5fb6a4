package envtest

import (
	"bytes"
	"fmt"
	"runtime/pprof"
	"strings"
)

// StuckReconciles describes, compactly, the goroutines that are inside a controller's Reconcile: the
// function names of their stacks, innermost first, without file lines. A suite prints it when its
// manager outlives the graceful-shutdown timeout, so that the few lines a CI log shows name what the
// in-flight reconcile was blocked on.
func StuckReconciles() string {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
		return fmt.Sprintf("cannot dump goroutines: %v", err)
	}
	var out strings.Builder
	n := 0
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if !strings.Contains(g, "reconcileHandler") {
			continue
		}
		n++
		lines := strings.Split(g, "\n")
		fmt.Fprintf(&out, "stuck reconcile %d: %s\n", n, lines[0])
		frames := 0
		for _, l := range lines[1:] {
			if l == "" || strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "created by") || frames >= 14 {
				continue // file:line, creator, or deep frames
			}
			if i := strings.LastIndex(l, "("); i > 0 {
				l = l[:i] // drop the arguments
			}
			fmt.Fprintf(&out, "  %s\n", l)
			frames++
		}
	}
	if n == 0 {
		return "no goroutine is inside a Reconcile"
	}
	return out.String()
}
