package sandbox

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.uber.org/zap/zapcore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	bootstrapv1beta1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta1" //nolint:staticcheck // served by the CRDs; CAPI's webhooks need it in the scheme
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1beta1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta1" //nolint:staticcheck // as above
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1" //nolint:staticcheck // as above
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/reconcilers/kubeadmconfig"
	bootstrapsetup "sigs.k8s.io/cluster-api/bootstrap/kubeadm/setup"
	bootstrapadmission "sigs.k8s.io/cluster-api/bootstrap/kubeadm/webhooks/admission"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	kcppkg "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg/etcd"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/reconcilers/kubeadmcontrolplane"
	kcpsetup "sigs.k8s.io/cluster-api/controlplane/kubeadm/setup"
	controlplaneadmission "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/admission"
	"sigs.k8s.io/cluster-api/core/reconcilers/cluster"
	"sigs.k8s.io/cluster-api/core/reconcilers/clusterclass"
	"sigs.k8s.io/cluster-api/core/reconcilers/machine"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinehealthcheck"
	"sigs.k8s.io/cluster-api/core/reconcilers/machineset"
	topologycluster "sigs.k8s.io/cluster-api/core/reconcilers/topology/cluster"
	topologymachinedeployment "sigs.k8s.io/cluster-api/core/reconcilers/topology/machinedeployment"
	topologymachineset "sigs.k8s.io/cluster-api/core/reconcilers/topology/machineset"
	coresetup "sigs.k8s.io/cluster-api/core/setup"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	"sigs.k8s.io/cluster-api/feature"
	"sigs.k8s.io/cluster-api/util/index"
)

// The full stack runs CAPI's own managers in this process, each set up as its binary's main.go does
// (sigs.k8s.io/cluster-api core/main.go, bootstrap/kubeadm/main.go, controlplane/kubeadm/main.go):
// its own cache and client options, a ClusterCache, the default indexes, the reconcilers with their
// shipped defaults, and the admission webhooks the API server was configured to call. Nothing of CAPI
// is replaced: the sandbox infrastructure provider only plays the machines.

// The controller names of CAPI's three managers (their main.go), used for informer metrics and
// ClusterCache user agents.
const (
	coreControllerName      = "cluster-api-controller-manager"
	bootstrapControllerName = "cluster-api-kubeadm-bootstrap-manager"
	kcpControllerName       = "cluster-api-kubeadm-control-plane-manager"
)

// capiDefaults are the defaults of CAPI's manager flags that the reconcilers take.
const (
	capiSyncPeriod                  = 10 * time.Minute
	capiRemoteConnectionGracePeriod = 50 * time.Second
	capiRemoteConditionsGracePeriod = 5 * time.Minute
	capiEtcdDialTimeout             = 10 * time.Second
	capiClusterCacheQPS             = 20
	capiClusterCacheBurst           = 30
)

// CAPIOptions selects optional parts of CAPI.
type CAPIOptions struct {
	// MachineHealthCheck also runs CAPI's MachineHealthCheck reconciler (the upstream remediation path).
	MachineHealthCheck bool
	// Topology turns CAPI's ClusterTopology feature gate on (process-wide) and runs the ClusterClass,
	// Cluster topology, MachineDeployment topology and MachineSet topology reconcilers as core/main.go
	// does with the gate on, runtime extensions off (RuntimeSDK stays off: no RuntimeClient). The
	// ClusterClass and Cluster admission webhooks always run; with the gate on they accept
	// ClusterClasses and Cluster.spec.topology. Clusters are then built from a ClusterClass with
	// ClusterSpec.Topology.
	Topology bool
	// KCPLogger, when it has a sink, is the KubeadmControlPlane manager's logger (its reconcilers log
	// through it); otherwise KCP logs as the process does (ctrl.SetLogger).
	KCPLogger logr.Logger
}

