// Package docs holds CAPR's documentation (the Markdown files in this folder) and the tests that
// keep it honest: every condition and event reason has an entry in operations/runbook.md, and
// every relative link and anchor in the Markdown files resolves. The package has no code of its
// own; its tests are pure (no binaries) and run in `make unit`.
package docs
