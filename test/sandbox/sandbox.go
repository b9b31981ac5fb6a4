package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"

	"github.com/go-logr/logr"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	kcpv1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	"github.com/capr-io/capr/etcdutil"
	capienv "github.com/capr-io/capr/test/envtest"
	controlplanev1 "github.com/capr-io/capr/test/sandbox/api/controlplane/v1alpha1"
	infrav1 "github.com/capr-io/capr/test/sandbox/api/infrastructure/v1alpha1"
	"github.com/capr-io/capr/test/storage"
)

// Sandbox is a management cluster on this machine with the sandbox providers running.
type Sandbox struct {
	Env    *capienv.Environment
	Client client.Client

	dir        string
	etcdBinary string

	mu       sync.Mutex
	clusters map[types.NamespacedName]*WorkloadCluster
	kubelets map[string]*Kubelet

	// Log records what happened in the world, with times (timelines, benchmarks).
	Log *EventLog
	// Storage is storage failover's stack (Options.Storage), nil without it.
	Storage *storage.Stack

	opts Options
	// installOnce guards InstallRenderedComponents for StartBuiltManager (binary.go).
	installOnce sync.Once
	managerArgs []string
	installErr  error
	// kcm is the real kube-controller-manager of the full stack (node lifecycle, garbage collector,
	// pod GC, attach/detach).
	kcm *capienv.KubeControllerManager
	// apiServerCert is what port 6443 of a full-stack control-plane node leads to.
	apiServerCert *apiServerCertEndpoint
	// stops stop CAPI's managers (full stack), last started first.
	stops       []func()
	stopManager context.CancelFunc
	managerDone chan error
}

// Provider selects what plays CAPI's providers in the sandbox.
type Provider string

const (
	// ProviderSandbox is the lightweight stand-in: a sandbox control-plane provider, and an
	// infrastructure provider that also does the parts of CAPI's Machine controller the sandbox needs.
	// Fast; used by most scenarios and the fault suite.
	ProviderSandbox Provider = "sandbox"
	// ProviderKubeadm is the full stack: CAPI's own core, kubeadm bootstrap and KubeadmControlPlane
	// reconcilers and admission webhooks run in-process; the sandbox infrastructure provider only plays
	// the machines (bootstrap data in, etcd member, Node, static-pod mirror Pods out).
	ProviderKubeadm Provider = "kubeadm"
)

// Options configures a sandbox.
type Options struct {
	// Provider defaults to ProviderSandbox.
	Provider Provider
	// CAPI selects optional CAPI reconcilers (ProviderKubeadm only).
	CAPI CAPIOptions
	// WithoutManagerIdentity leaves CAPR's RBAC out (Env.ManagerConfig is nil): for tests that
	// install it from the rendered clusterctl components and run the built binary with it.
	WithoutManagerIdentity bool
	// Storage also runs storage failover's components (storage.StartStackWith): kube-controller-
	// manager's attach/detach, taint eviction, pod GC and volume binding, the CSI external-attacher
	// with the stand-in driver, and csi-addons' controller with the stand-in sidecar.
	Storage bool
}

// WorkloadCluster is one sandbox workload cluster.
type WorkloadCluster struct {
	Namespace string
	Name      string
	Etcd      *EtcdCluster
	// ExternalEtcd is ClusterSpec.ExternalEtcd: Etcd's members are not the control-plane Machines'.
	ExternalEtcd bool

	// holdProvisioning, when set, leaves new Machines without a Node (a replacement that never
	// comes up).
	holdProvisioning atomic.Bool
}

// Key returns the Cluster's key.
func (w *WorkloadCluster) Key() client.ObjectKey {
	return client.ObjectKey{Namespace: w.Namespace, Name: w.Name}
}

// LogKey is the key of the Cluster's events in the EventLog.
func (w *WorkloadCluster) LogKey() string { return LogKey(w.Namespace, w.Name) }

// LogKey is the key of a Cluster's events in the EventLog: its namespace and its name, since the fault
// suite's parallel runs name every Cluster the same, each in a namespace of its own.
func LogKey(namespace, cluster string) string { return namespace + "/" + cluster }

// AddToScheme registers the sandbox providers' types.
func AddToScheme(s *kruntime.Scheme) error {
	if err := infrav1.AddToScheme(s); err != nil {
		return err
	}
	return controlplanev1.AddToScheme(s)
}

