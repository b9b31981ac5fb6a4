// Package bench measures CAPR's health checker side by side with CAPI's MachineHealthCheck
// reconciler: the same envtest API server, a fresh fleet of N worker Machines with Nodes per run,
// each controller in its own process, 10 % of the Nodes turned Ready=False in one batch with
// timeouts that expire at a known instant, then turned Ready again. `make bench` runs it.
package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	v1beta1conditions "sigs.k8s.io/cluster-api/util/conditions/deprecated/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	capienv "github.com/capr-io/capr/test/envtest"
)

// Variant is one controller configuration under test.
type Variant struct {
	Name   string
	System string // "capr" or "capi"
	// QPS and Burst are the controller's client-side rate limit (QPS < 0: none).
	QPS   float32
	Burst int
	// RateLimiting is CAPI's ReconcilerRateLimiting (15 s per MachineHealthCheck).
	RateLimiting bool
	// Extra variants run only when BENCH_VARIANTS names them.
	Extra bool
}

// Unlimited reports whether the variant has neither a client-side limit nor CAPI's rate limiting.
func (v Variant) Unlimited() bool { return v.QPS < 0 && !v.RateLimiting }

// Variants are the shipped defaults of both systems and CAPI with every limit off; CAPR's defaults
// set no limit (controllers.DefaultKubeAPIQPS), so they are also CAPR unlimited. The extra variant
// is CAPR with CAPI's managers' client-side limit.
var Variants = []Variant{
	{Name: "CAPI defaults", System: "capi", QPS: 100, Burst: 200, RateLimiting: true},
	{Name: "CAPI unlimited", System: "capi", QPS: -1, Burst: 0},
	{Name: "CAPR defaults", System: "capr", QPS: controllers.DefaultKubeAPIQPS, Burst: controllers.DefaultKubeAPIBurst},
	{Name: "CAPR at 100 QPS", System: "capr", QPS: 100, Burst: 200, Extra: true},
}

// Config is one run: a fleet shape and a variant.
type Config struct {
	// Image is the fleet the run starts from (a copy of it); nil builds one for this run alone.
	Image        *FleetImage
	Machines     int
	HealthChecks int // Machines are split evenly over this many health checks
	Variant      Variant
	// Workers is MaxConcurrentReconciles of the health-check controller (both systems' default: 10).
	Workers int
	// CPUProfile, when set, receives a CPU profile of the controller process over the mark phase (until
	// the recovery starts).
	CPUProfile string
	// ServerProfile, when set, receives a CPU profile of kube-apiserver (etcd not included) over the
	// first serverProfileWindow after the mark phase's expiry: where the API server's time goes.
	ServerProfile string
	// AllPhases runs the heartbeat and one-Node phases for a rate-limited variant too (CAPI's
	// defaults), which otherwise stops after the recovery.
	AllPhases bool
	// Log receives progress lines.
	Log func(format string, args ...any)
}

// Phase is the measurement of one batch (marking or recovery).
type Phase struct {
	// Changed is how many Machines the batch affected; Done how many reached the expected state.
	Changed, Done int
	// Latencies are per Machine, from the reference instant to the Machine showing the state.
	P50, P99, Max time.Duration
	// BatchDuration is how long the harness took to write the Node updates.
	BatchDuration time.Duration
	// Requested is how many of the Machines had their remediation requested, the last LastRequest
	// after the reference instant (marking only).
	Requested   int
	LastRequest time.Duration
	// Expiry is the instant the timeouts expire (marking only).
	Expiry time.Time
	// Overran says the batch was still being written at the reference instant (marking only).
	Overran bool
	Stats   Stats
	// ServerCPUSeconds is the CPU time of kube-apiserver and etcd during the phase (harness load
	// included: the batch of Node updates).
	ServerCPUSeconds float64
	// Wrong counts Machines that reached a state they should not (a healthy Machine marked).
	Wrong int
	// Unsettled says the controller was still busy when the phase's measurement ended (20 s after
	// the batch): its counts and CPU are cut there.
	Unsettled bool
}

// Result is one run.
type Result struct {
	Config  Config
	Mark    Phase
	Recover Phase
	// Heartbeat is every Node's kubelet report with nothing changed but lastHeartbeatTime: what a
	// fleet sends all the time, and what must cost (next to) nothing.
	Heartbeat Phase
	// Single is one more Node turning unhealthy, alone: the cost of one change in a fleet of N.
	Single Phase
	// Setup is the time from starting the controller to every target reported healthy.
	Setup time.Duration
}

const (
	// conditionTimeout is the health checks' timeout for Ready=False / Ready=Unknown.
	conditionTimeout = 300 * time.Second
	// phaseTimeout bounds each phase; a phase that does not finish reports how far it got.
	phaseTimeout = 3 * time.Minute
	// fleetWorkers is the parallelism of the harness's own writes.
	fleetWorkers = 16
)

