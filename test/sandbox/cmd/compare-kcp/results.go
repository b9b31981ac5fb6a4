package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// The markers around the summary (the tables over all runs) in a results file, and around its copy in
// a document, whose begin marker also names the results file (relative to the document):
// "<!-- compare-kcp summary begin: ../../test/bench/results/<name>.md -->". docs/docs_test.go checks
// that every such copy equals its results file's summary.
const (
	summaryBegin = "<!-- compare-kcp summary begin"
	summaryEnd   = "<!-- compare-kcp summary end -->"
)

// stack is what runs under test (the versions pinned in go.mod and hack/tools).
const stack = "CAPI v1.14.2 (KCP, CABPK, core), kube-apiserver and kube-controller-manager v1.36.3, etcd v3.6.14"

// environment is where and on what a campaign ran.
type environment struct {
	start   time.Time
	cores   int
	memory  string
	load    string
	commit  string
	dirty   bool
	command string
	runs    int
}

func describeEnvironment(o options) environment {
	e := environment{start: time.Now().UTC(), cores: runtime.NumCPU(), memory: memTotal(), load: loadAverage(), runs: o.runs}
	e.commit, e.dirty = gitCommit()
	e.command = "go run ./test/sandbox/cmd/compare-kcp"
	for _, a := range os.Args[1:] {
		if strings.ContainsAny(a, " '\"$`\\") {
			a = strconv.Quote(a) // as a shell reads it back, for these flags' values
		}
		e.command += " " + a
	}
	return e
}

// headline is the first line of the output, as before --runs.
func (e environment) headline() string {
	return fmt.Sprintf("compare-kcp, %s, %d cores, %s memory, commit %s; %s", e.start.Format("2006-01-02"), e.cores, e.memory, e.commitLabel(), stack)
}

func (e environment) commitLabel() string {
	if e.dirty {
		return e.commit + " with uncommitted changes (not only Markdown)"
	}
	return e.commit
}

// fileName is <date>-<cores>cpu-<commit>-compare-kcp.md, as test/bench/results/ names every report
// (docs/performance.md).
func (e environment) fileName() string {
	return fmt.Sprintf("%s-%dcpu-%s-compare-kcp.md", e.start.Format("2006-01-02"), e.cores, e.commit)
}

// summary is what a document embeds: where and how it was measured, then one table per scenario.
func (e environment) summary(outcomes []scenarioOutcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d run(s) per system, %s UTC; %d cores, %s memory, load average %s at the start; commit %s; %s.",
		e.runs, e.start.Format("2006-01-02 15:04"), e.cores, e.memory, e.load, e.commitLabel(), stack)
	if e.runs > 1 {
		b.WriteString(" Times: median (min–max) over the runs; margin: the worst run's; Machines created: median (max).")
	}
	b.WriteString("\n\n")
	for _, o := range outcomes {
		b.WriteString(o.table())
	}
	return strings.TrimSpace(b.String())
}

// report is the results file: the summary between its markers, then every run's table.
func (e environment) report(outcomes []scenarioOutcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# compare-kcp, %s\n\nCommand: `%s` (started %s UTC, finished %s UTC, load average %s at the end)\n\n",
		e.start.Format("2006-01-02"), e.command, e.start.Format("15:04"), time.Now().UTC().Format("15:04"), loadAverage())
	fmt.Fprintf(&b, "## Summary\n\n%s -->\n%s\n\n%s\n\n## Every run\n\n", summaryBegin, e.summary(outcomes), summaryEnd)
	for _, o := range outcomes {
		b.WriteString(o.everyRun())
	}
	return strings.TrimSpace(b.String()) + "\n"
}

// publish writes the results file and, with --docs, the document's generated section.
func publish(e environment, o options, outcomes []scenarioOutcome) error {
	if o.results == "" || len(outcomes) == 0 {
		return nil
	}
	if err := os.MkdirAll(o.results, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", o.results, err)
	}
	path := filepath.Join(o.results, e.fileName())
	if err := os.WriteFile(path, []byte(e.report(outcomes)), 0o600); err != nil {
		return fmt.Errorf("writing the results: %w", err)
	}
	fmt.Printf("results written to %s\n", path)
	if o.docs == "" {
		return nil
	}
	if err := embed(o.docs, path, e.summary(outcomes)); err != nil {
		return fmt.Errorf("updating %s: %w", o.docs, err)
	}
	fmt.Printf("%s updated\n", o.docs)
	return nil
}

// embed replaces the generated section of the document at docPath with a link to the results file and
// its summary.
func embed(docPath, resultsPath, summary string) error {
	doc, err := os.ReadFile(docPath)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(docPath), resultsPath)
	if err != nil {
		return err
	}
	rel = filepath.ToSlash(rel)
	out, err := replaceSection(string(doc), rel, summary)
	if err != nil {
		return err
	}
	return os.WriteFile(docPath, []byte(out), 0o600)
}

// replaceSection rewrites the one section from summaryBegin to summaryEnd: the begin marker naming
// rel, a visible link to it, the summary.
func replaceSection(doc, rel, summary string) (string, error) {
	begin := strings.Index(doc, summaryBegin)
	if begin < 0 || strings.Count(doc, summaryBegin) != 1 {
		return "", fmt.Errorf("want exactly one %q… line", summaryBegin)
	}
	end := strings.Index(doc[begin:], summaryEnd)
	if end < 0 {
		return "", fmt.Errorf("no %q after %q", summaryEnd, summaryBegin)
	}
	section := fmt.Sprintf("%s: %s -->\nGenerated by `make compare-kcp UPDATE_DOCS=1` from [`%s`](%s).\n\n%s\n\n",
		summaryBegin, rel, filepath.Base(rel), rel, summary)
	return doc[:begin] + section + doc[begin+end:], nil
}

// gitCommit is HEAD's short hash and whether tracked files other than Markdown differ from it: the
// docs do not change what is measured, and --docs rewrites one.
func gitCommit() (string, bool) {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown", false
	}
	status, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)*.md").Output()
	return strings.TrimSpace(string(out)), len(bytes.TrimSpace(status)) > 0
}

// memTotal is MemTotal from /proc/meminfo, in GiB.
func memTotal() string {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			if kib, err := strconv.ParseFloat(fields[1], 64); err == nil {
				return fmt.Sprintf("%.1f GiB", kib/(1<<20))
			}
		}
	}
	return "unknown"
}

// loadAverage is the 1, 5 and 15 minute load averages from /proc/loadavg: the machine is shared.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if fields := strings.Fields(string(data)); err == nil && len(fields) >= 3 {
		return strings.Join(fields[:3], " ")
	}
	return "unknown"
}