// CRDDir returns the sandbox providers' CRD directory.
func CRDDir() (string, error) {
	root, err := capienv.ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "test", "sandbox", "config", "crd"), nil
}

// Start starts the API server, etcd and the sandbox providers.
func Start(ctx context.Context) (*Sandbox, error) {
	return StartWithOptions(ctx, Options{})
}

// StartWithOptions starts the API server, etcd and the selected providers.
func StartWithOptions(ctx context.Context, opts Options) (*Sandbox, error) {
	if opts.Provider == "" {
		opts.Provider = ProviderSandbox
	}
	if opts.Provider != ProviderSandbox && opts.Provider != ProviderKubeadm {
		return nil, fmt.Errorf("unknown sandbox provider %q: use %q or %q", opts.Provider, ProviderSandbox, ProviderKubeadm)
	}
	// The kubelet stand-ins report every tunnel to a stopped etcd member through klog; in the
	// sandbox that is the expected result of a fault, not news.
	klog.SetLogger(logr.Discard())
	crds, err := CRDDir()
	if err != nil {
		return nil, err
	}
	assets, err := capienv.AssetsDir()
	if err != nil {
		return nil, err
	}
	// The workload clusters are this API server: csi-addons' CRDs make NetworkFence fencing possible
	// (storage.StartStack runs csi-addons' controller and the rest of storage failover on it).
	csiAddonsCRDs, err := storage.CRDDir()
	if err != nil {
		return nil, err
	}
	env, err := capienv.Start(capienv.Options{
		ExtraCRDDirs: []string{crds, csiAddonsCRDs}, AddToScheme: []func(*kruntime.Scheme) error{AddToScheme, AddCAPIToScheme},
		CAPIWebhooks: opts.Provider == ProviderKubeadm, WithoutManagerIdentity: opts.WithoutManagerIdentity,
		// CAPR's shipped RBAC grants only KubeadmControlPlane; the sandbox's control plane is granted
		// as a user grants any other provider's.
		ManagerRoleFiles: []string{filepath.Join(filepath.Dir(crds), "rbac", "capr_role.yaml")},
	})
	if err != nil {
		return nil, err
	}
	removeAbandonedDirs()
	dir, err := os.MkdirTemp("", sandboxDirPrefix)
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		_ = env.Stop()
		return nil, err
	}
	s := &Sandbox{
		Env: env, Client: env.Client, dir: dir, etcdBinary: filepath.Join(assets, "etcd"),
		clusters: map[types.NamespacedName]*WorkloadCluster{}, kubelets: map[string]*Kubelet{},
		Log: &EventLog{}, opts: opts,
	}
	if err := s.startProviders(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if opts.WithoutManagerIdentity && opts.Provider != ProviderKubeadm {
		// The rendered components' manager role is aggregated (config/rbac): only
		// kube-controller-manager's aggregation controller gives it its rules.
		if s.kcm, err = env.StartKubeControllerManager(ctx, capienv.KubeControllerManagerOptions{
			Controllers: []string{capienv.ClusterRoleAggregationController}}); err != nil {
			s.Stop()
			return nil, err
		}
	}
	if opts.Provider == ProviderKubeadm {
		if s.apiServerCert, err = startAPIServerCertEndpoint(); err != nil {
			s.Stop()
			return nil, err
		}
		controllers := capienv.DefaultKubeControllerManagerControllers
		if opts.WithoutManagerIdentity {
			controllers = append(slices.Clone(controllers), capienv.ClusterRoleAggregationController)
		}
		if opts.Storage {
			for _, c := range storage.Controllers {
				if !slices.Contains(controllers, c) {
					controllers = append(slices.Clone(controllers), c)
				}
			}
		}
		if s.kcm, err = env.StartKubeControllerManager(ctx, capienv.KubeControllerManagerOptions{
			NodeMonitorGracePeriod: NodeMonitorGracePeriod, Controllers: controllers}); err != nil {
			s.Stop()
			return nil, err
		}
		if err := s.startCAPI(ctx, opts.CAPI); err != nil {
			s.Stop()
			return nil, err
		}
	}
	if opts.Storage {
		// With the kubeadm providers kube-controller-manager runs already, with the storage
		// controllers added above; otherwise the stack brings its own.
		if s.Storage, err = storage.StartStackWith(ctx, env, storage.StackOptions{
			WithoutKubeControllerManager: opts.Provider == ProviderKubeadm}); err != nil {
			s.Stop()
			return nil, fmt.Errorf("starting storage failover's components: %w", err)
		}
	}
	return s, nil
}