// Run starts a fresh envtest API server on a copy of the fleet image (built here when cfg.Image is
// nil), starts the controller process, and measures.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	logf := func(string, ...any) {}
	if cfg.Log != nil {
		began := time.Now()
		logf = func(format string, args ...any) {
			cfg.Log("[%6.1fs] "+format, append([]any{time.Since(began).Seconds()}, args...)...)
		}
	}
	image := cfg.Image
	if image == nil {
		built, err := BuildFleetImage(ctx, cfg.Machines, cfg.HealthChecks)
		if err != nil {
			return nil, err
		}
		defer built.Remove()
		image = built
	}
	if image.Machines != cfg.Machines || image.HealthChecks != cfg.HealthChecks {
		return nil, fmt.Errorf("the fleet image has %d Machines in %d pools, the run wants %d in %d", image.Machines, image.HealthChecks,
			cfg.Machines, cfg.HealthChecks)
	}
	data, err := image.copy()
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(data) }()
	env, err := capienv.Start(capienv.Options{EtcdDataDir: data})
	if err != nil {
		return nil, err
	}
	defer func() { _ = env.Stop() }()
	env.Config.QPS, env.Config.Burst = -1, 0
	c, err := client.New(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	f, err := openFleet(ctx, env, c, cfg, image)
	if err != nil {
		return nil, err
	}
	logf("%s: API server started on the fleet image (%d Machines), %d health check(s) created", cfg.Variant.Name, cfg.Machines, cfg.HealthChecks)

	obs, err := newObserver(ctx, env, f.ns, cfg.Variant.System)
	if err != nil {
		return nil, err
	}
	defer obs.stop()

	start := time.Now()
	proc, err := startController(ctx, env, cfg)
	if err != nil {
		return nil, err
	}
	defer proc.stop()
	res := &Result{Config: cfg}
	if err := f.waitReady(ctx, phaseTimeout); err != nil {
		return nil, fmt.Errorf("%s: waiting for every target to be reported healthy: %w", cfg.Variant.Name, err)
	}
	res.Setup = time.Since(start)
	logf("%s: controller ready, every target healthy after %s", cfg.Variant.Name, res.Setup.Round(time.Millisecond))

	flipped := f.flipSet()
	if res.Mark, err = f.markPhase(ctx, obs, proc, flipped); err != nil {
		return nil, err
	}
	logf("%s: marked %d/%d, last %s after the expiry at %s", cfg.Variant.Name, res.Mark.Done, res.Mark.Changed, res.Mark.Max.Round(time.Millisecond),
		res.Mark.Expiry.Format("15:04:05.000"))
	if res.Mark.Done == res.Mark.Changed {
		if res.Recover, err = f.recoverPhase(ctx, obs, proc, flipped); err != nil {
			return nil, err
		}
		logf("%s: cleared %d/%d, last %s", cfg.Variant.Name, res.Recover.Done, res.Recover.Changed, res.Recover.Max.Round(time.Millisecond))
	}
	if res.Recover.Changed == 0 || res.Recover.Done < res.Recover.Changed {
		return res, nil // the later phases start from a healthy fleet
	}
	if cfg.Variant.RateLimiting && !cfg.AllPhases {
		// With CAPI's rate limit each of the two later phases takes over 30 s at every size (its
		// 15 s per health check twice over), for what CAPI without the limit shows in a few
		// seconds: the same work, delayed.
		return res, nil
	}
	// Work deferred from the phases before (CAPI's 15 s rate limit) must not be charged to the next
	// phase.
	idle, err := proc.drain(ctx, cfg.Variant.deferral())
	if err != nil {
		return nil, err
	}
	if res.Heartbeat, err = f.heartbeatPhase(ctx, proc, idle); err != nil {
		return nil, err
	}
	logf("%s: heartbeats of %d Nodes, controller CPU %.2f s", cfg.Variant.Name, res.Heartbeat.Changed, res.Heartbeat.Stats.CPUSeconds)
	if _, err := proc.drain(ctx, cfg.Variant.deferral()); err != nil {
		return nil, err
	}
	if res.Single, err = f.markPhase(ctx, obs, proc, []int{singleNode}); err != nil {
		return nil, err
	}
	logf("%s: one Node: marked %d/1 after %s, controller CPU %.3f s", cfg.Variant.Name, res.Single.Done, res.Single.Max.Round(time.Millisecond),
		res.Single.Stats.CPUSeconds)
	return res, nil
}

// fleet is one namespace with a Cluster, its Machines and Nodes and the health checks.
type fleet struct {
	c       client.Client
	server  *rest.Config // cluster-admin, for the API server's profile
	cfg     Config
	ns      string
	cluster *clusterv1.Cluster
}

func machineName(i int) string { return fmt.Sprintf("m-%05d", i) }

func (f *fleet) nodeName(i int) string { return f.ns + "-" + machineName(i) }