// AddCAPIToScheme registers the types CAPI's managers use beyond the sandbox's scheme.
// (the v1beta1 versions are served too: CAPI's webhooks convert between them).
func AddCAPIToScheme(s *kruntime.Scheme) error {
	for _, add := range []func(*kruntime.Scheme) error{
		bootstrapv1.AddToScheme, controlplanev1.AddToScheme,
		// ExtensionConfig: the ClusterClass reconciler watches it (core/main.go registers it whatever
		// the RuntimeSDK gate says).
		runtimev1.AddToScheme,
		clusterv1beta1.AddToScheme, bootstrapv1beta1.AddToScheme, controlplanev1beta1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return err
		}
	}
	return nil
}

type capiManager struct {
	name string
	mgr  manager.Manager
}

func (s *Sandbox) newCAPIManager(name string, cache ctrlcache.Options, clientOpts client.Options, withWebhooks bool, logger logr.Logger) (manager.Manager, error) {
	opts := ctrl.Options{
		Logger:                  logger,
		Scheme:                  s.Env.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		Cache:                   cache,
		Client:                  clientOpts,
		GracefulShutdownTimeout: ptr.To(5 * time.Second),
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
	}
	if withWebhooks {
		opts.WebhookServer = webhook.NewServer(s.Env.WebhookServerOptions())
	}
	mgr, err := ctrl.NewManager(s.Env.Config, opts)
	if err != nil {
		return nil, fmt.Errorf("creating CAPI's %s manager: %w", name, err)
	}
	return mgr, nil
}

// capiConcurrency is the workers per CAPI controller (their flags' defaults are 10).
var capiConcurrency = controller.Options{MaxConcurrentReconciles: 10}

// startCAPI creates and starts CAPI's core, kubeadm bootstrap and KubeadmControlPlane managers.
func (s *Sandbox) startCAPI(ctx context.Context, opts CAPIOptions) error {
	if opts.Topology {
		if err := feature.MutableGates.Set(string(feature.ClusterTopology) + "=true"); err != nil {
			return fmt.Errorf("turning CAPI's ClusterTopology feature gate on: %w", err)
		}
	}
	core, err := s.setupCore(ctx, opts)
	if err != nil {
		return err
	}
	bootstrap, err := s.setupBootstrap(ctx)
	if err != nil {
		return err
	}
	kcp, err := s.setupKCP(ctx, opts)
	if err != nil {
		return err
	}
	for _, m := range []capiManager{{"core", core}, {"kubeadm bootstrap", bootstrap}, {"KubeadmControlPlane", kcp}} {
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func(name string, mgr manager.Manager) {
			err := mgr.Start(mctx)
			if err != nil && mctx.Err() == nil {
				// A manager that stops by itself leaves the sandbox without that controller: every
				// later wait would only time out, so say why here (go test prints stderr).
				fmt.Fprintf(os.Stderr, "sandbox: CAPI's %s manager stopped: %v\n", name, err)
			}
			done <- err
		}(m.name, m.mgr)
		s.stops = append(s.stops, func() {
			cancel()
			<-done
		})
	}
	return s.waitForWebhooks(ctx)
}

