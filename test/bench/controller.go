package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	_ "net/http/pprof" //nolint:gosec // the controller process serves pprof on 127.0.0.1 for profiling benchmark runs
	"os"
	"os/signal"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/capr-io/capr/controllers"
	capienv "github.com/capr-io/capr/test/envtest"
)

// Environment variables that turn a benchmark binary into a controller process (ControllerMain).
const (
	envController = "CAPR_BENCH_CONTROLLER" // "capr" or "capi"
	envKubeconfig = "CAPR_BENCH_KUBECONFIG"
	envQPS        = "CAPR_BENCH_QPS"
	envBurst      = "CAPR_BENCH_BURST"
	envRateLimit  = "CAPR_BENCH_CAPI_RATE_LIMIT" // "on" or "off" (CAPI's ReconcilerRateLimiting)
	envWorkers    = "CAPR_BENCH_WORKERS"
	envCPUProfile = "CAPR_BENCH_CPUPROFILE"
)

// IsControllerProcess reports whether this process was started as a benchmark controller process.
func IsControllerProcess() bool { return os.Getenv(envController) != "" }

// Stats is what a controller process reports about itself since the last reset.
type Stats struct {
	// Requests counts API requests by "verb resource[/subresource]", counted at the transport.
	Requests map[string]int `json:"requests"`
	// LatencySeconds sums the round-trip times of Requests, by the same keys.
	LatencySeconds map[string]float64 `json:"latencySeconds"`
	CPUSeconds     float64            `json:"cpuSeconds"`
	// PeakHeapBytes is the highest live heap (runtime/metrics heap objects) sampled every 10 ms.
	PeakHeapBytes uint64 `json:"peakHeapBytes"`
	// Reconciles counts the health-check controller's reconciles (controller-runtime's
	// reconcile_total of CAPR's capr-machinehealthcheck or CAPI's machinehealthcheck).
	Reconciles int `json:"reconciles"`
	// TargetsEvaluated counts the targets CAPR's health-check rounds evaluated
	// (capr_machinehealthcheck_targets_evaluated_total, every pass); CAPI has no such count.
	TargetsEvaluated int `json:"targetsEvaluated"`
}

// ControllerMain runs the controller selected by the environment until SIGTERM and returns the
// process exit code. It prints "BENCH_ADDR=<host:port>" on stdout: the address of its stats and
// pprof server.
func ControllerMain() int {
	if err := runController(); err != nil {
		fmt.Fprintf(os.Stderr, "bench controller: %v\n", err)
		return 1
	}
	return 0
}