// openFleet connects to the fleet an image holds, on an API server started on a copy of it: the
// workload cluster's kubeconfig Secret points at this API server, and the variant's health checks are
// created.
func openFleet(ctx context.Context, env *capienv.Environment, c client.Client, cfg Config, image *FleetImage) (*fleet, error) {
	f := &fleet{c: c, server: env.Config, cfg: cfg, ns: image.namespace, cluster: &clusterv1.Cluster{}}
	if err := c.Get(ctx, client.ObjectKey{Namespace: image.namespace, Name: image.cluster}, f.cluster); err != nil {
		return nil, fmt.Errorf("reading the fleet's Cluster: %w", err)
	}
	if err := capienv.CreateKubeconfigSecret(ctx, c, env.Config, f.cluster); err != nil {
		return nil, err
	}
	for i := range cfg.HealthChecks {
		if err := c.Create(ctx, f.healthCheck(i)); err != nil {
			return nil, fmt.Errorf("creating health check: %w", err)
		}
	}
	return f, nil
}

// FleetImage is a fleet built once into an etcd data directory: a Cluster, its Machines in pools
// (one per health check) and their Nodes, every one healthy, and no health check. Every run starts its
// own API server on a copy of the directory, so each variant meets the same fresh fleet and the
// fleet is written once per shape instead of once per variant (at N=10,000, 40,000 writes).
type FleetImage struct {
	Machines, HealthChecks int
	dir                    string
	namespace, cluster     string
}

// BuildFleetImage starts an API server whose etcd keeps its data, creates the fleet and stops it.
func BuildFleetImage(ctx context.Context, machines, healthChecks int) (_ *FleetImage, reterr error) {
	dir, err := os.MkdirTemp("", "capr-bench-fleet-")
	if err != nil {
		return nil, fmt.Errorf("creating the fleet image's directory: %w", err)
	}
	image := &FleetImage{Machines: machines, HealthChecks: healthChecks, dir: filepath.Join(dir, "etcd")}
	defer func() {
		if reterr != nil {
			image.Remove()
		}
	}()
	env, err := capienv.Start(capienv.Options{EtcdDataDir: image.dir})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := env.Stop(); err != nil && reterr == nil {
			reterr = fmt.Errorf("stopping the API server of the fleet image: %w", err)
		}
	}()
	env.Config.QPS, env.Config.Burst = -1, 0
	c, err := client.New(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	if image.namespace, err = capienv.CreateNamespace(ctx, c, "bench"); err != nil {
		return nil, err
	}
	cluster := capienv.NewCluster(image.namespace, "c1", clusterv1.ContractVersionedObjectReference{})
	image.cluster = cluster.Name
	if err := c.Create(ctx, cluster); err != nil {
		return nil, fmt.Errorf("creating Cluster: %w", err)
	}
	if err := capienv.SetClusterReady(ctx, c, cluster, capienv.ControlPlaneInitialized); err != nil {
		return nil, err
	}
	f := &fleet{ns: image.namespace}
	healthySince := time.Now().Add(-time.Hour)
	err = parallel(machines, func(i int) error {
		m := capienv.NewMachine(image.namespace, cluster.Name, machineName(i))
		m.Labels["pool"] = strconv.Itoa(poolOf(i, machines, healthChecks))
		if err := c.Create(ctx, m); err != nil {
			return fmt.Errorf("creating Machine %s: %w", m.Name, err)
		}
		if err := capienv.CreateNode(ctx, c, capienv.NewNode(f.nodeName(i), corev1.ConditionTrue, healthySince)); err != nil {
			return err
		}
		return setMachineNodeHealthy(ctx, c, m, f.nodeName(i))
	})
	if err != nil {
		return nil, err
	}
	return image, nil
}

// Remove deletes the image's directory.
func (im *FleetImage) Remove() { _ = os.RemoveAll(filepath.Dir(im.dir)) }

// copy copies the image's etcd data directory for one run and returns the copy's path.
func (im *FleetImage) copy() (string, error) {
	dst, err := os.MkdirTemp("", "capr-bench-etcd-")
	if err != nil {
		return "", fmt.Errorf("creating a directory for the run's etcd: %w", err)
	}
	err = filepath.WalkDir(im.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(im.dir, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		return copyFile(path, target)
	})
	if err != nil {
		_ = os.RemoveAll(dst)
		return "", fmt.Errorf("copying the fleet image %s: %w", im.dir, err)
	}
	return dst, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// setMachineNodeHealthy sets the Machine's nodeRef and InfrastructureReady as CAPI's Machine
// controller would, plus both systems' "health check succeeded" conditions (CAPI's in v1beta2 and
// v1beta1), so that neither controller has to write every Machine once at start (the start is not
// what is measured).
func setMachineNodeHealthy(ctx context.Context, c client.Client, m *clusterv1.Machine, node string) error {
	base := m.DeepCopy()
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: node}
	conditions.Set(m, metav1.Condition{Type: clusterv1.MachineInfrastructureReadyCondition, Status: metav1.ConditionTrue, Reason: "Ready"})
	conditions.Set(m, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionTrue,
		Reason: clusterv1.MachineHealthCheckSucceededReason})
	conditions.Set(m, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineCAPRHealthCheckSucceededReason})
	// CAPI's MachineHealthCheck also keeps the deprecated v1beta1 condition of a healthy target
	// (patchHealthyTargets); without it, it writes every Machine once at start.
	v1beta1conditions.MarkTrue(m, clusterv1.MachineHealthCheckSucceededV1Beta1Condition)
	if err := c.Status().Patch(ctx, m, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("setting nodeRef of Machine %s: %w", m.Name, err)
	}
	return nil
}