func (s *Sandbox) setupCore(ctx context.Context, opts CAPIOptions) (manager.Manager, error) {
	mgr, err := s.newCAPIManager("core", coresetup.ManagerCacheOptions(s.Env.Scheme, coreControllerName, "", capiSyncPeriod), coresetup.ManagerClientOptions(), true, logr.Logger{})
	if err != nil {
		return nil, err
	}
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return nil, fmt.Errorf("adding CAPI's default indexes: %w", err)
	}
	secretClient, err := coresetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, err
	}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretClient,
		Cache:        coresetup.ClusterCacheCacheOptions(),
		Client:       coresetup.ClusterCacheClientOptions(coreControllerName, capiClusterCacheQPS, capiClusterCacheBurst),
	}, capiConcurrency)
	if err != nil {
		return nil, fmt.Errorf("creating core's ClusterCache: %w", err)
	}
	setups := []func() error{
		func() error {
			return (&cluster.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc,
				RemoteConnectionGracePeriod: capiRemoteConnectionGracePeriod}).SetupWithManager(ctx, mgr, capiConcurrency)
		},
		func() error {
			return (&machine.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc,
				RemoteConditionsGracePeriod: capiRemoteConditionsGracePeriod}).SetupWithManager(ctx, mgr, capiConcurrency)
		},
		func() error {
			return (&machineset.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc}).SetupWithManager(ctx, mgr, capiConcurrency)
		},
		func() error {
			return (&machinedeployment.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).SetupWithManager(ctx, mgr, capiConcurrency)
		},
		// Admission, as core/main.go setupWebhooks, plus the kubeadm bootstrap and KCP webhooks
		// (one webhook server serves all three manifests here).
		func() error {
			return (&coreadmission.Cluster{Client: mgr.GetClient(), ClusterCacheReader: cc}).SetupWebhookWithManager(mgr)
		},
		func() error {
			return (&coreadmission.ClusterClass{Client: mgr.GetClient()}).SetupWebhookWithManager(mgr)
		},
		func() error { return (&coreadmission.Machine{}).SetupWebhookWithManager(mgr) },
		func() error { return (&coreadmission.MachineSet{}).SetupWebhookWithManager(mgr) },
		func() error { return (&coreadmission.MachineDeployment{}).SetupWebhookWithManager(mgr) },
		func() error { return (&coreadmission.MachineDrainRule{}).SetupWebhookWithManager(mgr) },
		func() error { return (&coreadmission.MachineHealthCheck{}).SetupWebhookWithManager(mgr) },
		func() error { return (&bootstrapadmission.KubeadmConfig{}).SetupWebhookWithManager(mgr) },
		func() error { return (&bootstrapadmission.KubeadmConfigTemplate{}).SetupWebhookWithManager(mgr) },
		func() error { return (&controlplaneadmission.KubeadmControlPlane{}).SetupWebhookWithManager(mgr) },
		func() error {
			return (&controlplaneadmission.ScaleValidator{Client: mgr.GetClient()}).SetupWebhookWithManager(mgr)
		},
		func() error {
			return (&controlplaneadmission.KubeadmControlPlaneTemplate{}).SetupWebhookWithManager(mgr)
		},
	}
	if opts.MachineHealthCheck {
		setups = append(setups, func() error {
			return (&machinehealthcheck.Reconciler{Client: mgr.GetClient(), ClusterCache: cc}).SetupWithManager(ctx, mgr, capiConcurrency)
		})
	}
	if opts.Topology {
		setups = append(setups, topologySetups(ctx, mgr, cc)...)
	}
	for _, setup := range setups {
		if err := setup(); err != nil {
			return nil, fmt.Errorf("setting up CAPI core: %w", err)
		}
	}
	return mgr, nil
}

func (s *Sandbox) setupBootstrap(ctx context.Context) (manager.Manager, error) {
	mgr, err := s.newCAPIManager("kubeadm bootstrap", bootstrapsetup.ManagerCacheOptions(s.Env.Scheme, bootstrapControllerName, "", capiSyncPeriod), bootstrapsetup.ManagerClientOptions(), false, logr.Logger{})
	if err != nil {
		return nil, err
	}
	secretClient, err := bootstrapsetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, err
	}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretClient,
		Cache:        bootstrapsetup.ClusterCacheCacheOptions(),
		Client:       bootstrapsetup.ClusterCacheClientOptions(bootstrapControllerName, capiClusterCacheQPS, capiClusterCacheBurst),
	}, capiConcurrency)
	if err != nil {
		return nil, fmt.Errorf("creating the kubeadm bootstrap ClusterCache: %w", err)
	}
	if err := (&kubeadmconfig.Reconciler{
		Client: mgr.GetClient(), SecretCachingClient: secretClient, APIReader: mgr.GetAPIReader(), ClusterCache: cc,
		TokenTTL: kubeadmconfig.DefaultTokenTTL,
	}).SetupWithManager(ctx, mgr, capiConcurrency); err != nil {
		return nil, fmt.Errorf("setting up the KubeadmConfig reconciler: %w", err)
	}
	return mgr, nil
}