func runController() error {
	level := zapcore.ErrorLevel
	if os.Getenv("BENCH_CONTROLLER_VERBOSE") != "" {
		level = zapcore.InfoLevel
	}
	ctrl.SetLogger(zap.New(zap.Level(level), zap.UseDevMode(os.Getenv("BENCH_CONTROLLER_VERBOSE") != "")))
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()

	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv(envKubeconfig))
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	qps, err := strconv.ParseFloat(os.Getenv(envQPS), 32)
	if err != nil {
		return fmt.Errorf("parsing %s: %w", envQPS, err)
	}
	burst, err := strconv.Atoi(os.Getenv(envBurst))
	if err != nil {
		return fmt.Errorf("parsing %s: %w", envBurst, err)
	}
	workers, err := strconv.Atoi(os.Getenv(envWorkers))
	if err != nil {
		return fmt.Errorf("parsing %s: %w", envWorkers, err)
	}
	cfg.QPS, cfg.Burst = float32(qps), burst
	counter := newRequestCounter()
	cfg.Wrap(counter.wrap)

	s := newStatsServer(counter)
	ln, err := capienv.Listen()
	if err != nil {
		return fmt.Errorf("listening for stats: %w", err)
	}
	go s.sampleHeap(ctx)
	srv := &http.Server{Handler: s.mux(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()

	var mgr ctrl.Manager
	switch c := os.Getenv(envController); c {
	case "capr":
		mgr, err = caprManager(ctx, cfg, workers)
	case "capi":
		mgr, err = capienv.CAPIMachineHealthCheckManager(ctx, cfg, workers, os.Getenv(envRateLimit) != "off")
	default:
		err = fmt.Errorf("unknown controller %q", c)
	}
	if err != nil {
		return err
	}
	fmt.Printf("BENCH_ADDR=%s\n", ln.Addr())
	defer pprof.StopCPUProfile() // a run that ends before its second phase
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

// caprManager is CAPR's manager as main.go builds it.
func caprManager(ctx context.Context, cfg *rest.Config, workers int) (ctrl.Manager, error) {
	scheme, err := controllers.NewScheme()
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + "/" + controllers.ControllerName
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		Cache:                   controllers.ManagerCacheOptions(scheme, "", 10*time.Minute),
		Client:                  controllers.ManagerClientOptions(),
		GracefulShutdownTimeout: ptr.To(2 * time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("creating CAPR's manager: %w", err)
	}
	if _, err := controllers.SetupWithManager(ctx, mgr, controllers.Options{
		HealthCheckConcurrency:  workers,
		ConnectionRetryInterval: 2 * time.Second,
	}); err != nil {
		return nil, err
	}
	return mgr, nil
}

// requestCounter counts requests by verb and resource at the transport.
type requestCounter struct {
	mu      sync.Mutex
	counts  map[string]int
	latency map[string]float64
}

func newRequestCounter() *requestCounter {
	return &requestCounter{counts: map[string]int{}, latency: map[string]float64{}}
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		key := requestKey(req)
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		c.mu.Lock()
		c.counts[key]++
		if !strings.HasPrefix(key, "watch ") {
			c.latency[key] += time.Since(start).Seconds()
		}
		c.mu.Unlock()
		return resp, err
	})
}

func (c *requestCounter) snapshot() (map[string]int, map[string]float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	counts := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		counts[k] = v
	}
	latency := make(map[string]float64, len(c.latency))
	for k, v := range c.latency {
		latency[k] = v
	}
	return counts, latency
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// requestKey is "verb resource[/subresource]" of a Kubernetes API request, e.g. "patch machines/status";
// an event write also names the controller that reports it, "create events (capr-machinehealthcheck)".
func requestKey(req *http.Request) string {
	path := strings.Trim(req.URL.Path, "/")
	seg := strings.Split(path, "/")
	switch {
	case len(seg) >= 2 && seg[0] == "api":
		seg = seg[2:]
	case len(seg) >= 3 && seg[0] == "apis":
		seg = seg[3:]
	default:
		return strings.ToLower(req.Method) + " " + path
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		seg = seg[2:]
	}
	if len(seg) == 0 {
		return strings.ToLower(req.Method) + " discovery"
	}
	resource, named := seg[0], len(seg) >= 2
	if len(seg) >= 3 {
		resource += "/" + seg[2]
	}
	verb := strings.ToLower(req.Method)
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	}
	key := verb + " " + resource
	if resource == "events" && (verb == "create" || verb == "patch") {
		if by := eventReporter(req); by != "" {
			key += " (" + by + ")"
		}
	}
	return key
}

// eventReporter is the controller that reports an event being written (events.k8s.io/v1
// reportingController, or core/v1 source.component), read from a copy of the request body: JSON,
// or a protobuf body that names one of the known reporters. Empty when the body does not say (an
// aggregating patch).
func eventReporter(req *http.Request) string {
	if req.GetBody == nil {
		return ""
	}
	body, err := req.GetBody()
	if err != nil {
		return ""
	}
	defer func() { _ = body.Close() }()
	raw, err := io.ReadAll(body)
	if err != nil {
		return ""
	}
	var ev struct {
		ReportingController string `json:"reportingController"`
		Source              struct {
			Component string `json:"component"`
		} `json:"source"`
	}
	if json.Unmarshal(raw, &ev) == nil {
		return cmp.Or(ev.ReportingController, ev.Source.Component)
	}
	for _, name := range knownReporters {
		if bytes.Contains(raw, []byte(name)) {
			return name
		}
	}
	return ""
}