// Provider returns the providers the sandbox runs.
func (s *Sandbox) Provider() Provider { return s.opts.Provider }

func (s *Sandbox) startProviders(ctx context.Context) error {
	mgr, err := ctrl.NewManager(s.Env.Config, ctrl.Options{
		Scheme:                  s.Env.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		GracefulShutdownTimeout: ptr.To(2 * time.Second),
		Controller:              ctrlConfigSkipNameValidation(),
	})
	if err != nil {
		return fmt.Errorf("creating the sandbox providers' manager: %w", err)
	}
	if s.opts.Provider == ProviderKubeadm {
		if err := ctrl.NewControllerManagedBy(mgr).Named("sandbox-infra-machine").
			For(&infrav1.SandboxMachine{}).WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
			Complete(&infraMachineReconciler{s: s, c: mgr.GetClient()}); err != nil {
			return err
		}
	} else {
		if err := ctrl.NewControllerManagedBy(mgr).Named("sandbox-controlplane").
			For(&controlplanev1.SandboxControlPlane{}).Owns(&clusterv1.Machine{}).
			Complete(&controlPlaneReconciler{s: s, c: mgr.GetClient()}); err != nil {
			return err
		}
		if err := ctrl.NewControllerManagedBy(mgr).Named("sandbox-machine").
			For(&clusterv1.Machine{}).WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
			Complete(&machineReconciler{s: s, c: mgr.GetClient()}); err != nil {
			return err
		}
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("sandbox-reboot").
		For(Reboot("", "")).
		Complete(&rebootReconciler{s: s, c: mgr.GetClient()}); err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(ctx)
	s.stopManager = cancel
	s.managerDone = make(chan error, 1)
	go func() { s.managerDone <- mgr.Start(mctx) }()
	return nil
}

// Stop stops the providers, every etcd member and kubelet, and the API server.
func (s *Sandbox) Stop() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
	if s.stopManager != nil {
		s.stopManager()
		<-s.managerDone
	}
	s.mu.Lock()
	for _, k := range s.kubelets {
		k.Stop()
	}
	for _, c := range s.clusters {
		c.Etcd.Stop()
	}
	s.mu.Unlock()
	if s.apiServerCert != nil {
		s.apiServerCert.Stop()
	}
	if s.Storage != nil {
		s.Storage.Stop()
	}
	if s.kcm != nil {
		s.kcm.Stop()
	}
	_ = s.Env.Stop()
	_ = os.RemoveAll(s.dir)
}

// DestroyCluster stops a workload cluster's etcd members and kubelets and forgets it; its objects
// stay in the API server (long runs create many clusters and must not keep their processes). On the
// full stack the Cluster is paused first, so CAPI's controllers stop working on it.
func (s *Sandbox) DestroyCluster(ctx context.Context, wc *WorkloadCluster) {
	if s.opts.Provider == ProviderKubeadm {
		cluster := &clusterv1.Cluster{}
		if err := s.Client.Get(ctx, wc.Key(), cluster); err == nil {
			base := cluster.DeepCopy()
			cluster.Spec.Paused = ptr.To(true)
			_ = s.Client.Patch(ctx, cluster, client.MergeFrom(base))
		}
	}
	list := &clusterv1.MachineList{}
	_ = s.Client.List(ctx, list, client.InNamespace(wc.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: wc.Name})
	s.mu.Lock()
	for _, m := range list.Items {
		if k := s.kubelets[m.Name]; k != nil {
			k.Stop()
			delete(s.kubelets, m.Name)
		}
	}
	delete(s.clusters, types.NamespacedName{Namespace: wc.Namespace, Name: wc.Name})
	s.mu.Unlock()
	wc.Etcd.Stop()
	if s.opts.Provider == ProviderKubeadm {
		// Its Nodes go too: kube-controller-manager's node lifecycle controller judges a zone by the
		// share of unready Nodes, and a destroyed cluster's Nodes must not count against the next one.
		for _, m := range list.Items {
			if m.Status.NodeRef.IsDefined() {
				_ = s.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.Status.NodeRef.Name}})
			}
		}
	}
}

// Cluster returns the workload cluster namespace/name made by CreateCluster (nil if there is none).
func (s *Sandbox) Cluster(namespace, name string) *WorkloadCluster { return s.cluster(namespace, name) }