func (s *Sandbox) setupKCP(ctx context.Context, opts CAPIOptions) (manager.Manager, error) {
	mgr, err := s.newCAPIManager("KubeadmControlPlane", kcpsetup.ManagerCacheOptions(s.Env.Scheme, kcpControllerName, "", capiSyncPeriod), kcpsetup.ManagerClientOptions(), false, opts.KCPLogger)
	if err != nil {
		return nil, err
	}
	secretClient, err := kcpsetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, err
	}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretClient,
		Cache:        kcpsetup.ClusterCacheCacheOptions(),
		Client:       kcpsetup.ClusterCacheClientOptions(kcpControllerName, capiClusterCacheQPS, capiClusterCacheBurst),
	}, capiConcurrency)
	if err != nil {
		return nil, fmt.Errorf("creating KCP's ClusterCache: %w", err)
	}
	etcdLogger, err := logutil.CreateDefaultZapLogger(zapcore.ErrorLevel)
	if err != nil {
		return nil, err
	}
	if err := (&kubeadmcontrolplane.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), SecretCachingClient: secretClient, ClusterCache: cc,
		EtcdDialTimeout: capiEtcdDialTimeout, EtcdCallTimeout: kcppkg.DefaultCallTimeout, EtcdLogger: etcdLogger,
		RemoteConditionsGracePeriod: capiRemoteConditionsGracePeriod,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10, ReconciliationTimeout: 3 * time.Minute}); err != nil {
		return nil, fmt.Errorf("setting up the KubeadmControlPlane reconciler: %w", err)
	}
	return mgr, nil
}

// The concurrency of the topology reconcilers (core/main.go: --clustertopology-concurrency and
// --clusterclass-concurrency defaults; 25 for the MachineDeployment and MachineSet topology ones).
var (
	clusterTopologyConcurrency = controller.Options{MaxConcurrentReconciles: 50}
	topologyHelperConcurrency  = controller.Options{MaxConcurrentReconciles: 25}
)

// topologySetups are the ClusterTopology reconcilers, wired as core/main.go wires them with the
// feature gate on and RuntimeSDK off (RuntimeClient nil: no lifecycle hooks are called).
func topologySetups(ctx context.Context, mgr manager.Manager, cc clustercache.ClusterCache) []func() error {
	return []func() error{
		func() error {
			return (&clusterclass.Reconciler{Client: mgr.GetClient()}).SetupWithManager(ctx, mgr, capiConcurrency)
		},
		func() error {
			return (&topologycluster.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc}).
				SetupWithManager(ctx, mgr, clusterTopologyConcurrency)
		},
		func() error {
			return (&topologymachinedeployment.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).
				SetupWithManager(ctx, mgr, topologyHelperConcurrency)
		},
		func() error {
			return (&topologymachineset.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).
				SetupWithManager(ctx, mgr, topologyHelperConcurrency)
		},
	}
}

// waitForWebhooks waits until the API server can call the webhook server: a dry-run create of a
// KubeadmControlPlane with stacked etcd and two replicas is denied by KCP's validator, not failed by a
// connection error.
func (s *Sandbox) waitForWebhooks(ctx context.Context) error {
	return poll(ctx, 30*time.Second, func() (bool, string) {
		kcp := &controlplanev1.KubeadmControlPlane{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "webhook-probe"},
			Spec: controlplanev1.KubeadmControlPlaneSpec{
				Replicas: ptr.To(int32(2)), Version: KubernetesVersion,
				MachineTemplate: controlplanev1.KubeadmControlPlaneMachineTemplate{Spec: controlplanev1.KubeadmControlPlaneMachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "SandboxMachineTemplate", Name: "probe"},
				}},
			},
		}
		err := s.Client.Create(ctx, kcp, client.DryRunAll)
		if err == nil {
			return false, "KCP admission accepted two replicas with stacked etcd"
		}
		if !strings.Contains(err.Error(), "denied the request") {
			return false, "webhook server not reachable yet: " + err.Error()
		}
		return true, ""
	})
}
