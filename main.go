// Command capr is CAPR's controller manager: the health checker and the remediators for Cluster API
// Machines. It runs next to CAPI in the management cluster.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/flags"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation/retention"
)

// options are the command-line flags.
type options struct {
	namespace               string
	watchFilter             string
	leaderElect             bool
	leaderElectionNamespace string
	leaseDuration           time.Duration
	renewDeadline           time.Duration
	retryPeriod             time.Duration
	healthAddr              string
	syncPeriod              time.Duration
	kubeAPIQPS              float32
	kubeAPIBurst            int
	healthCheckConcurrency  int
	clusterCacheConcurrency int
	clusterCacheQPS         float32
	clusterCacheBurst       int
	remediationConcurrency  int
	etcdDialTimeout         time.Duration
	etcdCallTimeout         time.Duration
	reconcileTimeout        time.Duration
	retentionTTL            time.Duration
	retentionMaxPerCluster  int
	allowEtcdEndpoints      bool
	managerOptions          flags.ManagerOptions
	zap                     zap.Options
}

func (o *options) bind(fs *pflag.FlagSet) {
	fs.StringVar(&o.namespace, "namespace", "", "Namespace that the controller watches. If unset, all namespaces are watched (clusterctl's default).")
	fs.StringVar(&o.watchFilter, "watch-filter", "", fmt.Sprintf("Label value that objects must carry in label %s to be reconciled. If unset, all objects are reconciled.", clusterv1.WatchLabel))
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Enable leader election, so that only one replica acts at a time.")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election lease (defaults to the pod's namespace).")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "Leader election lease duration.")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "Leader election renew deadline.")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "Leader election retry period.")
	fs.StringVar(&o.healthAddr, "health-addr", ":9440", "Address the health and readiness probes bind to.")
	fs.DurationVar(&o.syncPeriod, "sync-period", 10*time.Minute, "Minimum interval at which watched objects are reconciled again.")
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", controllers.DefaultKubeAPIQPS,
		"Maximum queries per second from the controllers to the management cluster's API server, per resource type; negative: no client-side limit, the API server's Priority and Fairness limits the manager (CAPI's managers: 100).")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", controllers.DefaultKubeAPIBurst,
		"Maximum burst of queries from the controllers to the management cluster's API server, per resource type, when --kube-api-qps is not negative (CAPI's managers: 200).")
	fs.IntVar(&o.healthCheckConcurrency, "machinehealthcheck-concurrency", 10, "Number of MachineHealthChecks reconciled at once.")
	fs.IntVar(&o.clusterCacheConcurrency, "clustercache-concurrency", 100, "Number of Clusters whose workload-cluster connections are reconciled at once.")
	fs.Float32Var(&o.clusterCacheQPS, "clustercache-client-qps", 20, "Maximum queries per second to each workload cluster.")
	fs.IntVar(&o.clusterCacheBurst, "clustercache-client-burst", 30, "Maximum burst of queries to each workload cluster.")
	fs.IntVar(&o.remediationConcurrency, "machineremediation-concurrency", 10, "Number of MachineRemediations reconciled at once.")
	fs.DurationVar(&o.etcdDialTimeout, "etcd-dial-timeout-duration", 10*time.Second, "Timeout for connecting to a workload cluster's etcd member (port-forward and gRPC).")
	fs.DurationVar(&o.etcdCallTimeout, "etcd-call-timeout-duration", 15*time.Second, "Timeout for each call to a workload cluster's etcd.")
	fs.DurationVar(&o.reconcileTimeout, "reconcile-timeout", controllers.DefaultReconcileTimeout,
		"Longest time one reconcile of any controller may take before its context is cancelled, so that a call that never returns cannot take a worker for good; must leave room for an etcd inspection (3 x --etcd-call-timeout-duration + --etcd-dial-timeout-duration + --etcd-call-timeout-duration).")
	fs.DurationVar(&o.retentionTTL, "machineremediation-ttl-after-finished", retention.DefaultTTL,
		"How long a finished (Succeeded or Failed) MachineRemediation is kept after its completionTime, as a Job's ttlSecondsAfterFinished; 0: no time limit. Requests that still matter (a fence to undo, a Failed one whose Machine exists) are kept regardless.")
	fs.IntVar(&o.retentionMaxPerCluster, "machineremediation-max-finished-per-cluster", retention.DefaultMaxPerCluster,
		"Maximum number of finished MachineRemediations kept per Cluster, the oldest deleted first; 0: no limit.")
	fs.BoolVar(&o.allowEtcdEndpoints, strings.TrimPrefix(etcdutil.AllowEndpointsFlag, "--"), false,
		fmt.Sprintf("Dial the etcd addresses a Cluster's %s annotation names (external etcd). Off: the annotation is ignored, with a Warning event on the Cluster, since anyone who may annotate a Cluster could point CAPR's etcd client at any address.", etcdutil.EndpointsAnnotation))
	flags.AddManagerOptions(fs, &o.managerOptions)
	zfs := flag.NewFlagSet("zap", flag.ExitOnError)
	o.zap.BindFlags(zfs)
	fs.AddGoFlagSet(zfs)
}