// waitReady waits until the health checks report every Machine as an expected, healthy target.
func (f *fleet) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		expected, healthy, err := f.healthCheckCounts(ctx)
		if err != nil {
			return err
		}
		if expected == f.cfg.Machines && healthy == f.cfg.Machines {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s the health checks report %d expected, %d healthy of %d Machines", timeout, expected, healthy, f.cfg.Machines)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (f *fleet) healthCheckCounts(ctx context.Context) (expected, healthy int, _ error) {
	if f.cfg.Variant.System == "capi" {
		list := &clusterv1.MachineHealthCheckList{}
		if err := f.c.List(ctx, list, client.InNamespace(f.ns)); err != nil {
			return 0, 0, fmt.Errorf("listing health checks: %w", err)
		}
		for _, h := range list.Items {
			expected += int(ptr.Deref(h.Status.ExpectedMachines, 0))
			healthy += int(ptr.Deref(h.Status.CurrentHealthy, 0))
		}
		return expected, healthy, nil
	}
	list := &caprv1.MachineHealthCheckList{}
	if err := f.c.List(ctx, list, client.InNamespace(f.ns)); err != nil {
		return 0, 0, fmt.Errorf("listing health checks: %w", err)
	}
	for _, h := range list.Items {
		expected += int(ptr.Deref(h.Status.ExpectedMachines, 0))
		healthy += int(ptr.Deref(h.Status.CurrentHealthy, 0))
	}
	return expected, healthy, nil
}

// healthCheck is health check i of the variant's system, selecting pool i.
func (f *fleet) healthCheck(i int) client.Object {
	name, selector := fmt.Sprintf("hc-%d", i), map[string]string{"pool": strconv.Itoa(i)}
	timeout := ptr.To(int32(conditionTimeout / time.Second))
	if f.cfg.Variant.System == "capi" {
		return &clusterv1.MachineHealthCheck{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
			Spec: clusterv1.MachineHealthCheckSpec{
				ClusterName: f.cluster.Name,
				Selector:    metav1.LabelSelector{MatchLabels: selector},
				Checks: clusterv1.MachineHealthCheckChecks{
					NodeStartupTimeoutSeconds: ptr.To[int32](600),
					UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{
						{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: timeout},
						{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: timeout},
					},
				},
			},
		}
	}
	return &caprv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: caprv1.MachineHealthCheckSpec{
			ClusterName: f.cluster.Name,
			Selector:    caprv1.MachineSelector{MatchLabels: caprv1.LabelValues(selector)},
			Checks: caprv1.MachineHealthCheckChecks{
				NodeStartupTimeoutSeconds: ptr.To[int32](600),
				UnhealthyNodeConditions: []caprv1.UnhealthyNodeCondition{
					{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: timeout},
					{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: timeout},
				},
			},
		},
	}
}

// flipSet is every tenth Machine: 10 %, and 10 % of every health check's (poolOf).
func (f *fleet) flipSet() []int {
	return flipSet(f.cfg.Machines)
}

func flipSet(machines int) []int {
	var out []int
	for i := 0; i < machines; i += 10 {
		out = append(out, i)
	}
	return out
}

// poolOf is the pool (the health check) of Machine i: consecutive blocks of machines/healthChecks
// Machines, so that every tenth Machine (flipSet) is every tenth of each pool. (Before 2026-11-27
// the pool was i % healthChecks, which put every flipped Machine into the pools 0, 10, 20, …: with
// N/100 health checks, a tenth of them had all their targets flipped and the others none.)
func poolOf(i, machines, healthChecks int) int {
	return i * healthChecks / machines
}

