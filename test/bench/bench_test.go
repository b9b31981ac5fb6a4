package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func TestMain(m *testing.M) {
	if IsControllerProcess() {
		os.Exit(ControllerMain())
	}
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel)))
	os.Exit(m.Run())
}

// defaultSizes are the fleet sizes when BENCH_SIZES is unset (the Makefile's default too).
const defaultSizes = "500,2000,10000"

// workers is MaxConcurrentReconciles of both health checkers (both ship with 10).
const workers = 10

// BenchmarkHealthCheck runs every variant on a fresh fleet per size and shape and writes the tables
// to test/bench/results/<date>-<cores>cpu.md. Sizes: BENCH_SIZES (default 500,2000,10000); shapes:
// BENCH_SHAPES, "one" (one health check over all Machines) and/or "many" (N/100 health checks);
// BENCH_VARIANTS names the variants (default: every one but the extra; e.g. "CAPR defaults,CAPI
// unlimited,CAPR at 100 QPS"); BENCH_PROFILE_DIR receives a CPU profile of each controller process
// over its mark phase (until the recovery starts), and one of kube-apiserver over the first two seconds after the mark
// phase's expiry (<variant>-<N>-<health checks>-apiserver.pprof); BENCH_ALL_PHASES=1 runs the
// heartbeat and one-Node phases for CAPI's defaults too (about a minute more per size).
func BenchmarkHealthCheck(b *testing.B) {
	sizes := intList(b, envOr("BENCH_SIZES", defaultSizes))
	shapes := strings.Split(envOr("BENCH_SHAPES", "one"), ",")
	variants := selectVariants(b, os.Getenv("BENCH_VARIANTS"))
	ctx := context.Background()
	var report strings.Builder
	fmt.Fprintf(&report, "# Health-check benchmark, %s, %d CPUs (%s)\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		runtime.NumCPU(), runtime.Version())
	cmd := fmt.Sprintf("make bench BENCH_SIZES=%s BENCH_SHAPES=%s", envOr("BENCH_SIZES", defaultSizes), envOr("BENCH_SHAPES", "one"))
	if v := os.Getenv("BENCH_VARIANTS"); v != "" {
		cmd += fmt.Sprintf(" BENCH_VARIANTS=%q", v)
	}
	if os.Getenv("BENCH_ALL_PHASES") != "" {
		cmd += " BENCH_ALL_PHASES=1"
	}
	fmt.Fprintf(&report, "Command: `%s`\n\n", cmd)
	for range b.N {
		for _, n := range sizes {
			for _, shape := range shapes {
				hcs := 1
				if shape == "many" {
					hcs = max(n/100, 1)
				}
				built := time.Now()
				image, err := BuildFleetImage(ctx, n, hcs)
				if err != nil {
					b.Fatalf("N=%d: building the fleet: %v", n, err)
				}
				progress("N=%d, %d health check(s): fleet built in %s", n, hcs, time.Since(built).Round(time.Second))
				results := make([]*Result, 0, len(variants))
				for _, v := range variants {
					began := time.Now()
					cfg := Config{Image: image, Machines: n, HealthChecks: hcs, Variant: v, Workers: workers, Log: progress,
						AllPhases: os.Getenv("BENCH_ALL_PHASES") != ""}
					if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
						if err := os.MkdirAll(dir, 0o755); err != nil {
							b.Fatalf("BENCH_PROFILE_DIR: %v", err)
						}
						base := filepath.Join(dir, fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(v.Name, " ", "-"), n, hcs))
						cfg.CPUProfile, cfg.ServerProfile = base+".pprof", base+"-apiserver.pprof"
					}
					r, err := Run(ctx, cfg)
					if err != nil {
						image.Remove()
						b.Fatalf("N=%d %s: %v", n, v.Name, err)
					}
					progress("N=%d %s: run took %s", n, v.Name, time.Since(began).Round(time.Second))
					results = append(results, r)
					b.ReportMetric(r.Mark.Max.Seconds(), fmt.Sprintf("s-last-mark-%d-%d-%s", n, hcs, strings.ReplaceAll(v.Name, " ", "-")))
				}
				floor, err := MeasureFloor(ctx, image)
				image.Remove()
				if err != nil {
					b.Fatalf("N=%d: measuring the floor: %v", n, err)
				}
				progress("N=%d: floor %s by server-side apply, %s by merge patch", n, floor.Apply.Round(time.Millisecond), floor.MergePatch.Round(time.Millisecond))
				table := Table(results) + "\n" + floor.Line(results)
				fmt.Println("\n" + table)
				report.WriteString(table + "\n")
			}
		}
	}
	dir := envOr("BENCH_RESULTS_DIR", "results")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatalf("creating %s: %v", dir, err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%dcpu.md", time.Now().UTC().Format("2006-01-02"), runtime.NumCPU()))
	if err := os.WriteFile(path, []byte(report.String()), 0o600); err != nil {
		b.Fatalf("writing %s: %v", path, err)
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	fmt.Printf("results written to %s\n", path)
}

// TestSmoke runs the harness at N=20 with both systems unlimited: every flipped Machine is marked and
// cleared, nothing else is marked. It checks the harness, not speed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts envtest")
	}
	for _, v := range selectVariants(t, "CAPI unlimited,CAPR defaults") {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			r, err := Run(context.Background(), Config{Machines: 20, HealthChecks: 1, Variant: v, Workers: workers, Log: t.Logf})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Mark.Done).To(Equal(2))
			g.Expect(r.Mark.Wrong).To(BeZero())
			g.Expect(r.Recover.Done).To(Equal(2))
			g.Expect(r.Single.Stats.Reconciles).To(BeNumerically(">", 0))
			if v.System == "capr" {
				// A heartbeat starts no round (CAPI's predicate lets it through).
				g.Expect(r.Heartbeat.Stats.Reconciles).To(BeZero())
				g.Expect(r.Heartbeat.Stats.Requests).To(BeEmpty())
				// The health checker's events are told from the remediators' (its writes per mark).
				g.Expect(r.Mark.Stats.Requests).To(HaveKeyWithValue("create events (capr-machinehealthcheck)", 2))
				// One changed Node is evaluated without the other 19 targets.
				g.Expect(r.Single.Stats.TargetsEvaluated).To(And(BeNumerically(">", 0), BeNumerically("<", 20)))
			}
			g.Expect(r.Single.Done).To(Equal(1))
			g.Expect(r.Single.Wrong).To(BeZero())
			g.Expect(total(r.Mark.Stats.Requests, isWrite)).To(BeNumerically(">", 0))
			t.Log("\n" + Table([]*Result{r}))
		})
	}
}

