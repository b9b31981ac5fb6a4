// Package worker_test runs CAPR's worker remediator against a real kube-apiserver and etcd
// (envtest) with CAPI's CRDs, next to the control-plane remediator and the health checker, as the
// manager runs them. The fencing backend is a recording stand-in behind the real policy fencer.
package worker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/remediation/fencing"
	"github.com/capr-io/capr/remediation/retention"
	capienv "github.com/capr-io/capr/test/envtest"
)

var (
	testEnv *capienv.Environment
	// k8sClient is an uncached client: tests observe the API server, not the manager's cache.
	k8sClient client.Client
	ctx       = context.Background()
	// workloadClusters is the manager's ClusterCache (realFencingWorker waits for its connection).
	workloadClusters clustercache.ClusterCache
	// requests counts the manager's requests by method and path.
	requests = capienv.NewRequestCounter()
	backend  = &testBackend{confirmed: map[string]bool{}, asked: map[string]time.Time{}, asks: map[string]int{}, unfenced: map[string]bool{}}
)

// testBackend is a fencing backend that confirms a node only once a test says so, and records what
// it was asked. It stands in for NetworkFence (not implemented yet) behind the real PolicyFencer.
type testBackend struct {
	mu        sync.Mutex
	confirmed map[string]bool
	asked     map[string]time.Time
	asks      map[string]int
	unfenced  map[string]bool
}

func (b *testBackend) Fence(_ context.Context, req fencing.Request, _ caprv1.FencingBackend) (bool, string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.asked[req.Node]; !ok {
		b.asked[req.Node] = time.Now()
	}
	b.asks[req.Node]++
	if b.confirmed[req.Node] {
		return true, "fenced", nil
	}
	return false, "the test backend has not confirmed node " + req.Node, nil
}

func (b *testBackend) confirm(node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.confirmed[node] = true
}

func (b *testBackend) wasAsked(node string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.asked[node]
	return ok
}

// askCount is how many times the backend was asked to fence node: a remediator that looked again.
func (b *testBackend) askCount(node string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.asks[node]
}

func (b *testBackend) wasUnfenced(node string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unfenced[node]
}

// unfencingFencer is the policy fencer plus the Unfencer hook the worker remediator calls on abort.
type unfencingFencer struct {
	*fencing.PolicyFencer
	backend *testBackend
}

func (f unfencingFencer) Unfence(_ context.Context, req fencing.Request) error {
	f.backend.mu.Lock()
	defer f.backend.mu.Unlock()
	f.backend.unfenced[req.Node] = true
	return nil
}

// realFencingLabel on a Cluster routes its fencing to the manager's own fencer (controllers.NewFencer:
// the real NetworkFence, External and OutOfServiceTaint backends against the workload cluster, here the
// same API server with csi-addons' CRDs) instead of the test backend.
const realFencingLabel = "test.capr.io/real-fencing"

// routingFencer is the test backend's fencer, or the manager's own for a Cluster with realFencingLabel.
type routingFencer struct {
	stub unfencingFencer
	real atomic.Pointer[fencing.PolicyFencer]
}

func (f *routingFencer) pick(req fencing.Request) interface {
	fencing.Fencer
	fencing.Unfencer
} {
	if req.Cluster != nil && req.Cluster.Labels[realFencingLabel] != "" {
		return f.real.Load()
	}
	return f.stub
}

func (f *routingFencer) Fence(ctx context.Context, req fencing.Request) (fencing.Result, error) {
	return f.pick(req).Fence(ctx, req)
}

func (f *routingFencer) Unfence(ctx context.Context, req fencing.Request) error {
	return f.pick(req).Unfence(ctx, req)
}