// markPhase turns the Nodes of flipped Ready=False with a lastTransitionTime chosen so that the
// timeout expires at a known whole second after the batch is written, and measures from there.
func (f *fleet) markPhase(ctx context.Context, obs *observer, proc *controllerProcess, flipped []int) (Phase, error) {
	if err := proc.reset(ctx); err != nil {
		return Phase{}, err
	}
	server := serverCPU()
	begin := time.Now()
	lead := 2*time.Second + time.Duration(len(flipped))*4*time.Millisecond
	expiry := begin.Add(lead).Truncate(time.Second).Add(time.Second)
	since := metav1.NewTime(expiry.Add(-conditionTimeout))
	names := f.names(flipped)
	obs.track(names, stateMarked)
	err := parallel(len(flipped), func(k int) error {
		return setNodeReady(ctx, f.c, f.nodeName(flipped[k]), corev1.ConditionFalse, since)
	})
	if err != nil {
		return Phase{}, err
	}
	ph := Phase{Changed: len(flipped), BatchDuration: time.Since(begin), Overran: time.Now().After(expiry), Expiry: expiry}
	profiled := make(chan error, 1)
	if f.cfg.ServerProfile != "" && len(flipped) > 1 {
		go func() { profiled <- f.profileServer(ctx, expiry) }()
	} else {
		profiled <- nil
	}
	ref := expiry
	if ph.Overran {
		ref = time.Now()
	}
	ph.Done, ph.P50, ph.P99, ph.Max = obs.wait(ctx, names, ref, phaseTimeout+time.Until(ref))
	ph.Wrong = obs.wrongMarks(names)
	if ph.Stats, ph.Unsettled, err = proc.quiescentStats(ctx); err != nil {
		return Phase{}, err
	}
	ph.Requested, ph.LastRequest = obs.lastRequest(ref)
	ph.ServerCPUSeconds = serverCPU() - server
	if err := <-profiled; err != nil {
		return Phase{}, err
	}
	return ph, nil
}

// serverProfileWindow is how long the API server's CPU profile of the mark phase lasts: at the
// default sizes, about CAPR's time to the last mark.
const serverProfileWindow = 2 * time.Second

// profileServer writes a CPU profile of kube-apiserver (its /debug/pprof, on by default) over the
// serverProfileWindow that starts at the instant the timeouts expire.
func (f *fleet) profileServer(ctx context.Context, start time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(start)):
	}
	cs, err := kubernetes.NewForConfig(f.server)
	if err != nil {
		return fmt.Errorf("creating a client for the API server's profile: %w", err)
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(int(serverProfileWindow/time.Second))).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("reading the API server's CPU profile: %w", err)
	}
	if err := os.WriteFile(f.cfg.ServerProfile, raw, 0o600); err != nil {
		return fmt.Errorf("writing the API server's CPU profile: %w", err)
	}
	return nil
}

// recoverPhase turns the same Nodes Ready again and measures from the start of that batch until
// every mark is cleared.
func (f *fleet) recoverPhase(ctx context.Context, obs *observer, proc *controllerProcess, flipped []int) (Phase, error) {
	if err := proc.reset(ctx); err != nil {
		return Phase{}, err
	}
	names := f.names(flipped)
	obs.track(names, stateHealthy)
	server := serverCPU()
	begin := time.Now()
	now := metav1.NewTime(begin)
	err := parallel(len(flipped), func(k int) error {
		return setNodeReady(ctx, f.c, f.nodeName(flipped[k]), corev1.ConditionTrue, now)
	})
	if err != nil {
		return Phase{}, err
	}
	ph := Phase{Changed: len(flipped), BatchDuration: time.Since(begin)}
	ph.Done, ph.P50, ph.P99, ph.Max = obs.wait(ctx, names, begin, phaseTimeout)
	if ph.Stats, ph.Unsettled, err = proc.quiescentStats(ctx); err != nil {
		return Phase{}, err
	}
	ph.ServerCPUSeconds = serverCPU() - server
	return ph, nil
}

// singleNode is the Machine of the one-Node phase: not in flipSet, so healthy until then.
const singleNode = 1

// heartbeatPhase refreshes the lastHeartbeatTime of every Node's Ready condition, nothing else (a
// strategic merge patch keyed by condition type), as kubelets do, and measures what the controller
// does about it. The phase waits the variant's deferral before it waits for quiet, so its CPU is reported
// above the controller's idle rate (CPU seconds per second, measured by drain just before).
func (f *fleet) heartbeatPhase(ctx context.Context, proc *controllerProcess, idle float64) (Phase, error) {
	if err := proc.reset(ctx); err != nil {
		return Phase{}, err
	}
	measured := time.Now()
	server := serverCPU()
	begin := time.Now()
	raw, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []map[string]any{{
		"type": corev1.NodeReady, "lastHeartbeatTime": metav1.Now(),
	}}}})
	if err != nil {
		return Phase{}, fmt.Errorf("encoding heartbeat patch: %w", err)
	}
	err = parallel(f.cfg.Machines, func(i int) error {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.nodeName(i)}}
		if err := f.c.Status().Patch(ctx, node, client.RawPatch("application/strategic-merge-patch+json", raw)); err != nil {
			return fmt.Errorf("heartbeat of Node %s: %w", node.Name, err)
		}
		return nil
	})
	if err != nil {
		return Phase{}, err
	}
	ph := Phase{Changed: f.cfg.Machines, BatchDuration: time.Since(begin)}
	// A rate-limited controller (CAPI's defaults) runs the round a heartbeat starts up to 15 s
	// later: wait that long before waiting for quiet.
	select {
	case <-ctx.Done():
		return Phase{}, ctx.Err()
	case <-time.After(f.cfg.Variant.deferral()):
	}
	if ph.Stats, ph.Unsettled, err = proc.quiescentStats(ctx); err != nil {
		return Phase{}, err
	}
	ph.Stats.CPUSeconds = max(ph.Stats.CPUSeconds-idle*time.Since(measured).Seconds(), 0)
	ph.ServerCPUSeconds = serverCPU() - server
	return ph, nil
}

