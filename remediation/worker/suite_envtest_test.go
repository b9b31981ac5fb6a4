//go:build envtest

// The envtest suite of the worker remediator (go test -tags envtest; make test): CAPR's worker
// remediator against a real kube-apiserver and etcd (test/envtest) with CAPI's CRDs, next to the
// control-plane remediator and the health checker, as the manager runs them, with the shipped RBAC.
// The fencing backend is a recording stand-in behind the real policy fencer.

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

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	capienv.SetLogger()
	root, err := capienv.ModuleRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	return capienv.Run(m, capienv.Options{
		ExtraCRDDirs:     []string{filepath.Join("testdata", "crd"), filepath.Join(root, "test", "crds", "csiaddons")},
		ManagerRoleFiles: []string{filepath.Join("testdata", "escalation_role.yaml")},
	}, setup)
}

func setup(s *capienv.Suite) error {
	testEnv = s.Environment
	k8sClient = testEnv.Client
	mgr, err := testEnv.NewManager(capienv.ManagerOptions{Requests: requests})
	if err != nil {
		return err
	}
	fencer := &routingFencer{stub: unfencingFencer{
		PolicyFencer: &fencing.PolicyFencer{Backends: map[caprv1.FencingBackendType]fencing.Backend{caprv1.FencingBackendNetworkFence: backend}},
		backend:      backend,
	}}
	set, err := controllers.SetupWithManager(s.Ctx, mgr, controllers.Options{
		ConnectionRetryInterval: 2 * time.Second,
		Fencer:                  fencer,
		// An escalation step's timeoutSeconds (at least 60) counts as that many 100 ms here.
		EscalationTimeout: func(seconds int32) time.Duration { return time.Duration(seconds) * 100 * time.Millisecond },
		// The Delete step's 10 minutes are too long to wait for (TestDeleteThatNeverEndsIsReported).
		WorkerDeleteTimeout: 5 * time.Second,
		// The shipped TTL; a limit above any other test's finished requests per Cluster (3), low
		// enough for retention_envtest_test.go to exceed.
		Retention: retention.Settings{TTL: retention.DefaultTTL, MaxPerCluster: retentionLimit},
	})
	if err != nil {
		return fmt.Errorf("setting up controllers: %w", err)
	}
	workloadClusters = set.ClusterCache
	// The policy fencer reads the workload cluster's Nodes for a Machine without a Node (Required).
	fencer.stub.Workload = set.ClusterCache.GetUncachedClient
	fencer.real.Store(controllers.NewFencer(mgr, set.ClusterCache))
	// CAPI v1.14's own MachineHealthCheck reconciler, in its own manager as in CAPI's (interop tests).
	capiMgr, err := capienv.CAPIMachineHealthCheckManager(s.Ctx, testEnv.Config, 2, false)
	if err != nil {
		return fmt.Errorf("setting up CAPI's MachineHealthCheck: %w", err)
	}
	s.Go(mgr.Start)
	s.Go(capiMgr.Start)
	return nil
}
