package envtest

import (
	"fmt"
	"os"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/capr-io/capr/controllers"
)

// VerboseEnv is the environment variable that, set to anything, makes SetLogger log at debug level
// instead of errors only.
const VerboseEnv = "CAPR_TEST_VERBOSE"

// SetLogger sets controller-runtime's logger for a suite: errors only, which keeps `make test`
// readable, or everything with CAPR_TEST_VERBOSE set.
func SetLogger() {
	level := zapcore.ErrorLevel
	if os.Getenv(VerboseEnv) != "" {
		level = zapcore.Level(-4)
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(level)))
}

// ManagerOptions configures NewManager.
type ManagerOptions struct {
	// Requests, when set, counts the manager's requests.
	Requests *RequestCounter
	// WrapClient, when set, wraps the manager's client (e.g. a cache that lags behind).
	WrapClient func(client.Client) client.Client
}

// NewManager returns a manager set up as main.go sets up CAPR's (controllers.ManagerCacheOptions,
// controllers.ManagerClientOptions) that authenticates as CAPR's manager ServiceAccount with the
// shipped RBAC (ManagerConfig), without a metrics server. The caller sets up the controllers and
// starts it (Suite.Go).
func (e *Environment) NewManager(opts ManagerOptions) (ctrl.Manager, error) {
	if e.ManagerConfig == nil {
		return nil, fmt.Errorf("the environment has no manager identity (Options.WithoutCAPR or WithoutManagerIdentity)")
	}
	cfg := rest.CopyConfig(e.ManagerConfig)
	if opts.Requests != nil {
		cfg.Wrap(opts.Requests.Wrap)
	}
	mgrOpts := ctrl.Options{
		Scheme:  e.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   controllers.ManagerCacheOptions(e.Scheme, "", 10*time.Minute),
		Client:  controllers.ManagerClientOptions(),
		// Tests end by stopping the manager. Under load an in-flight reconcile can outlast 2 s. Some
		// calls are bounded by their own timeouts, not by the reconcile's context: the etcd dial's
		// websocket and SPDY upgrades (cluster-api/controlplane/kubeadm/pkg/proxy) take none. (The
		// shutdowns that outlived 30 s and then 60 s in CI were workers deadlocked in controller-runtime's
		// priority queue, which CAPR's controllers no longer use: controllers.controllerOptions.)
		// Shutdown time is not what these suites test; a manager that still does not stop fails the
		// suite and names the stuck workers (Suite.Go).
		GracefulShutdownTimeout: ptr.To(time.Minute),
	}
	if opts.WrapClient != nil {
		mgrOpts.NewClient = func(config *rest.Config, options client.Options) (client.Client, error) {
			c, err := client.New(config, options)
			if err != nil {
				return nil, err
			}
			return opts.WrapClient(c), nil
		}
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	return mgr, nil
}
