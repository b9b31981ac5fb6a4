package machinehealthcheck_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/capr-io/capr/controllers"
	capienv "github.com/capr-io/capr/test/envtest"
)

var (
	testEnv *capienv.Environment
	// k8sClient is an uncached client: tests observe the API server, not the manager's cache.
	k8sClient client.Client
	ctx       = context.Background()
)

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
	mgr, err := ctrl.NewManager(testEnv.ManagerConfig, ctrl.Options{
		Scheme:  testEnv.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   controllers.ManagerCacheOptions(testEnv.Scheme, "", 10*time.Minute),
		Client:  controllers.ManagerClientOptions(),
		// Tests end by stopping the manager. Under load an in-flight reconcile (e.g. a workload-cluster
		// dial) can outlast 2 s, which failed the suite after every test had passed; shutdown time is
		// not what these suites test, so they wait as long as the manager's default.
		GracefulShutdownTimeout: ptr.To(30 * time.Second),
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
		fmt.Fprintf(os.Stderr, "manager stopped with error: %v\n", err)
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