func (s *Sandbox) cluster(namespace, name string) *WorkloadCluster {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clusters[types.NamespacedName{Namespace: namespace, Name: name}]
}

// ClusterSpec describes a sandbox workload cluster.
type ClusterSpec struct {
	Namespace    string
	Name         string
	ControlPlane int32
	Workers      int
	// ExternalEtcd (full stack only) runs etcd outside the control-plane Machines: a cluster of
	// ExternalEtcdMembers started with the Cluster, which KCP's
	// spec.kubeadmConfigSpec.clusterConfiguration.etcd.external points to. The Machines then join
	// no member and run no etcd static pod.
	ExternalEtcd bool
	// Topology (full stack with CAPIOptions.Topology only) builds the Cluster from a ClusterClass
	// (TopologySpec) instead of a hand-built KubeadmControlPlane and MachineDeployment.
	Topology *TopologySpec
}

// CreateCluster creates a Cluster with a SandboxControlPlane of spec.ControlPlane replicas and
// spec.Workers worker Machines, and waits until every Machine has a Node and every control-plane
// Machine's etcd member votes.
func (s *Sandbox) CreateCluster(ctx context.Context, spec ClusterSpec) (*WorkloadCluster, error) {
	wc, err := s.createCluster(ctx, spec)
	if err != nil && wc != nil {
		// A cluster that did not come up stops what it started: its processes would load the
		// machine for every test after it.
		s.DestroyCluster(ctx, wc)
		return nil, err
	}
	return wc, err
}

func (s *Sandbox) createCluster(ctx context.Context, spec ClusterSpec) (*WorkloadCluster, error) {
	etcdDir := filepath.Join(s.dir, spec.Namespace+"-"+spec.Name)
	if err := os.MkdirAll(etcdDir, 0o700); err != nil {
		return nil, err
	}
	ec, err := NewEtcdCluster(etcdDir, s.etcdBinary)
	if err != nil {
		return nil, err
	}
	if spec.ExternalEtcd && s.opts.Provider != ProviderKubeadm {
		return nil, errors.New("ExternalEtcd needs the full stack (ProviderKubeadm): the sandbox control-plane provider runs stacked etcd only")
	}
	if spec.Topology != nil && (s.opts.Provider != ProviderKubeadm || !s.opts.CAPI.Topology) {
		return nil, errors.New("ClusterSpec.Topology needs the full stack with CAPI's topology controllers (ProviderKubeadm, CAPIOptions.Topology)")
	}
	wc := &WorkloadCluster{Namespace: spec.Namespace, Name: spec.Name, Etcd: ec, ExternalEtcd: spec.ExternalEtcd}
	s.mu.Lock()
	s.clusters[types.NamespacedName{Namespace: spec.Namespace, Name: spec.Name}] = wc
	s.mu.Unlock()

	if s.opts.Provider == ProviderKubeadm {
		if err := s.createKubeadmCluster(ctx, spec, wc); err != nil {
			return wc, err
		}
		s.Log.Add(LogKey(spec.Namespace, spec.Name), "Cluster %s created on KubeadmControlPlane: %d control-plane Machines, %d workers", spec.Name, spec.ControlPlane, spec.Workers)
		if err := s.WaitForControlPlane(ctx, wc, int(spec.ControlPlane), 5*time.Minute); err != nil {
			return wc, err
		}
		return wc, s.waitForWorkers(ctx, wc, spec.Workers)
	}
	c := s.Client
	ns, name := spec.Namespace, spec.Name
	labels := map[string]string{clusterv1.ClusterNameLabel: name}
	objs := []client.Object{
		&infrav1.SandboxCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}},
		&infrav1.SandboxMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-cp", Labels: labels}},
		&controlplanev1.SandboxControlPlane{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-cp", Labels: labels},
			Spec: controlplanev1.SandboxControlPlaneSpec{
				Replicas: ptr.To(spec.ControlPlane), Version: "v1.36.3",
				MachineTemplate: controlplanev1.MachineTemplate{Spec: controlplanev1.MachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "SandboxMachineTemplate", Name: name + "-cp"},
				}},
			},
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-etcd", Labels: labels},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{corev1.TLSCertKey: ec.caCertPEM, corev1.TLSPrivateKeyKey: ec.caKeyPEM},
		},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			return wc, fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	cluster := capienv.NewCluster(ns, name, clusterv1.ContractVersionedObjectReference{
		APIGroup: controlplanev1.GroupVersion.Group, Kind: "SandboxControlPlane", Name: name + "-cp",
	})
	cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "SandboxCluster", Name: name}
	if err := c.Create(ctx, cluster); err != nil {
		return wc, fmt.Errorf("creating Cluster: %w", err)
	}
	if err := capienv.SetClusterReady(ctx, c, cluster, capienv.InfrastructureReadyOnly); err != nil {
		return wc, err
	}
	if err := capienv.CreateKubeconfigSecret(ctx, c, s.Env.Config, cluster); err != nil {
		return wc, err
	}
	for i := range spec.Workers {
		m := capienv.NewMachine(ns, name, fmt.Sprintf("%s-worker-%d", name, i))
		if err := c.Create(ctx, m); err != nil {
			return wc, fmt.Errorf("creating worker Machine: %w", err)
		}
	}
	s.Log.Add(LogKey(ns, name), "Cluster %s created: %d control-plane Machines, %d workers", name, spec.ControlPlane, spec.Workers)
	if err := s.WaitForControlPlane(ctx, wc, int(spec.ControlPlane), 3*time.Minute); err != nil {
		return wc, err
	}
	return wc, s.waitForWorkers(ctx, wc, spec.Workers)
}

