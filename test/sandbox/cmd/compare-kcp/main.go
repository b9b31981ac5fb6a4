// Command compare-kcp runs each control-plane fault on the full stack (CAPI's core, kubeadm bootstrap
// and KubeadmControlPlane controllers and webhooks, kube-controller-manager, real etcd) --runs times
// per system: CAPI's MachineHealthCheck with KCP remediating as upstream does, and CAPR. It prints one
// table per scenario: completed or stalled, minimum etcd failure margin (running voting members minus
// quorum), seconds at margin 0 or below, time from the fault to the mark, to a healthy replacement
// and to full voting strength, Machines created, fenced before delete; with more than one run, the
// median and the range (min–max) of each time. It writes the tables, the machine, the commit and the
// date to a results file (--results), and with --docs rewrites the generated section of a document.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/capr-io/capr/test/sandbox"
)

// options are the command's flags.
type options struct {
	only    string
	timeout time.Duration
	runs    int
	results string
	docs    string
	kcpLog  string
}

func main() {
	os.Exit(compare())
}

func parseFlags() (options, error) {
	var o options
	flag.StringVar(&o.only, "scenario", "", "Run only the scenarios whose names contain one of these words, separated by commas without a space after them (a comma and a space are part of a word); a word starting with = must be the whole name (=member dead).")
	flag.DurationVar(&o.timeout, "timeout", 6*time.Minute, "Give up on a run (stalled) after this long.")
	flag.IntVar(&o.runs, "runs", 3, "Runs of each scenario per system; tables show the median and the range (min–max).")
	flag.StringVar(&o.results, "results", "test/bench/results", "Directory to write the results file to (<date>-<cores>cpu-<commit>-compare-kcp.md); empty: none.")
	flag.StringVar(&o.docs, "docs", "", "Markdown file whose generated compare-kcp section (between "+summaryBegin+"…"+" and "+summaryEnd+") is rewritten with this run's tables; needs --results.")
	flag.StringVar(&o.kcpLog, "kcp-log", "", "File to write KubeadmControlPlane's own log to (JSON lines, info level; each line names its KubeadmControlPlane, whose namespace names the run): what KCP did in a run that stalled.")
	flag.Parse()
	switch {
	case o.runs < 1:
		return o, fmt.Errorf("--runs must be at least 1, got %d", o.runs)
	case o.docs != "" && o.results == "":
		return o, errors.New("--docs needs --results: the document links the results file")
	}
	return o, nil
}

func compare() int {
	o, err := parseFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctrl.SetLogger(logr.Discard())
	ctx, stop := sandbox.InterruptContext()
	defer stop()
	env := describeEnvironment(o)
	capi := sandbox.CAPIOptions{MachineHealthCheck: true, Topology: true}
	if o.kcpLog != "" {
		f, err := os.Create(o.kcpLog)
		if err != nil {
			fmt.Fprintf(os.Stderr, "--kcp-log: %v\n", err)
			return 2
		}
		defer func() { _ = f.Close() }()
		capi.KCPLogger = zap.New(zap.WriteTo(f), zap.JSONEncoder(), zap.Level(zapcore.InfoLevel))
	}
	sb, err := sandbox.StartWithOptions(ctx, sandbox.Options{Provider: sandbox.ProviderKubeadm, CAPI: capi})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the full stack: %v\n", err)
		return 1
	}
	defer sb.Stop()
	fmt.Println(env.headline() + "\n")
	var outcomes []scenarioOutcome
	failed := false
	for i, sc := range scenarios {
		if !selected(sc.name, o.only) {
			continue
		}
		out := runScenario(ctx, sb, sc, i, o)
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "interrupted: stopping the full stack; no results are written")
			return 1
		}
		failed = failed || out.errors > 0
		fmt.Print(out.table())
		outcomes = append(outcomes, out)
	}
	if err := publish(env, o, outcomes); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if failed {
		return 1
	}
	return 0
}

// scenarioOutcome is every run of one scenario, by system (in the order of systems).
type scenarioOutcome struct {
	sc     scenario
	runs   [][]*run
	errors int
}

// runScenario runs a scenario o.runs times per system, the systems alternating (KCP, CAPR, KCP, ...)
// so that a change in the machine's load over the campaign falls on both alike.
func runScenario(ctx context.Context, sb *sandbox.Sandbox, sc scenario, i int, o options) scenarioOutcome {
	out := scenarioOutcome{sc: sc, runs: make([][]*run, len(systems))}
	for k := range o.runs {
		for j, sys := range systems {
			if ctx.Err() != nil {
				return out
			}
			ns := fmt.Sprintf("cmp-%d-%d", i, j)
			if o.runs > 1 {
				ns = fmt.Sprintf("cmp-%d-%d-%d", i, j, k)
			}
			r, err := runOnce(ctx, sb, sc, sys, ns, o.timeout)
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s / %s, run %d: %v\n", sc.name, sys, k+1, err)
				out.errors++
				continue
			}
			fmt.Fprintf(os.Stderr, "%s / %s, run %d of %d: %s\n", sc.name, sys, k+1, o.runs, r.brief())
			out.runs[j] = append(out.runs[j], r)
		}
	}
	return out
}

// scenarioWords splits --scenario at the commas not followed by a space: scenario names contain ", "
// ("topology, node not Ready, member healthy"), the list separates its words with ",".
func scenarioWords(only string) []string {
	var out []string
	start := 0
	for i := 0; i < len(only); i++ {
		if only[i] == ',' && (i+1 == len(only) || only[i+1] != ' ') {
			out = append(out, strings.TrimSpace(only[start:i]))
			start = i + 1
		}
	}
	return append(out, strings.TrimSpace(only[start:]))
}

func selected(name, only string) bool {
	if only == "" {
		return true
	}
	for _, w := range scenarioWords(only) {
		if exact, ok := strings.CutPrefix(w, "="); ok {
			if name == exact {
				return true
			}
			continue
		}
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}