// TestFloor measures the floor at N=20: both writes land on the Machines the mark phase flips (and
// their neighbours), and the wall time and CPU are counted.
func TestFloor(t *testing.T) {
	if testing.Short() {
		t.Skip("starts envtest")
	}
	g := NewWithT(t)
	ctx := context.Background()
	image, err := BuildFleetImage(ctx, 20, 1)
	g.Expect(err).NotTo(HaveOccurred())
	defer image.Remove()
	fl, err := MeasureFloor(ctx, image)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fl.Writes).To(Equal(2))
	g.Expect(fl.Apply).To(BeNumerically(">", 0))
	g.Expect(fl.MergePatch).To(BeNumerically(">", 0))
	g.Expect(fl.ApplyServerCPU + fl.MergePatchServerCPU).To(BeNumerically(">", 0))
	line := fl.Line([]*Result{{Config: Config{Variant: Variants[2]}, Mark: Phase{Changed: 2, Done: 2, Max: 2 * min(fl.Apply, fl.MergePatch)}}})
	g.Expect(line).To(ContainSubstring("Last mark, CAPR defaults: 2.0× the floor."))
}

// progress prints a line on stderr as it happens (the testing package holds a benchmark's log until
// it ends, and truncates it).
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05")+" "+format+"\n", args...)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func intList(tb testing.TB, s string) []int {
	fields := strings.Split(s, ",")
	out := make([]int, 0, len(fields))
	for _, f := range fields {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 10 {
			tb.Fatalf("invalid size %q in %q (at least 10 Machines)", f, s)
		}
		out = append(out, n)
	}
	return out
}

func selectVariants(tb testing.TB, names string) []Variant {
	var out []string
	known := make([]string, 0, len(Variants))
	for _, v := range Variants {
		known = append(known, v.Name)
	}
	if names == "" {
		var def []Variant
		for _, v := range Variants {
			if !v.Extra {
				def = append(def, v)
			}
		}
		return def
	}
	var selected []Variant
	for _, name := range strings.Split(names, ",") {
		found := false
		for _, v := range Variants {
			if strings.EqualFold(v.Name, strings.TrimSpace(name)) {
				selected = append(selected, v)
				found = true
			}
		}
		if !found {
			out = append(out, name)
		}
	}
	if len(out) > 0 {
		tb.Fatalf("unknown variant(s) %q (known: %s)", out, strings.Join(known, ", "))
	}
	return selected
}

// TestFlipSetIsATenthOfEveryHealthCheck: the mark phase flips 10 % of the Machines, and 10 % of
// each health check's, in both shapes at every default size.
func TestFlipSetIsATenthOfEveryHealthCheck(t *testing.T) {
	for _, machines := range []int{20, 500, 2000, 10000} {
		for _, healthChecks := range []int{1, max(1, machines/100)} {
			g := NewWithT(t)
			targets, flipped := map[int]int{}, map[int]int{}
			for i := range machines {
				targets[poolOf(i, machines, healthChecks)]++
			}
			for _, i := range flipSet(machines) {
				flipped[poolOf(i, machines, healthChecks)]++
			}
			g.Expect(targets).To(HaveLen(healthChecks), "N=%d, %d health checks", machines, healthChecks)
			for pool, n := range targets {
				g.Expect(flipped[pool]*10).To(Equal(n), "N=%d, %d health checks, pool %d", machines, healthChecks, pool)
			}
		}
	}
}