// deferredWork is longer than any delay after which a controller of the bench does work an earlier
// event asked for: CAPI's ReconcilerRateLimiting (15 s per health check) and the worker
// remediator's requeue of a waiting request (15 s).
const deferredWork = 16 * time.Second

// deferral is how long a controller must have been quiet before the next phase starts, and how long
// the heartbeat phase waits before it waits for quiet: deferredWork for CAPI's rate limiting (15 s
// per health check), 3 s otherwise. Neither CAPI without its rate limiting nor CAPR defers work
// from one phase to the next: CAPI requeues a health check only for a timeout still running (none
// after a recovery), and the worker remediator's 15 s requeues of the requests the recovery withdrew
// find them gone from its cache and send nothing (remediation/worker readRequest). Work deferred
// all the same would land in the next phase and show in its rows.
func (v Variant) deferral() time.Duration {
	if v.RateLimiting {
		return deferredWork
	}
	return 3 * time.Second
}

func (f *fleet) names(idx []int) []string {
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = machineName(i)
	}
	return out
}

// setNodeReady patches the Node's Ready condition (status, lastTransitionTime since).
func setNodeReady(ctx context.Context, c client.Client, name string, status corev1.ConditionStatus, since metav1.Time) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	patch := map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: status, Reason: "Bench", LastTransitionTime: since, LastHeartbeatTime: metav1.Now(),
	}}}}
	raw, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encoding Node patch: %w", err)
	}
	if err := c.Status().Patch(ctx, node, client.RawPatch("application/strategic-merge-patch+json", raw)); err != nil {
		return fmt.Errorf("setting Ready=%s on Node %s: %w", status, name, err)
	}
	return nil
}

