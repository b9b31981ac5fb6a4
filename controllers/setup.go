package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/core/setup"
	"sigs.k8s.io/cluster-api/util/index"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers/machinehealthcheck"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/remediation/fencing"
	"github.com/capr-io/capr/remediation/retention"
	"github.com/capr-io/capr/remediation/worker"
)

// ControllerName is the name CAPR's manager uses for its informers, user agent and events.
const ControllerName = "capr-manager"

// DefaultKubeAPIQPS and DefaultKubeAPIBurst are the defaults of the manager's client-side rate limit
// towards the management cluster's API server (--kube-api-qps, --kube-api-burst). A negative QPS is
// no client-side limit: the API server's Priority and Fairness limits the manager instead, as
// controller-runtime's config.GetConfig defaults to since v0.21. The limit would bind in exactly one
// case, a storm of marks: a client-side limit of QPS q and burst b spends at least (n-b)/q seconds on
// n marks of one write each (CAPI's 100/200: 8 s for 1,000 Machines), while the health checker
// already bounds its writes in flight (writeSlots) and steady state sends nothing. The burst is
// CAPI's managers' 200, so that --kube-api-qps=100 alone sets CAPI's managers' limit.
const (
	DefaultKubeAPIQPS   = -1
	DefaultKubeAPIBurst = 200
)

// DefaultReconcileTimeout bounds every reconcile of every controller of the manager (--reconcile-timeout):
// a call that never returns (a read waiting for an informer that cannot sync, an API server or
// webhook that does not answer) then takes a worker for this long, not for good. It is KCP's
// (cluster-api controlplane/kubeadm/main.go: 3 minutes, because its reconciles talk to every etcd
// member), three times CAPI's default of one minute (cluster-api util/controller/builder.go): the
// longest legitimate reconciles here are the control-plane remediator's and the etcd member check's,
// an etcd Inspect (bounded by 3 x the call timeout, etcdutil.Cluster.InspectTimeout) plus a dial
// and a membership call, 70 s with the default etcd timeouts. MinReconcileTimeout checks that a
// configured value leaves room for that.
const DefaultReconcileTimeout = 3 * time.Minute

// MinReconcileTimeout is the shortest reconcile timeout that does not cut a legitimate reconcile
// short with these etcd timeouts: one etcd Inspect (3 x callTimeout) plus a dial and a call.
func MinReconcileTimeout(dialTimeout, callTimeout time.Duration) time.Duration {
	return 3*callTimeout + dialTimeout + callTimeout
}

// Options configures CAPR's controllers.
type Options struct {
	// WatchFilterValue restricts reconciliation to objects labelled cluster.x-k8s.io/watch-filter=<value>.
	WatchFilterValue string
	// HealthCheckConcurrency is the number of MachineHealthChecks reconciled at once.
	HealthCheckConcurrency int
	// ClusterCacheConcurrency is the number of Clusters the ClusterCache reconciles at once.
	ClusterCacheConcurrency int
	// ClusterCacheQPS and ClusterCacheBurst bound requests to each workload cluster.
	ClusterCacheQPS   float32
	ClusterCacheBurst int
	// ConnectionRetryInterval overrides how often the ClusterCache retries an unreachable workload
	// cluster (CAPI's default is 30s); 0 keeps the default.
	ConnectionRetryInterval time.Duration
	// EtcdMembers overrides where the health checker's checks.etcdMember reads etcd from (tests);
	// nil means the workload cluster's real etcd.
	EtcdMembers machinehealthcheck.EtcdMemberSource
	// RemediationConcurrency is the number of MachineRemediations reconciled at once.
	RemediationConcurrency int
	// EtcdDialTimeout and EtcdCallTimeout bound every etcd connection and call (KCP's defaults: 10s, 15s).
	EtcdDialTimeout time.Duration
	EtcdCallTimeout time.Duration
	// AllowEtcdEndpoints honours the etcd-endpoints annotation of Clusters (etcdutil.AllowEndpointsFlag,
	// off by default): without it CAPR never dials an address a Cluster's annotation names.
	AllowEtcdEndpoints bool
	// Fencer overrides the fencing step (tests); nil means the policy fencer with the built-in backends
	// (NewFencer).
	Fencer fencing.Fencer
	// EscalationTimeout overrides how both remediators turn an escalation step's timeoutSeconds
	// into its timeout (tests); nil means seconds.
	EscalationTimeout func(timeoutSeconds int32) time.Duration
	// WorkerDeleteTimeout overrides how long the worker remediator's Delete step waits for the Machine
	// to go before it reports StepTimedOut (tests); 0 means worker.DefaultDeleteTimeout.
	WorkerDeleteTimeout time.Duration
	// StepObserver sees every control-plane remediation step being issued and finishing.
	StepObserver func(controlplane.StepEvent)
	// ControlPlaneAdapter overrides the control-plane provider adapter (tests); nil means
	// controlplane.AdapterFor.
	ControlPlaneAdapter func(cp *unstructured.Unstructured) controlplane.Adapter
	// ReconcileTimeout bounds every reconcile of every controller; 0 means DefaultReconcileTimeout.
	ReconcileTimeout time.Duration
	// Retention bounds the life of finished MachineRemediations (--machineremediation-ttl-after-finished,
	// --machineremediation-max-finished-per-cluster); its zero value keeps them without bound.
	Retention retention.Settings
}