// ControlPlaneMachines returns the cluster's control-plane Machines sorted by name.
func (s *Sandbox) ControlPlaneMachines(ctx context.Context, wc *WorkloadCluster) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := s.Client.List(ctx, list, client.InNamespace(wc.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: wc.Name},
		client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// WaitForControlPlane waits until the cluster has exactly n control-plane Machines, none deleting,
// all with Nodes, and n healthy voting etcd members named after those Nodes (with external etcd:
// every external member healthy and voting).
func (s *Sandbox) WaitForControlPlane(ctx context.Context, wc *WorkloadCluster, n int, timeout time.Duration) error {
	err := poll(ctx, timeout, func() (bool, string) {
		machines, err := s.ControlPlaneMachines(ctx, wc)
		if err != nil {
			return false, err.Error()
		}
		if len(machines) != n {
			return false, fmt.Sprintf("%d control-plane Machines, want %d", len(machines), n)
		}
		for _, m := range machines {
			if !m.DeletionTimestamp.IsZero() || !m.Status.NodeRef.IsDefined() {
				return false, "Machine " + m.Name + " is not provisioned or is deleting"
			}
		}
		state, err := s.EtcdState(ctx, wc)
		if err != nil {
			return false, err.Error()
		}
		c := state.Counts()
		if wc.ExternalEtcd {
			if want := len(ExternalEtcdMembers); c.Voting != want || c.Healthy != want {
				return false, fmt.Sprintf("external etcd has %d voting members (%d healthy), want %d", c.Voting, c.Healthy, want)
			}
			return true, ""
		}
		if c.Voting != n || c.Healthy != n || c.Learners != 0 {
			return false, fmt.Sprintf("etcd has %d voting (%d healthy), %d learners%s", c.Voting, c.Healthy, c.Learners, unhealthyMembers(state))
		}
		for _, m := range machines {
			if state.ByName(m.Status.NodeRef.Name) == nil {
				return false, "no etcd member for " + m.Name
			}
		}
		return true, ""
	})
	if err != nil {
		return fmt.Errorf("%w\netcd member processes:%s", err, wc.Etcd.Diagnose())
	}
	return nil
}

// unhealthyMembers names the members that are not healthy, with etcdutil's reason.
func unhealthyMembers(state *etcdutil.State) string {
	var out []string
	for _, m := range state.Members {
		if !m.Healthy {
			out = append(out, fmt.Sprintf("%s %x (%s)", m.Name, m.ID, m.Problem))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "; not healthy: " + strings.Join(out, ", ")
}

func (s *Sandbox) waitForWorkers(ctx context.Context, wc *WorkloadCluster, n int) error {
	return poll(ctx, time.Minute, func() (bool, string) {
		list := &clusterv1.MachineList{}
		if err := s.Client.List(ctx, list, client.InNamespace(wc.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: wc.Name}); err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, m := range list.Items {
			if _, cp := m.Labels[clusterv1.MachineControlPlaneLabel]; !cp && m.Status.NodeRef.IsDefined() {
				ready++
			}
		}
		return ready == n, fmt.Sprintf("%d of %d workers provisioned", ready, n)
	})
}

// EtcdState inspects the cluster's etcd directly (the ground truth, not through kubelets).
func (s *Sandbox) EtcdState(ctx context.Context, wc *WorkloadCluster) (*etcdutil.State, error) {
	// The test's view, not CAPR's: generous timeouts, so that a member that is running but slow to
	// answer on a loaded machine (CI once saw a 2 s dial to the one survivor expire) is not taken for
	// an unreachable one.
	direct := wc.Etcd.Direct()
	direct.DialTimeout = 10 * time.Second
	ec := &etcdutil.Cluster{Connector: direct, CallTimeout: 2 * time.Second}
	names := make([]string, 0)
	for n := range wc.Etcd.Endpoints() {
		if wc.Etcd.Running(n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, errors.New("no etcd member is running")
	}
	return ec.Inspect(ctx, names)
}

// Faults.

// NodeMonitorGracePeriod is the full stack's kube-controller-manager --node-monitor-grace-period: a
// Node whose Lease is not renewed for this long gets Ready=Unknown and the unreachable taints.
const NodeMonitorGracePeriod = 8 * time.Second

// KillEtcdMember kills the etcd process of a control-plane Machine's Node; kubelet and Node stay up
// (on the full stack the kubelet reports the etcd static pod's container as down).
func (s *Sandbox) KillEtcdMember(wc *WorkloadCluster, node string) {
	wc.Etcd.Kill(node)
	s.Log.Add(wc.LogKey(), "FAULT: etcd member %s killed (its node and kubelet stay up)", node)
	s.setEtcdPod(context.Background(), wc, node, false)
}

// AlarmEtcdMember raises etcd's NOSPACE alarm for the member of a control-plane Machine's Node (a
// degraded member: etcd raises it itself when the member's backend exceeds its quota). Its process,
// kubelet and Node stay up, so only a check of etcd's alarms sees it: KCP's EtcdMemberHealthy ("Etcd
// reports alarms: NOSPACE") and CAPR's checks.etcdMember ("alarmed (NOSPACE)").
func (s *Sandbox) AlarmEtcdMember(ctx context.Context, wc *WorkloadCluster, node string) error {
	if err := wc.Etcd.ActivateAlarm(ctx, node, etcdserverpb.AlarmType_NOSPACE); err != nil {
		return err
	}
	s.Log.Add(wc.LogKey(), "FAULT: etcd alarm NOSPACE raised for member %s (its process, node and kubelet stay up)", node)
	return nil
}

// setEtcdPod reports the etcd static pod of a Node up or down, as its kubelet would on the full
// stack (nothing to report otherwise).
func (s *Sandbox) setEtcdPod(ctx context.Context, wc *WorkloadCluster, node string, up bool) {
	if s.opts.Provider != ProviderKubeadm {
		return
	}
	if err := setMirrorPod(ctx, s.Client, node, "etcd", up); err != nil {
		s.Log.Add(wc.LogKey(), "kubelet of %s could not report the etcd pod (up: %t): %v", node, up, err)
	}
}

// BlackHoleNode powers a control-plane Machine's node off behind a network that accepts and never
// answers (a powered-off VM behind a load balancer, or a hung port-forward): its etcd member is
// killed, its heartbeat stops, and its kubelet's address accepts connections that are never answered,
// so every dial of its member through the API server costs the caller's whole dial timeout.
func (s *Sandbox) BlackHoleNode(ctx context.Context, wc *WorkloadCluster, node string) error {
	wc.Etcd.Kill(node)
	return s.silence(ctx, wc, node, "FAULT: node %s black-holed (etcd member killed, kubelet accepts and never answers)")
}

// FreezeNode freezes a control-plane Machine's node, as `docker pause` does on kind: its etcd member
// is stopped (SIGSTOP) but stays a process whose sockets the kernel keeps open, its heartbeat stops,
// and its kubelet's address accepts connections that are never answered. Unlike BlackHoleNode, the
// member's peers keep their connections to it.
func (s *Sandbox) FreezeNode(ctx context.Context, wc *WorkloadCluster, node string) error {
	wc.Etcd.Freeze(node)
	return s.silence(ctx, wc, node, "FAULT: node %s frozen (etcd member stopped by SIGSTOP, kubelet accepts and never answers)")
}

// silence black-holes node's kubelet, logs what (a format of the node's name), and stops its
// heartbeat.
func (s *Sandbox) silence(ctx context.Context, wc *WorkloadCluster, node, what string) error {
	s.mu.Lock()
	k := s.kubelets[node]
	s.mu.Unlock()
	if k != nil {
		if err := k.BlackHole(); err != nil {
			return err
		}
	}
	s.Log.Add(wc.LogKey(), what, node)
	if s.opts.Provider == ProviderKubeadm {
		return nil // kube-controller-manager's node lifecycle controller notices the silence
	}
	return capienv.SetNodeReady(ctx, s.Client, node, corev1.ConditionUnknown)
}

// StopKubelet stops a Node's kubelet stand-in and its heartbeat (Ready=Unknown, as the node
// lifecycle controller would set). Its etcd member keeps running but cannot be reached through the
// API server any more.
func (s *Sandbox) StopKubelet(ctx context.Context, wc *WorkloadCluster, node string) error {
	s.mu.Lock()
	k := s.kubelets[node]
	s.mu.Unlock()
	if k != nil {
		k.Stop()
	}
	s.Log.Add(wc.LogKey(), "FAULT: kubelet on %s stopped (etcd there still runs)", node)
	if s.opts.Provider == ProviderKubeadm {
		return nil // kube-controller-manager's node lifecycle controller notices the silence
	}
	return capienv.SetNodeReady(ctx, s.Client, node, corev1.ConditionUnknown)
}

// ControlPlaneObject reads the cluster's control-plane object: a SandboxControlPlane, or a
// KubeadmControlPlane on the full stack.
func (s *Sandbox) ControlPlaneObject(ctx context.Context, wc *WorkloadCluster) (*unstructured.Unstructured, error) {
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(controlplanev1.GroupVersion.WithKind("SandboxControlPlane"))
	if s.opts.Provider == ProviderKubeadm {
		cp.SetGroupVersionKind(kcpv1.GroupVersion.WithKind("KubeadmControlPlane"))
	}
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: wc.Name + "-cp"}, cp); err != nil {
		return nil, err
	}
	return cp, nil
}

// StripControlPlaneLock removes CAPR's lock annotation from the cluster's control-plane object, as a
// GitOps tool replacing the object (or a person) would.
func (s *Sandbox) StripControlPlaneLock(ctx context.Context, wc *WorkloadCluster) error {
	cp, err := s.ControlPlaneObject(ctx, wc)
	if err != nil {
		return err
	}
	if _, ok := cp.GetAnnotations()[caprv1.ControlPlaneLockAnnotation]; !ok {
		return nil
	}
	base := cp.DeepCopy()
	a := cp.GetAnnotations()
	delete(a, caprv1.ControlPlaneLockAnnotation)
	cp.SetAnnotations(a)
	return s.Client.Patch(ctx, cp, client.MergeFrom(base))
}

// HoldProvisioning makes new Machines of the cluster never come up (no Node, no etcd member) until
// it is called with false: an infrastructure that cannot provide a machine.
func (s *Sandbox) HoldProvisioning(wc *WorkloadCluster, hold bool) {
	wc.holdProvisioning.Store(hold)
	if hold {
		s.Log.Add(wc.LogKey(), "FAULT: new Machines no longer come up")
	} else {
		s.Log.Add(wc.LogKey(), "new Machines come up again")
	}
}

// StopHeartbeat makes a Node stop reporting (Ready=Unknown) while its etcd member stays healthy.
func (s *Sandbox) StopHeartbeat(ctx context.Context, wc *WorkloadCluster, node string) error {
	s.Log.Add(wc.LogKey(), "FAULT: node %s stopped reporting (Ready=Unknown), its etcd member is healthy", node)
	if s.opts.Provider == ProviderKubeadm {
		// The real thing: the kubelet stops renewing its Lease and kube-controller-manager's node
		// lifecycle controller sets Ready=Unknown and the unreachable taints after its grace period.
		k, err := s.kubeletOf(node)
		if err != nil {
			return err
		}
		k.StopHeartbeat()
		return nil
	}
	return capienv.SetNodeReady(ctx, s.Client, node, corev1.ConditionUnknown)
}

// EtcdMachine returns the first of machines whose Node hosts etcd's current leader (leader) or a
// follower (!leader), as etcd itself says (EtcdState).
func (s *Sandbox) EtcdMachine(ctx context.Context, wc *WorkloadCluster, machines []clusterv1.Machine, leader bool) (*clusterv1.Machine, error) {
	state, err := s.EtcdState(ctx, wc)
	if err != nil {
		return nil, err
	}
	l := state.ByID(state.LeaderID)
	if l == nil {
		return nil, errors.New("no etcd leader")
	}
	for i := range machines {
		if (machines[i].Status.NodeRef.Name == l.Name) == leader {
			return &machines[i], nil
		}
	}
	return nil, fmt.Errorf("no Machine for a member with leader=%t (leader %s)", leader, l.Name)
}

// ReportNotReady makes a Node's kubelet report Ready=False, as a kubelet whose container network
// plugin is down does, while it keeps running: its Lease renewed, its static pods reported running,
// its etcd member healthy. The node lifecycle controller sees a live kubelet and leaves the condition
// as posted (no unreachable taint), so KCP still sees the Machine's control-plane components healthy.
func (s *Sandbox) ReportNotReady(ctx context.Context, wc *WorkloadCluster, node string) error {
	s.Log.Add(wc.LogKey(), "FAULT: node %s reports NotReady (container network down); its kubelet, static pods and etcd member keep running", node)
	return capienv.SetNodeReady(ctx, s.Client, node, corev1.ConditionFalse)
}

// ResumeHeartbeat undoes StopHeartbeat: the node reports again (its Lease renewed and Ready=True, as
// a kubelet posts it), so health checks see it recover.
func (s *Sandbox) ResumeHeartbeat(ctx context.Context, wc *WorkloadCluster, node string) error {
	s.Log.Add(wc.LogKey(), "node %s reports again (Ready=True)", node)
	if s.opts.Provider == ProviderKubeadm {
		k, err := s.kubeletOf(node)
		if err != nil {
			return err
		}
		k.startHeartbeat(s.Client, node)
	}
	return capienv.SetNodeReady(ctx, s.Client, node, corev1.ConditionTrue)
}

// kubeletOf returns the kubelet stand-in of a Node.
func (s *Sandbox) kubeletOf(node string) (*Kubelet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.kubelets[node]; k != nil {
		return k, nil
	}
	return nil, fmt.Errorf("node %s has no kubelet", node)
}

// EventLog is a list of timestamped world events.
type EventLog struct {
	mu     sync.Mutex
	events []Event
}

// Event is one thing that happened.
type Event struct {
	Time time.Time
	// Cluster is the Cluster's LogKey.
	Cluster string
	Text    string
}

// Add records an event.
func (l *EventLog) Add(cluster, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, Event{Time: time.Now(), Cluster: cluster, Text: fmt.Sprintf(format, args...)})
}

// Since returns the events of cluster recorded after t.
func (l *EventLog) Since(cluster string, t time.Time) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.events {
		if e.Cluster == cluster && e.Time.After(t) {
			out = append(out, e)
		}
	}
	return out
}