// knownReporters are the event reporters of both systems (CAPR's recorders, CAPI's
// MachineHealthCheck controller), longest first so that none is taken for a prefix of another.
var knownReporters = []string{"capr-controlplane-remediation", "machinehealthcheck-controller", "capr-worker-remediation", "capr-machinehealthcheck"}

// statsServer serves /stats, /reset and /debug/pprof.
type statsServer struct {
	counter *requestCounter

	mu                  sync.Mutex
	base                map[string]int
	baseLat             map[string]float64
	baseCPU             float64
	baseRec             int
	baseEval            int
	peakHeap            uint64
	profiling, profiled bool
}

func newStatsServer(c *requestCounter) *statsServer {
	return &statsServer{counter: c, base: map[string]int{}}
}

func (s *statsServer) mux() *http.ServeMux {
	m := http.NewServeMux()
	m.Handle("/debug/pprof/", http.DefaultServeMux)
	m.HandleFunc("/reset", s.reset)
	m.HandleFunc("/stats", s.stats)
	return m
}

func heapBytes() uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return sample[0].Value.Uint64()
}

func (s *statsServer) sampleHeap(ctx context.Context) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h := heapBytes()
			s.mu.Lock()
			if h > s.peakHeap {
				s.peakHeap = h
			}
			s.mu.Unlock()
		}
	}
}

// healthCheckReconciles sums controller-runtime's reconcile_total (every result) of the
// health-check controller, whichever system runs.
func healthCheckReconciles() int {
	return int(sumCounter("controller_runtime_reconcile_total", func(name, value string) bool {
		return name == "controller" && (value == "capr-machinehealthcheck" || value == "machinehealthcheck")
	}))
}

// targetsEvaluated sums capr_machinehealthcheck_targets_evaluated_total (0 in CAPI's process).
func targetsEvaluated() int {
	return int(sumCounter("capr_machinehealthcheck_targets_evaluated_total", nil))
}

// sumCounter sums the series of counter family whose labels include one that match accepts (every
// series when match is nil).
func sumCounter(family string, match func(name, value string) bool) float64 {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return 0
	}
	n := 0.0
	for _, f := range families {
		if f.GetName() != family {
			continue
		}
		for _, m := range f.GetMetric() {
			if match == nil {
				n += m.GetCounter().GetValue()
				continue
			}
			for _, l := range m.GetLabel() {
				if match(l.GetName(), l.GetValue()) {
					n += m.GetCounter().GetValue()
					break
				}
			}
		}
	}
	return n
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// reset starts a measurement: counts and CPU from now, peak heap from the current heap. With
// CAPR_BENCH_CPUPROFILE set, the first reset also starts a CPU profile, which the second one ends:
// the whole mark phase, its settling included.
func (s *statsServer) reset(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.base, s.baseLat = s.counter.snapshot()
	s.baseCPU = cpuSeconds()
	s.baseRec = healthCheckReconciles()
	s.baseEval = targetsEvaluated()
	s.peakHeap = heapBytes()
	switch path := os.Getenv(envCPUProfile); {
	case s.profiling:
		pprof.StopCPUProfile()
		s.profiling, s.profiled = false, true
	case path != "" && !s.profiled:
		f, err := os.Create(path)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s.profiling = true
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *statsServer) stats(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, lat := s.counter.snapshot()
	out := Stats{Requests: map[string]int{}, LatencySeconds: map[string]float64{}, CPUSeconds: cpuSeconds() - s.baseCPU, PeakHeapBytes: s.peakHeap,
		Reconciles: healthCheckReconciles() - s.baseRec, TargetsEvaluated: targetsEvaluated() - s.baseEval}
	for k, v := range now {
		if d := v - s.base[k]; d > 0 {
			out.Requests[k] = d
			out.LatencySeconds[k] = lat[k] - s.baseLat[k]
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil && !errors.Is(err, http.ErrHandlerTimeout) {
		return
	}
}
