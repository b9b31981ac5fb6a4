package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation"
)

// unreachableRequeue is how often an unreachable workload cluster is looked at again, on top of the
// ClusterCache's own reconnect events.
const unreachableRequeue = 30 * time.Second

// firstConnectionRequeue is how often the health check looks again while the ClusterCache has not
// connected to a workload cluster for the first time yet (it also enqueues on connect).
const firstConnectionRequeue = 2 * time.Second

// reachWorkloadCluster returns a client of the workload cluster (nil before the control plane is
// initialized, when only control-plane Machines are checked, for node startup) and sets
// WorkloadClusterReachable. A cluster that cannot be reached marks nothing: a network partition must
// never produce a wave of remediations. When wait is not nil the round ends here with that result.
func (r *Reconciler) reachWorkloadCluster(ctx context.Context, cluster *clusterv1.Cluster, mhc *caprv1.MachineHealthCheck, facts clusterFacts, now time.Time) (remote client.Client, wait *ctrl.Result) {
	if !facts.controlPlaneInitialized {
		r.setStatusCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckWorkloadClusterReachableCondition, Status: metav1.ConditionFalse,
			Reason:  caprv1.MachineHealthCheckControlPlaneNotInitializedReason,
			Message: "The control plane is not initialized yet: only control-plane Machines are checked, for node startup"})
		return nil, nil
	}
	key := client.ObjectKeyFromObject(cluster)
	remote, err := r.ClusterCache.GetClient(ctx, key)
	if err == nil {
		err = r.watchClusterNodes(ctx, cluster)
	}
	if err != nil {
		if r.state.firstConnection.waiting(ctx, r.ClusterCache, key, err, now) {
			// Nothing is marked either way; only the report waits for a real answer.
			ctrl.LoggerFrom(ctx).V(4).Info("Waiting for the first connection to the workload cluster", "err", err.Error())
			return nil, &ctrl.Result{RequeueAfter: firstConnectionRequeue}
		}
		r.setUnreachable(mhc, err)
		return nil, &ctrl.Result{RequeueAfter: unreachableRequeue}
	}
	r.state.firstConnection.done(key)
	r.setStatusCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckWorkloadClusterReachableCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineHealthCheckWorkloadClusterReachableReason})
	return remote, nil
}

// observation is what a round read and evaluated.
type observation struct {
	rd       *round
	excluded []*clusterv1.Machine
	cp       *unstructured.Unstructured
	cpErr    error
	etcd     etcdQuorum
}

// observe reads and evaluates the targets. A full pass reads and evaluates every target (and etcd)
// and rebuilds the evaluation cache; otherwise only the Machines in work are read and evaluated (changed since
// the last round, or watched: evalcache.go), and the counts come from the cache.
func (r *Reconciler) observe(ctx context.Context, cluster *clusterv1.Cluster, mhc *caprv1.MachineHealthCheck, remote client.Client, cfg checkConfig,
	facts clusterFacts, ec *evalCache, valid evalCacheKey, work []string, full bool, now time.Time) (observation, error) {
	var o observation
	if full {
		targets, excluded, err := r.getTargets(ctx, remote, mhc)
		if err != nil {
			return o, err
		}
		if hasControlPlaneTarget(targets) {
			o.cp, o.cpErr = r.controlPlaneObject(ctx, cluster)
		}
		o.etcd = r.observeEtcd(ctx, cluster, cfg, facts, targets, remediation.EtcdPlacementOf(o.cp), now)
		o.rd, o.excluded = evaluateAll(targets, cfg, facts, now), excluded
		ec.reset(o.rd, valid, now)
		metrics.HealthCheckEvaluated(mhc.Namespace, mhc.Name, metrics.PassFull, len(targets))
		return o, nil
	}
	targets, excluded, gone, err := r.getSomeTargets(ctx, remote, mhc, work)
	if err != nil {
		return o, err
	}
	o.rd, o.excluded = evaluateSome(targets, cfg, facts, now), excluded
	ec.update(targets, o.rd.evals, gone)
	ec.summarize(o.rd)
	if o.rd.cpTargets > 0 {
		o.cp, o.cpErr = r.controlPlaneObject(ctx, cluster)
	}
	metrics.HealthCheckEvaluated(mhc.Namespace, mhc.Name, metrics.PassChanged, len(targets))
	return o, nil
}

// getTargets lists the Machines selected by the health check and reads their Nodes. Selected
// Machines with CAPI's paused or skip-remediation annotation are not targets: they are returned as
// excluded.
func (r *Reconciler) getTargets(ctx context.Context, remote client.Client, mhc *caprv1.MachineHealthCheck) (targets []target, excluded []*clusterv1.Machine, _ error) {
	selector, err := r.state.selectors.of(mhc)
	if err != nil {
		return nil, nil, err
	}
	// Machines and Nodes are read from the caches without copies: a round only reads them, and a
	// mark is written from a deep copy (writeMark), so nothing here may modify them in place.
	machines := &clusterv1.MachineList{}
	if err := r.Client.List(ctx, machines, client.InNamespace(mhc.Namespace), client.MatchingLabelsSelector{Selector: selector},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing Machines: %w", err)
	}
	targets = make([]target, 0, len(machines.Items))
	for i := range machines.Items {
		m := &machines.Items[i]
		if annotations.HasPaused(m) || annotations.HasSkipRemediation(m) {
			excluded = append(excluded, m)
			continue
		}
		t, err := r.readTarget(ctx, remote, m)
		if err != nil {
			return nil, nil, err
		}
		targets = append(targets, t)
	}
	return targets, excluded, nil
}