// Defaults fills unset options with CAPI-like defaults.
func (o *Options) Defaults() {
	if o.HealthCheckConcurrency == 0 {
		o.HealthCheckConcurrency = 10
	}
	if o.ClusterCacheConcurrency == 0 {
		o.ClusterCacheConcurrency = 10
	}
	if o.ClusterCacheQPS == 0 {
		o.ClusterCacheQPS = 20
	}
	if o.ClusterCacheBurst == 0 {
		o.ClusterCacheBurst = 30
	}
	if o.RemediationConcurrency == 0 {
		o.RemediationConcurrency = 10
	}
	if o.EtcdDialTimeout == 0 {
		o.EtcdDialTimeout = etcdutil.DefaultDialTimeout
	}
	if o.EtcdCallTimeout == 0 {
		o.EtcdCallTimeout = etcdutil.DefaultCallTimeout
	}
	if o.ReconcileTimeout == 0 {
		o.ReconcileTimeout = DefaultReconcileTimeout
	}
}

// ManagerCacheOptions are CAPI core's. Their Secret settings go unused: CAPR reads Secrets by name,
// uncached (SetupWithManager).
func ManagerCacheOptions(scheme *runtime.Scheme, namespace string, syncPeriod time.Duration) cache.Options {
	return setup.ManagerCacheOptions(scheme, ControllerName, namespace, syncPeriod)
}

// ManagerCacheOptionsNamed is ManagerCacheOptions for a manager with another name: informer names
// must be unique in a process, which matters when tests start several managers.
func ManagerCacheOptionsNamed(scheme *runtime.Scheme, name, namespace string, syncPeriod time.Duration) cache.Options {
	return setup.ManagerCacheOptions(scheme, name, namespace, syncPeriod)
}

// ManagerClientOptions returns the manager's client options: CAPI core's, except that unstructured
// reads are not served from the cache. Every kind CAPR reads unstructured is one a user chooses: a
// health check's remediation templates and the requests made from them, the Cluster's control-plane
// object. A cached read of a kind is a promise to list and watch it for good: the first one starts
// an informer and waits for it to sync (controller-runtime pkg/cache/internal/informers.go Get), which
// never happens when CAPR may not list or watch that kind, so the worker never returned and the
// Forbidden error was never seen; ten such health checks stopped health checking everywhere. Read
// live, the read fails at once with Forbidden, which the health check reports. The kinds CAPR owns
// and watches (Machines, Clusters, MachineRemediations, Nodes) are typed and stay cached, and so do
// the CustomResourceDefinitions' metadata that contract-versioned references are resolved with.
func ManagerClientOptions() client.Options {
	o := setup.ManagerClientOptions()
	o.Cache.Unstructured = false
	return o
}

// Setup is what SetupWithManager built, for callers that need the pieces (e.g. the sandbox).
type Setup struct {
	ClusterCache clustercache.ClusterCache
	Etcd         *etcdutil.Workload
}

// NewFencer is the manager's fencing: the policy over the NetworkFence (csi-addons, in the workload
// cluster), External (in the management cluster) and OutOfServiceTaint (workload Node, version read
// from the workload cluster's discovery) backends, and the force-deletion of a fenced Node's pods once
// every backend confirmed (fencing.PodDeleter). Workload objects are read uncached: fences are few,
// must be read as they are, and a cache would start informers for kinds the workload cluster may not
// have. The External backend reads templates and fence objects live for the same reason; the manager
// gets access to their kinds through its aggregated role (docs/user/fencing.md, External).
func NewFencer(mgr ctrl.Manager, cc clustercache.ClusterCache) *fencing.PolicyFencer {
	return &fencing.PolicyFencer{
		Workload: cc.GetUncachedClient,
		Backends: map[caprv1.FencingBackendType]fencing.Backend{
			caprv1.FencingBackendNetworkFence: &fencing.NetworkFenceBackend{Workload: cc.GetUncachedClient},
			caprv1.FencingBackendExternal:     &fencing.ExternalBackend{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()},
			caprv1.FencingBackendOutOfServiceTaint: &fencing.OutOfServiceTaintBackend{
				Workload: cc.GetUncachedClient, ServerVersion: fencing.DiscoveryServerVersion(cc.GetRESTConfig),
			},
		},
		Pods: &fencing.PodDeleter{Workload: cc.GetUncachedClient, Recorder: mgr.GetEventRecorder("capr-fencing")},
	}
}