// NodePods hands the pod deletion to the fencer the request goes to (fencing.NodePodDeleter).
func (f *routingFencer) NodePods(req fencing.Request) *fencing.PodDeleter {
	if d, ok := f.pick(req).(fencing.NodePodDeleter); ok {
		return d.NodePods(req)
	}
	return nil
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapLevel())))
	var err error
	testEnv, err = capienv.Start(capienv.Options{
		ExtraCRDDirs:     []string{filepath.Join("testdata", "crd"), filepath.Join("..", "..", "crds", "csiaddons")},
		ManagerRoleFiles: []string{filepath.Join("testdata", "escalation_role.yaml")},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start envtest: %v\n", err)
		return 1
	}
	defer func() { _ = testEnv.Stop() }()
	k8sClient = testEnv.Client

	mgrCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	mgrConfig := rest.CopyConfig(testEnv.ManagerConfig)
	mgrConfig.Wrap(requests.Wrap)
	mgr, err := ctrl.NewManager(mgrConfig, ctrl.Options{
		Scheme:  testEnv.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   controllers.ManagerCacheOptions(testEnv.Scheme, "", 10*time.Minute),
		Client:  controllers.ManagerClientOptions(),
		// Tests end by stopping the manager. Under load an in-flight reconcile can outlast 2 s. Some
		// calls are bounded by their own timeouts, not by the reconcile's context: the etcd dial's
		// websocket and SPDY upgrades (cluster-api/controlplane/kubeadm/pkg/proxy) take none. (The
		// shutdowns that outlived 30 s and then 60 s in CI were workers deadlocked in controller-runtime's
		// priority queue, which CAPR's controllers no longer use: controllers.controllerOptions.)
		// Shutdown time is not what these suites test; a manager that still does not stop fails the
		// suite and names the stuck workers.
		GracefulShutdownTimeout: ptr.To(time.Minute),
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: creating manager: %v\n", err)
		return 1
	}
	fencer := &routingFencer{stub: unfencingFencer{
		PolicyFencer: &fencing.PolicyFencer{Backends: map[caprv1.FencingBackendType]fencing.Backend{caprv1.FencingBackendNetworkFence: backend}},
		backend:      backend,
	}}
	setup, err := controllers.SetupWithManager(mgrCtx, mgr, controllers.Options{
		ConnectionRetryInterval: 2 * time.Second,
		Fencer:                  fencer,
		// An escalation step's timeoutSeconds (at least 60) counts as that many 100 ms here.
		EscalationTimeout: func(seconds int32) time.Duration { return time.Duration(seconds) * 100 * time.Millisecond },
		// The Delete step's 10 minutes are too long to wait for (TestDeleteThatNeverEndsIsReported).
		WorkerDeleteTimeout: 5 * time.Second,
		// The shipped TTL; a limit above any other test's finished requests per Cluster (3), low
		// enough for retention_test.go to exceed.
		Retention: retention.Settings{TTL: retention.DefaultTTL, MaxPerCluster: retentionLimit},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: setting up controllers: %v\n", err)
		return 1
	}
	workloadClusters = setup.ClusterCache
	// The policy fencer reads the workload cluster's Nodes for a Machine without a Node (Required).
	fencer.stub.Workload = setup.ClusterCache.GetUncachedClient
	fencer.real.Store(controllers.NewFencer(mgr, setup.ClusterCache))
	// CAPI v1.14's own MachineHealthCheck reconciler, in its own manager as in CAPI's (interop tests).
	capiMgr, err := capienv.CAPIMachineHealthCheckManager(mgrCtx, testEnv.Config, 2, false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: setting up CAPI's MachineHealthCheck: %v\n", err)
		return 1
	}
	done := make(chan error, 2)
	go func() { done <- mgr.Start(mgrCtx) }()
	go func() { done <- capiMgr.Start(mgrCtx) }()
	code := m.Run()
	cancel()
	for range 2 {
		if err := <-done; err != nil {
			fmt.Fprintf(os.Stderr, "%s\nmanager stopped with error: %v\n", capienv.StuckWorkers(), err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

func zapLevel() zapcore.Level {
	if os.Getenv("CAPR_TEST_VERBOSE") != "" {
		return zapcore.Level(-4)
	}
	return zapcore.ErrorLevel
}