// parallel runs fn(0..n-1) on fleetWorkers goroutines and returns the first error.
func parallel(n int, fn func(int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range min(fleetWorkers, max(n, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// machineState is what the observer looks for on a Machine.
type machineState int

const (
	stateHealthy machineState = iota
	stateMarked
)

// stateOf reads a Machine's health-check state as the system under test writes it: CAPI's
// HealthCheckSucceeded condition, or CAPR's remediation.cluster.x-k8s.io/HealthCheckSucceeded.
func stateOf(system string, m *clusterv1.Machine) (machineState, bool) {
	condType := clusterv1.MachineHealthCheckSucceededCondition
	if system == "capr" {
		condType = caprv1.MachineCAPRHealthCheckSucceededCondition
	}
	c := conditions.Get(m, condType)
	switch {
	case c == nil:
		return 0, false
	case c.Status == metav1.ConditionTrue:
		return stateHealthy, true
	case c.Status == metav1.ConditionFalse:
		return stateMarked, true
	}
	return 0, false
}

// observer watches the fleet's Machines and records when each reaches the tracked state.
type observer struct {
	system string
	cancel context.CancelFunc

	mu      sync.Mutex
	state   map[string]machineState
	want    machineState
	tracked map[string]bool
	reached map[string]time.Time
	// requested is when each tracked Machine's remediation was requested: its MachineRemediation
	// appeared (CAPR), or OwnerRemediated=False (CAPI, written with the mark).
	requested map[string]time.Time
	changed   chan struct{}
}

func newObserver(ctx context.Context, env *capienv.Environment, ns, system string) (*observer, error) {
	ctx, cancel := context.WithCancel(ctx)
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("creating the observer's cache: %w", err)
	}
	o := &observer{system: system, cancel: cancel, state: map[string]machineState{}, reached: map[string]time.Time{},
		requested: map[string]time.Time{}, changed: make(chan struct{}, 1)}
	inf, err := c.GetInformer(ctx, &clusterv1.Machine{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("getting the Machine informer: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.see(obj) },
		UpdateFunc: func(_, obj any) { o.see(obj) },
	}); err != nil {
		cancel()
		return nil, fmt.Errorf("watching Machines: %w", err)
	}
	mrs, err := c.GetInformer(ctx, &caprv1.MachineRemediation{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("getting the MachineRemediation informer: %w", err)
	}
	if _, err := mrs.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if mr, ok := obj.(*caprv1.MachineRemediation); ok {
				o.request(mr.Name)
			}
		},
	}); err != nil {
		cancel()
		return nil, fmt.Errorf("watching MachineRemediations: %w", err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		cancel()
		return nil, errors.New("the observer's cache did not sync")
	}
	return o, nil
}

func (o *observer) stop() { o.cancel() }

func (o *observer) see(obj any) {
	m, ok := obj.(*clusterv1.Machine)
	if !ok {
		return
	}
	now := time.Now()
	s, known := stateOf(o.system, m)
	o.mu.Lock()
	defer o.mu.Unlock()
	if !known {
		delete(o.state, m.Name)
		return
	}
	o.state[m.Name] = s
	if c := conditions.Get(m, clusterv1.MachineOwnerRemediatedCondition); c != nil && c.Status == metav1.ConditionFalse && o.tracked[m.Name] {
		if _, ok := o.requested[m.Name]; !ok {
			o.requested[m.Name] = now
		}
	}
	if o.tracked[m.Name] && s == o.want {
		if _, ok := o.reached[m.Name]; !ok {
			o.reached[m.Name] = now
		}
	}
	select {
	case o.changed <- struct{}{}:
	default:
	}
}

func (o *observer) request(name string) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.requested[name]; !ok && o.tracked[name] {
		o.requested[name] = now
	}
}

// lastRequest is the latest remediation request of the tracked Machines after ref, and how many.
func (o *observer) lastRequest(ref time.Time) (int, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var last time.Duration
	for _, t := range o.requested {
		last = max(last, t.Sub(ref))
	}
	return len(o.requested), last
}

// track starts recording when names reach want.
func (o *observer) track(names []string, want machineState) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.want, o.tracked, o.reached, o.requested = want, map[string]bool{}, map[string]time.Time{}, map[string]time.Time{}
	for _, n := range names {
		o.tracked[n] = true
	}
}

// wait waits until every tracked name reached the state (or timeout) and returns how many did
// and their latency percentiles from ref.
func (o *observer) wait(ctx context.Context, names []string, ref time.Time, timeout time.Duration) (done int, p50, p99, maxLat time.Duration) {
	deadline := time.After(timeout)
	for {
		o.mu.Lock()
		done = len(o.reached)
		o.mu.Unlock()
		if done == len(names) {
			break
		}
		select {
		case <-ctx.Done():
		case <-deadline:
		case <-o.changed:
			continue
		case <-time.After(time.Second):
			continue
		}
		break
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	lat := make([]time.Duration, 0, len(o.reached))
	for _, t := range o.reached {
		lat = append(lat, max(t.Sub(ref), 0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return len(lat), percentile(lat, 0.50), percentile(lat, 0.99), percentile(lat, 1)
}

// wrongMarks counts marked Machines that are not in names.
func (o *observer) wrongMarks(names []string) int {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	wrong := 0
	for n, s := range o.state {
		if s == stateMarked && !want[n] {
			wrong++
		}
	}
	return wrong
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// controllerProcess is this binary re-executed as a controller process.
type controllerProcess struct {
	cmd  *exec.Cmd
	addr string
	done chan error
	dir  string
}

func startController(ctx context.Context, env *capienv.Environment, cfg Config) (*controllerProcess, error) {
	dir, err := os.MkdirTemp("", "capr-bench-")
	if err != nil {
		return nil, fmt.Errorf("creating a directory for the controller: %w", err)
	}
	kubeconfig, err := env.KubeConfig("bench-"+cfg.Variant.System, []string{"system:masters"})
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		return nil, fmt.Errorf("writing kubeconfig: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("locating the benchmark binary: %w", err)
	}
	rateLimit := "off"
	if cfg.Variant.RateLimiting {
		rateLimit = "on"
	}
	cmd := exec.CommandContext(ctx, self, "-test.run=^$") //nolint:gosec // re-executes this binary
	cmd.Env = append(os.Environ(),
		envController+"="+cfg.Variant.System,
		envKubeconfig+"="+path,
		envQPS+"="+strconv.FormatFloat(float64(cfg.Variant.QPS), 'f', -1, 32),
		envBurst+"="+strconv.Itoa(cfg.Variant.Burst),
		envRateLimit+"="+rateLimit,
		envWorkers+"="+strconv.Itoa(cfg.Workers),
		envCPUProfile+"="+cfg.CPUProfile,
	)
	logFile, err := os.Create(filepath.Join(dir, "controller.log"))
	if err != nil {
		return nil, fmt.Errorf("creating the controller's log: %w", err)
	}
	defer func() { _ = logFile.Close() }()
	cmd.Stderr = logFile
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("connecting to the controller's stdout: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the controller process: %w", err)
	}
	p := &controllerProcess{cmd: cmd, done: make(chan error, 1), dir: dir}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "BENCH_ADDR="); ok {
				addr <- a
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { p.done <- cmd.Wait() }()
	select {
	case p.addr = <-addr:
		return p, nil
	case err := <-p.done:
		return nil, fmt.Errorf("the controller process exited before serving: %w", err)
	case <-time.After(time.Minute):
		p.stop()
		return nil, errors.New("the controller process did not start within a minute")
	}
}

// stop ends the controller process; its log (errors only) is kept in BENCH_LOG_DIR when set.
func (p *controllerProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if dir := os.Getenv("BENCH_LOG_DIR"); dir != "" {
		if raw, err := os.ReadFile(filepath.Join(p.dir, "controller.log")); err == nil {
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("controller-%d.log", p.cmd.Process.Pid)), raw, 0o600)
		}
	}
	_ = os.RemoveAll(p.dir)
}

func (p *controllerProcess) call(ctx context.Context, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		return fmt.Errorf("building request %s: %w", path, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("calling the controller's %s: %w", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode >= 300 {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("the controller's %s: %s: %s", path, resp.Status, body)
	}
	if into == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		return fmt.Errorf("decoding the controller's %s: %w", path, err)
	}
	return nil
}

func (p *controllerProcess) reset(ctx context.Context) error { return p.call(ctx, "/reset", nil) }

// quiescentStats waits until the controller has sent no request and used less than idleCPU of CPU
// for a second (at most 20 s: trailing events, status patches and rounds that write nothing belong
// to the phase) and returns its stats.
// unsettled is true when the controller was still busy after those 20 s.
func (p *controllerProcess) quiescentStats(ctx context.Context) (_ Stats, unsettled bool, _ error) {
	s, quiet, _, err := p.waitQuiet(ctx, time.Second, 20*time.Second)
	return s, !quiet, err
}

// drain waits until the controller has been quiet (quiescentStats' rule) for the given time, at
// most four times as long, and returns the CPU it used per second meanwhile: its idle rate.
func (p *controllerProcess) drain(ctx context.Context, quiet time.Duration) (float64, error) {
	_, ok, idle, err := p.waitQuiet(ctx, quiet, 4*quiet)
	if err != nil || !ok {
		return 0, cmp.Or(err, fmt.Errorf("the controller was not quiet for %s within %s", quiet, 4*quiet))
	}
	return idle, nil
}

// waitQuiet polls the controller's stats every second until it has sent no request and used less
// than idleCPU of CPU a second for the duration quiet, or until limit. It returns the last stats,
// whether it was quiet and, if so, the CPU seconds it used per second while quiet.
func (p *controllerProcess) waitQuiet(ctx context.Context, quiet, limit time.Duration) (Stats, bool, float64, error) {
	var last Stats
	if err := p.call(ctx, "/stats", &last); err != nil {
		return Stats{}, false, 0, err
	}
	quietFor, quietCPU := time.Duration(0), 0.0
	for waited := time.Duration(0); waited < limit; waited += time.Second {
		select {
		case <-ctx.Done():
			return Stats{}, false, 0, ctx.Err()
		case <-time.After(time.Second):
		}
		var s Stats
		if err := p.call(ctx, "/stats", &s); err != nil {
			return Stats{}, false, 0, err
		}
		if used := s.CPUSeconds - last.CPUSeconds; total(s.Requests, nil) == total(last.Requests, nil) && used < idleCPU {
			quietFor, quietCPU = quietFor+time.Second, quietCPU+used
		} else {
			quietFor, quietCPU = 0, 0
		}
		last = s
		if quietFor >= quiet {
			return last, true, quietCPU / quietFor.Seconds(), nil
		}
	}
	return last, false, 0, nil
}

// idleCPU is the CPU a controller with nothing to do may use in a second (garbage collection,
// informers' bookkeeping).
const idleCPU = 0.05

// total sums the counts whose key passes keep (all when keep is nil).
func total(counts map[string]int, keep func(string) bool) int {
	n := 0
	for k, v := range counts {
		if keep == nil || keep(k) {
			n += v
		}
	}
	return n
}

// isWrite reports whether a request key is a write.
func isWrite(key string) bool {
	verb, _, _ := strings.Cut(key, " ")
	switch verb {
	case "create", "update", "patch", "delete":
		return true
	}
	return false
}

// serverCPU is the CPU time (user + system, seconds) of this process's kube-apiserver and etcd
// children, from /proc (Linux; 0 elsewhere).
func serverCPU() float64 {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := strconv.Itoa(os.Getpid())
	total := 0.0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15): fields after the closing parenthesis.
		s := string(raw)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		comm := s[open+1 : closing]
		fields := strings.Fields(s[closing+1:])
		if len(fields) < 13 || fields[1] != self || (comm != "kube-apiserver" && comm != "etcd") {
			continue
		}
		utime, _ := strconv.ParseFloat(fields[11], 64)
		stime, _ := strconv.ParseFloat(fields[12], 64)
		total += (utime + stime) / clockTicks
	}
	return total
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100