// SetupWithManager registers indexes, the ClusterCache and CAPR's controllers with mgr.
func SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts Options) (*Setup, error) {
	opts.Defaults()
	if err := index.ByMachineNode(ctx, mgr); err != nil {
		return nil, fmt.Errorf("adding the Machine node-name index: %w", err)
	}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		// Uncached, unlike CAPI's managers: a kubeconfig Secret is read by name when a connection is
		// made, so the manager needs neither list nor watch on Secrets, and the Secret role can be
		// bound per namespace (etcdutil.Workload).
		SecretClient:     mgr.GetAPIReader(),
		WatchFilterValue: opts.WatchFilterValue,
		Cache:            setup.ClusterCacheCacheOptions(),
		Client:           setup.ClusterCacheClientOptions(ControllerName, opts.ClusterCacheQPS, opts.ClusterCacheBurst),
	}, controllerOptions(opts.ClusterCacheConcurrency, opts.ReconcileTimeout))
	if err != nil {
		return nil, fmt.Errorf("setting up the ClusterCache: %w", err)
	}
	if opts.ConnectionRetryInterval > 0 {
		if s, ok := cc.(interface{ SetConnectionCreationRetryInterval(time.Duration) }); ok {
			s.SetConnectionCreationRetryInterval(opts.ConnectionRetryInterval)
		}
	}
	if opts.Fencer == nil {
		opts.Fencer = NewFencer(mgr, cc)
	}
	workload := &etcdutil.Workload{
		SecretReader: mgr.GetAPIReader(), ClusterCache: cc,
		DialTimeout: opts.EtcdDialTimeout, CallTimeout: opts.EtcdCallTimeout,
		AllowEndpointsAnnotation: opts.AllowEtcdEndpoints, Recorder: mgr.GetEventRecorder("capr-etcd"),
	}
	members := opts.EtcdMembers
	if members == nil {
		members = &etcdMemberSource{client: mgr.GetClient(), workload: workload}
	}
	members = newSharedEtcdMembers(members)
	if err := (&machinehealthcheck.Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		ClusterCache:     cc,
		EtcdMembers:      members,
		WatchFilterValue: opts.WatchFilterValue,
	}).SetupWithManager(ctx, mgr, controllerOptions(opts.HealthCheckConcurrency, opts.ReconcileTimeout)); err != nil {
		return nil, err
	}
	if err := (&controlplane.Reconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		Etcd:             controlplane.WorkloadEtcd{Workload: workload},
		Fencer:           opts.Fencer,
		WatchFilterValue: opts.WatchFilterValue,
		StepObserver:     opts.StepObserver,
		Adapter:          opts.ControlPlaneAdapter,
		// Escalation steps have one meaning of timeoutSeconds for both remediators.
		EscalationTimeout: opts.EscalationTimeout,
	}).SetupWithManager(ctx, mgr, controllerOptions(opts.RemediationConcurrency, opts.ReconcileTimeout)); err != nil {
		return nil, err
	}
	if err := (&worker.Reconciler{
		Client:            mgr.GetClient(),
		APIReader:         mgr.GetAPIReader(),
		Fencer:            opts.Fencer,
		WatchFilterValue:  opts.WatchFilterValue,
		EscalationTimeout: opts.EscalationTimeout,
		DeleteTimeout:     opts.WorkerDeleteTimeout,
	}).SetupWithManager(ctx, mgr, controllerOptions(opts.RemediationConcurrency, opts.ReconcileTimeout)); err != nil {
		return nil, err
	}
	if err := (&retention.Reconciler{
		Client:           mgr.GetClient(),
		Settings:         opts.Retention,
		Etcd:             workload,
		WatchFilterValue: opts.WatchFilterValue,
	}).SetupWithManager(ctx, mgr, controllerOptions(1, opts.ReconcileTimeout)); err != nil {
		return nil, err
	}
	return &Setup{ClusterCache: cc, Etcd: workload}, nil
}
