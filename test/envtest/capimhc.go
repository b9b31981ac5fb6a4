package envtest

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinehealthcheck"
	coresetup "sigs.k8s.io/cluster-api/core/setup"
	"sigs.k8s.io/cluster-api/feature"
	"sigs.k8s.io/cluster-api/util/index"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/capr-io/capr/controllers"
)

// CAPIMachineHealthCheckManager returns CAPI core's manager with only CAPI v1.14's own
// MachineHealthCheck reconciler, set up as core/main.go does (recipe:
// /work/shared/research/capi-mhc-in-process.md). rateLimiting false turns CAPI's per-object 15 s
// reconcile rate limit off (a process-wide feature gate). The caller starts it.
func CAPIMachineHealthCheckManager(ctx context.Context, cfg *rest.Config, workers int, rateLimiting bool) (ctrl.Manager, error) {
	const name = "cluster-api-controller-manager"
	if !rateLimiting {
		if err := feature.MutableGates.Set("ReconcilerRateLimiting=false"); err != nil {
			return nil, fmt.Errorf("turning CAPI's reconciler rate limiting off: %w", err)
		}
	}
	scheme, err := controllers.NewScheme()
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + "/" + name
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		Cache:                   coresetup.ManagerCacheOptions(scheme, name, "", 10*time.Minute),
		Client:                  coresetup.ManagerClientOptions(),
		GracefulShutdownTimeout: ptr.To(2 * time.Second),
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("creating CAPI's manager: %w", err)
	}
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return nil, fmt.Errorf("adding CAPI's default indexes: %w", err)
	}
	secretClient, err := coresetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, fmt.Errorf("creating CAPI's secret caching client: %w", err)
	}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretClient,
		Cache:        coresetup.ClusterCacheCacheOptions(),
		Client:       coresetup.ClusterCacheClientOptions(name, 20, 30),
	}, controller.Options{MaxConcurrentReconciles: workers})
	if err != nil {
		return nil, fmt.Errorf("creating CAPI's ClusterCache: %w", err)
	}
	if s, ok := cc.(interface{ SetConnectionCreationRetryInterval(time.Duration) }); ok {
		s.SetConnectionCreationRetryInterval(2 * time.Second)
	}
	if err := (&machinehealthcheck.Reconciler{Client: mgr.GetClient(), ClusterCache: cc}).
		SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: workers}); err != nil {
		return nil, fmt.Errorf("setting up CAPI's MachineHealthCheck reconciler: %w", err)
	}
	return mgr, nil
}