func main() {
	o := &options{}
	o.bind(pflag.CommandLine)
	pflag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	if err := run(ctrl.SetupSignalHandler(), o); err != nil {
		klog.Background().Error(err, "CAPR manager stopped")
		fmt.Fprintf(os.Stderr, "capr: %v\n", err)
		os.Exit(1)
	}
}

// The diagnostics endpoint (--diagnostics-address) serves metrics over HTTPS and lets only callers
// the API server authenticates and authorizes through (unless --insecure-diagnostics): it needs
// TokenReviews and SubjectAccessReviews, as CAPI's managers do.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

func run(ctx context.Context, o *options) error {
	log := ctrl.LoggerFrom(ctx).WithName("setup")
	if err := o.validate(); err != nil {
		return err
	}
	scheme, err := controllers.NewScheme()
	if err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig of the management cluster: %w", err)
	}
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + "/" + controllers.ControllerName
	cfg.QPS, cfg.Burst = o.kubeAPIQPS, o.kubeAPIBurst

	_, metricsOptions, err := flags.GetManagerOptions(o.managerOptions)
	if err != nil {
		return fmt.Errorf("invalid metrics/TLS flags: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "capr-manager-leader-election",
		LeaderElectionNamespace:       o.leaderElectionNamespace,
		LeaseDuration:                 &o.leaseDuration,
		RenewDeadline:                 &o.renewDeadline,
		RetryPeriod:                   &o.retryPeriod,
		LeaderElectionReleaseOnCancel: true,
		HealthProbeBindAddress:        o.healthAddr,
		Metrics:                       ptr.Deref(metricsOptions, metricsserver.Options{}),
		Cache:                         controllers.ManagerCacheOptions(scheme, o.namespace, o.syncPeriod),
		Client:                        controllers.ManagerClientOptions(),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	if err := checkCRDs(mgr.GetRESTMapper()); err != nil {
		return err
	}
	if _, err := controllers.SetupWithManager(ctx, mgr, controllers.Options{
		WatchFilterValue:        o.watchFilter,
		HealthCheckConcurrency:  o.healthCheckConcurrency,
		ClusterCacheConcurrency: o.clusterCacheConcurrency,
		ClusterCacheQPS:         o.clusterCacheQPS,
		ClusterCacheBurst:       o.clusterCacheBurst,
		RemediationConcurrency:  o.remediationConcurrency,
		EtcdDialTimeout:         o.etcdDialTimeout,
		EtcdCallTimeout:         o.etcdCallTimeout,
		ReconcileTimeout:        o.reconcileTimeout,
		Retention:               retention.Settings{TTL: o.retentionTTL, MaxPerCluster: o.retentionMaxPerCluster},
		AllowEtcdEndpoints:      o.allowEtcdEndpoints,
	}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}
	log.Info("Starting CAPR manager", "namespace", o.namespace, "watchFilter", o.watchFilter, "leaderElect", o.leaderElect)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

// validate checks the flags that the controllers cannot correct themselves.
func (o *options) validate() error {
	lowest := controllers.MinReconcileTimeout(o.etcdDialTimeout, o.etcdCallTimeout)
	if o.reconcileTimeout < lowest {
		return fmt.Errorf("invalid --reconcile-timeout=%s: must be at least %s, so that a reconcile that inspects etcd is not cut short "+
			"(3 x --etcd-call-timeout-duration=%s + --etcd-dial-timeout-duration=%s + --etcd-call-timeout-duration)",
			o.reconcileTimeout, lowest, o.etcdCallTimeout, o.etcdDialTimeout)
	}
	return nil
}

// checkCRDs fails with a clear message when a CRD CAPR needs is not installed, instead of the
// manager retrying informers forever.
func checkCRDs(mapper meta.RESTMapper) error {
	needed := []struct {
		gk   schema.GroupKind
		from string
	}{
		{schema.GroupKind{Group: caprv1.GroupVersion.Group, Kind: "MachineHealthCheck"}, "CAPR (make install, or clusterctl)"},
		{schema.GroupKind{Group: caprv1.GroupVersion.Group, Kind: "MachineRemediation"}, "CAPR (make install, or clusterctl)"},
		{schema.GroupKind{Group: caprv1.GroupVersion.Group, Kind: "MachineRemediationTemplate"}, "CAPR (make install, or clusterctl)"},
		{schema.GroupKind{Group: clusterv1.GroupVersion.Group, Kind: "Cluster"}, "Cluster API (clusterctl init)"},
		{schema.GroupKind{Group: clusterv1.GroupVersion.Group, Kind: "Machine"}, "Cluster API (clusterctl init)"},
	}
	var errs []error
	for _, n := range needed {
		if _, err := mapper.RESTMapping(n.gk); err != nil {
			if meta.IsNoMatchError(err) {
				errs = append(errs, fmt.Errorf("CRD for %s is not installed; install %s", n.gk, n.from))
				continue
			}
			errs = append(errs, fmt.Errorf("checking CRD for %s: %w", n.gk, err))
		}
	}
	return errors.Join(errs...)
}