// Find returns the time of the first event of cluster after t whose text contains substr.
func (l *EventLog) Find(cluster string, t time.Time, substr string) (time.Time, bool) {
	for _, e := range l.Since(cluster, t) {
		if strings.Contains(e.Text, substr) {
			return e.Time, true
		}
	}
	return time.Time{}, false
}

func poll(ctx context.Context, timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, msg := cond()
		if ok {
			return nil
		}
		last = msg
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s: %s", timeout, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

func isAlreadyExists(err error) bool { return apierrors.IsAlreadyExists(err) }

// EtcdRunning reports whether the etcd process of a Node runs.
func (s *Sandbox) EtcdRunning(wc *WorkloadCluster, node string) bool { return wc.Etcd.Running(node) }

const (
	sandboxDirPrefix = "capr-sandbox-"
	// ownerFile holds the PID of the process that owns a sandbox directory.
	ownerFile = "owner.pid"
)

// removeAbandonedDirs deletes the directories (etcd data: 64 MB of WAL per member) of sandboxes
// whose process died without stopping them, e.g. a test binary killed at its timeout: they would
// otherwise fill the disk over a long fault-suite campaign.
func removeAbandonedDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), sandboxDirPrefix+"*"))
	for _, dir := range dirs {
		pid, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours to judge (an older layout, or being created)
		}
		n, err := strconv.Atoi(string(pid))
		if err != nil || n <= 0 {
			continue
		}
		if err := syscall.Kill(n, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}
