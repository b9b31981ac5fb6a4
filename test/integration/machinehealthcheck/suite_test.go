package machinehealthcheck_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	capienv "github.com/capr-io/capr/test/envtest"
)

var (
	testEnv *capienv.Environment
	// k8sClient is an uncached client: tests observe the API server, not the manager's cache.
	k8sClient client.Client
	ctx       = context.Background()
	// requests counts the manager's requests by method and path.
	requests = capienv.NewRequestCounter()
	// hidden are the MachineRemediations the manager's Lists do not show (a cache lagging behind).
	hidden = &hiddenRequests{names: map[types.NamespacedName]bool{}}
)

// hiddenRequests makes the manager's cache lag for chosen MachineRemediations: its Lists leave them
// out (its informers, Gets and watch events still have them).
type hiddenRequests struct {
	mu    sync.Mutex
	names map[types.NamespacedName]bool
}

func (h *hiddenRequests) set(ns, name string, hide bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hide {
		h.names[types.NamespacedName{Namespace: ns, Name: name}] = true
	} else {
		delete(h.names, types.NamespacedName{Namespace: ns, Name: name})
	}
}

// laggingClient is the manager's client with hidden's MachineRemediations left out of its Lists.
type laggingClient struct {
	client.Client
}

func (c laggingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	if l, ok := list.(*caprv1.MachineRemediationList); ok {
		hidden.mu.Lock()
		defer hidden.mu.Unlock()
		l.Items = slices.DeleteFunc(l.Items, func(mr caprv1.MachineRemediation) bool {
			return hidden.names[client.ObjectKeyFromObject(&mr)]
		})
	}
	return nil
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapLevel())))
	var err error
	testEnv, err = capienv.Start(capienv.Options{})
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
		NewClient: func(config *rest.Config, options client.Options) (client.Client, error) {
			c, err := client.New(config, options)
			return laggingClient{Client: c}, err
		},
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
	if _, err := controllers.SetupWithManager(mgrCtx, mgr, controllers.Options{
		ConnectionRetryInterval: 2 * time.Second,
		EtcdMembers:             fakeEtcd,
	}); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: setting up controllers: %v\n", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintf(os.Stderr, "%s\nmanager stopped with error: %v\n", capienv.StuckWorkers(), err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func zapLevel() zapcore.Level {
	if os.Getenv("CAPR_TEST_VERBOSE") != "" {
		return zapcore.Level(-4)
	}
	return zapcore.ErrorLevel // keeps `make test` readable
}