// getSomeTargets reads the named Machines as getTargets does: the targets among them, those
// excluded, and the names of all that are no target (gone, not selected, or excluded).
func (r *Reconciler) getSomeTargets(ctx context.Context, remote client.Client, mhc *caprv1.MachineHealthCheck, names []string) (targets []target, excluded []*clusterv1.Machine, gone []string, _ error) {
	selector, err := r.state.selectors.of(mhc)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, name := range names {
		m := &clusterv1.Machine{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: mhc.Namespace, Name: name}, m, noCopy); err != nil {
			if !apierrors.IsNotFound(err) {
				return nil, nil, nil, fmt.Errorf("reading Machine %s: %w", name, err)
			}
			gone = append(gone, name)
			continue
		}
		if !selector.Matches(labels.Set(m.Labels)) {
			gone = append(gone, name)
			continue
		}
		if annotations.HasPaused(m) || annotations.HasSkipRemediation(m) {
			excluded = append(excluded, m)
			gone = append(gone, name)
			continue
		}
		t, err := r.readTarget(ctx, remote, m)
		if err != nil {
			return nil, nil, nil, err
		}
		targets = append(targets, t)
	}
	return targets, excluded, gone, nil
}

// readTarget reads the Node of a target Machine (none while the workload cluster is not reached).
func (r *Reconciler) readTarget(ctx context.Context, remote client.Client, m *clusterv1.Machine) (target, error) {
	t := target{machine: m}
	if remote == nil || !m.Status.NodeRef.IsDefined() {
		return t, nil
	}
	node := &corev1.Node{}
	if err := remote.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node, noCopy); err != nil {
		if !apierrors.IsNotFound(err) {
			return t, fmt.Errorf("reading Node %s of Machine %s: %w", m.Status.NodeRef.Name, m.Name, err)
		}
		t.nodeMissing = true
	} else {
		t.node = node
	}
	return t, nil
}

// noCopy reads from a cache without a deep copy; the object must not be modified.
var noCopy = &client.GetOptions{UnsafeDisableDeepCopy: ptr.To(true)}

func factsOf(cluster *clusterv1.Cluster) clusterFacts {
	f := clusterFacts{}
	if c := conditions.Get(cluster, clusterv1.ClusterInfrastructureReadyCondition); c != nil && c.Status == metav1.ConditionTrue {
		f.infrastructureReady, f.infrastructureReadyTime = true, c.LastTransitionTime.Time
	}
	if c := conditions.Get(cluster, clusterv1.ClusterControlPlaneInitializedCondition); c != nil && c.Status == metav1.ConditionTrue {
		f.controlPlaneInitialized, f.controlPlaneInitTime = true, c.LastTransitionTime.Time
	}
	return f
}

func configOf(mhc *caprv1.MachineHealthCheck) checkConfig {
	cfg := checkConfig{
		checker:            checkerName(mhc),
		nodeStartupTimeout: time.Duration(caprv1.DefaultNodeStartupTimeoutSeconds) * time.Second,
		nodeConditions:     mhc.Spec.Checks.UnhealthyNodeConditions,
		machineConditions:  mhc.Spec.Checks.UnhealthyMachineConditions,
	}
	if s := mhc.Spec.Checks.NodeStartupTimeoutSeconds; s != nil {
		cfg.nodeStartupTimeout = time.Duration(*s) * time.Second
	}
	cfg.nodeDeletingTimeout = time.Duration(ptr.Deref(mhc.Spec.Checks.NodeDeletingTimeoutSeconds, 0)) * time.Second
	if e := mhc.Spec.Checks.EtcdMember; e != nil {
		cfg.etcdMemberTimeout = time.Duration(ptr.Deref(e.TimeoutSeconds, caprv1.DefaultEtcdMemberTimeoutSeconds)) * time.Second
	}
	return cfg
}

// checkerName identifies a health check in the marks it writes.
func checkerName(mhc *caprv1.MachineHealthCheck) string {
	return mhc.Namespace + "/" + mhc.Name
}

// isUnreachable reports whether err means the workload cluster cannot be reached.
func isUnreachable(err error) bool {
	if errors.Is(err, clustercache.ErrClusterNotConnected) {
		return true
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsServiceUnavailable(err)
	}
	// Anything that is not an API answer (dial errors, resets) means the server was not reached.
	return true
}

// firstConnectionGrace bounds how long the health checker waits for the ClusterCache to attempt its
// first connection to a workload cluster before reporting it unreachable.
const firstConnectionGrace = time.Minute

// firstConnections records since when the health checker has been waiting for the ClusterCache's
// first connection to each workload cluster.
type firstConnections struct {
	mu    sync.Mutex
	since map[client.ObjectKey]time.Time
}

// waiting reports whether err only means that the ClusterCache has not connected to the workload
// cluster yet, as on every start: it never connected, no connection attempt has failed since the
// health checker started waiting, and the wait is shorter than firstConnectionGrace. Anything else is
// an unreachable workload cluster.
func (f *firstConnections) waiting(ctx context.Context, cc clustercache.ClusterCache, key client.ObjectKey, err error, now time.Time) bool {
	if !errors.Is(err, clustercache.ErrClusterNotConnected) {
		return false
	}
	state := cc.GetHealthCheckingState(ctx, key)
	if !state.LastProbeSuccessTime.IsZero() {
		return false // it was connected: the connection was lost
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.since == nil {
		f.since = map[client.ObjectKey]time.Time{}
	}
	since, ok := f.since[key]
	if !ok {
		since = now
		f.since[key] = now
	}
	return !state.LastProbeTime.After(since) && now.Sub(since) < firstConnectionGrace
}

// done forgets the wait once the workload cluster was reached.
func (f *firstConnections) done(key client.ObjectKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.since, key)
}
