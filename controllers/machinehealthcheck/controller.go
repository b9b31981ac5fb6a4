package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/paused"
	"sigs.k8s.io/cluster-api/util/predicates"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// Finalizer lets the health check clear its marks when it is deleted; a mark left behind would read
// as a request for remediation to every other health check.
const Finalizer = "remediation.cluster.x-k8s.io/machinehealthcheck"

// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machinehealthchecks,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machinehealthchecks/status,verbs=patch
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediationtemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines/status,verbs=patch
// +kubebuilder:rbac:groups=core;events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=kubeadmcontrolplanes,verbs=get;list;watch

// Reconciler reconciles a CAPR MachineHealthCheck: it marks unhealthy Machines, clears marks of
// healthy ones and creates one remediation request per marked Machine when the limits allow.
type Reconciler struct {
	Client       client.Client
	ClusterCache clustercache.ClusterCache
	// APIReader reads a Machine again from the API server when a write of its mark meets a newer
	// version than the cache's (updateMark); Client when nil.
	APIReader client.Reader

	// EtcdMembers, when set, reports the etcd member health of control-plane Machines for
	// checks.etcdMember. When nil the check is not run.
	EtcdMembers EtcdMemberSource

	// WatchFilterValue is the label value used to filter events prior to reconciliation.
	WatchFilterValue string

	controller controller.Controller
	recorder   events.EventRecorder
	// writes bounds the Machine writes in flight (maxParallelWrites).
	writes writeSlots
	// state is what this process keeps between reconciles; losing it is safe (processState).
	state processState
}

// SetupWithManager registers the controller and its watches. Machines must be indexed by
// index.MachineNodeNameField (index.ByMachineNode) for the Node watch.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil || r.ClusterCache == nil {
		return errors.New("client and ClusterCache must not be nil")
	}
	log := ctrl.LoggerFrom(ctx).WithValues("controller", "capr-machinehealthcheck")
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named("capr-machinehealthcheck").
		For(&caprv1.MachineHealthCheck{}, builder.WithPredicates(healthCheckChanged())).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.machineToHealthChecks),
			builder.WithPredicates(machineChanged())).
		Watches(&caprv1.MachineHealthCheck{}, handler.EnqueueRequestsFromMapFunc(r.healthCheckToOverlapping),
			builder.WithPredicates(selectionChanged())).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.clusterToHealthChecks)).
		Watches(&caprv1.MachineRemediation{}, handler.EnqueueRequestsFromMapFunc(r.requestToHealthChecks),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }})).
		WatchesRawSource(r.ClusterCache.GetClusterSource("capr-machinehealthcheck", r.connectionToHealthChecks)).
		WithEventFilter(predicates.ResourceHasFilterLabel(mgr.GetScheme(), log, r.WatchFilterValue)).
		WithOptions(options).
		Build(r)
	if err != nil {
		return fmt.Errorf("setting up the MachineHealthCheck controller: %w", err)
	}
	r.controller = c
	r.recorder = mgr.GetEventRecorder("capr-machinehealthcheck")
	return nil
}

// Reconcile implements the reconcile skeleton: get → cluster → patch helper → paused → deferred
// patch of owned conditions → reconcileNormal / reconcileDelete.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	defer func() {
		switch {
		case errors.Is(ctx.Err(), context.Canceled):
			reterr = nil // shutting down: whoever runs next starts from the API's state
		case ctx.Err() != nil && reterr == nil:
			// The reconcile timeout (controllers.DefaultReconcileTimeout) cut the round short: an
			// error, so that the health check is reconciled again, with backoff, instead of at the
			// next event.
			reterr = fmt.Errorf("reconciling MachineHealthCheck: %w", context.Cause(ctx))
		}
	}()
	mhc := &caprv1.MachineHealthCheck{}
	if err := r.Client.Get(ctx, req.NamespacedName, mhc); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.forgetGone(ctx, req.NamespacedName) // also when its finalizer was removed by hand
		}
		return ctrl.Result{}, fmt.Errorf("reading MachineHealthCheck: %w", err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("Cluster", klog.KRef(mhc.Namespace, mhc.Spec.ClusterName))
	ctx = ctrl.LoggerInto(ctx, log)

	cluster, err := util.GetClusterByName(ctx, r.Client, mhc.Namespace, mhc.Spec.ClusterName)
	if err != nil && (!apierrors.IsNotFound(err) || mhc.DeletionTimestamp.IsZero()) {
		return ctrl.Result{}, fmt.Errorf("reading Cluster %s of MachineHealthCheck: %w", mhc.Spec.ClusterName, err)
	}

	helper, err := patch.NewHelper(mhc, r.Client)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("creating patch helper: %w", err)
	}

	if !mhc.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, helper, mhc)
	}

	if isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, mhc); err != nil || isPaused || requeue {
		if err == nil && !isPaused && requeue {
			// Paused=False was just patched: a status update, which starts no round
			// (healthCheckChanged), so the round is queued here.
			return ctrl.Result{RequeueAfter: time.Millisecond}, nil
		}
		return ctrl.Result{}, err
	}

	before := mhc.Status.DeepCopy()
	defer func() {
		if reterr == nil && mhc.Generation == before.ObservedGeneration && countsOnly(before, &mhc.Status) {
			if wait := r.state.statusWrites.wait(req.NamespacedName, time.Now()); wait > 0 {
				keepCounts(&mhc.Status, before) // written by the round that runs then
				res.RequeueAfter = sooner(res.RequeueAfter, wait)
			}
		}
		statusChanged := mhc.Generation != before.ObservedGeneration || !equality.Semantic.DeepEqual(before, &mhc.Status)
		opts := []patch.Option{patch.WithOwnedConditions{Conditions: []string{
			caprv1.MachineHealthCheckPausedCondition, caprv1.MachineHealthCheckRemediationAllowedCondition, caprv1.MachineHealthCheckWorkloadClusterReachableCondition,
			caprv1.MachineHealthCheckStormCooldownCondition, caprv1.MachineHealthCheckRemediationTemplatesValidCondition,
			caprv1.MachineHealthCheckTargetsOverlapCondition,
		}}}
		if reterr == nil {
			opts = append(opts, patch.WithStatusObservedGeneration{})
		}
		if err := helper.Patch(ctx, mhc, opts...); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, fmt.Errorf("patching MachineHealthCheck: %w", err)})
		} else if statusChanged {
			r.state.statusWrites.wrote(req.NamespacedName, time.Now())
		}
	}()

	// The finalizer is added before any mark is written, so a mark never outlives its writer.
	if controllerutil.AddFinalizer(mhc, Finalizer) {
		return ctrl.Result{}, nil
	}
	return r.reconcileNormal(ctx, cluster, mhc)
}

// reconcileNormal runs one health-check round, in phases: reach the workload cluster, read the
// targets (and etcd), evaluate each target, decide the limits, apply marks and requests, report.
func (r *Reconciler) reconcileNormal(ctx context.Context, cluster *clusterv1.Cluster, mhc *caprv1.MachineHealthCheck) (ctrl.Result, error) {
	now := time.Now()
	adoptByCluster(mhc, cluster)
	// A selector that does not parse is the health check's own fault, not the workload cluster's: it
	// is reported as such, and the round waits for the spec to change (which starts the next round).
	if _, err := r.state.selectors.of(mhc); err != nil {
		r.setInvalidSelector(ctx, mhc, err)
		return ctrl.Result{}, nil
	}
	templatesRetry := r.checkTemplates(ctx, mhc, now)
	facts, cfg := factsOf(cluster), configOf(mhc)

	remote, wait := r.reachWorkloadCluster(ctx, cluster, mhc, facts, now)
	if wait != nil {
		return *wait, nil
	}
	key := client.ObjectKeyFromObject(mhc)
	valid := evalCacheKey{uid: mhc.UID, generation: mhc.Generation, facts: facts}
	ec, work, full := r.state.evalCaches.begin(key, valid, now)
	// The etcd member check observes every control-plane target's member, and etcd is polled, not
	// watched: such a health check always runs full passes.
	full = full || cfg.etcdMemberTimeout > 0
	finished := false
	defer func() {
		if !finished {
			// What a round that did not finish wrote is not known: the next one starts over.
			r.state.evalCaches.invalidate(key)
		}
	}()
	obs, err := r.observe(ctx, cluster, mhc, remote, cfg, facts, ec, valid, work, full, now)
	if err != nil {
		if remote != nil && isUnreachable(err) {
			r.setUnreachable(mhc, err)
			return ctrl.Result{RequeueAfter: unreachableRequeue}, nil
		}
		return ctrl.Result{}, err
	}
	rd, excluded, etcdState, cp, cpErr := obs.rd, obs.excluded, obs.etcd, obs.cp, obs.cpErr
	overlaps, err := r.overlaps(ctx, mhc, rd.targets)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.setTargetsOverlap(mhc, overlaps, full)

	lim, err := r.decideLimits(mhc, rd, etcdState, cp, cpErr, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	applied, applyErr := r.applyMarksAndRequests(ctx, cluster, mhc, cfg, rd, lim, excluded)
	r.updateStatus(mhc, rd, lim, applied.restricted)
	if applyErr != nil {
		return ctrl.Result{}, applyErr
	}
	// A withdrawal that met a newer request is tried again in the next round, from a full pass.
	finished = !applied.requestChanged
	requeue := sooner(rd.requeueAfter(cfg), templatesRetry)
	requeue = sooner(requeue, fullPassInterval)
	if applied.requestChanged {
		requeue = sooner(requeue, requestChangedRequeue)
	}
	if applied.standIn {
		requeue = sooner(requeue, standInRecheck)
	}
	if applied.requestsDeferred {
		requeue = sooner(requeue, deferredRequestsRequeue)
	}
	if lim.cooldownEnds > 0 {
		requeue = sooner(requeue, lim.cooldownEnds+requeueMargin)
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// sooner returns the shorter of two requeue intervals, 0 meaning none.
func sooner(a, b time.Duration) time.Duration {
	if a == 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// adoptByCluster labels the health check with its cluster's name and makes the Cluster its owner.
func adoptByCluster(mhc *caprv1.MachineHealthCheck, cluster *clusterv1.Cluster) {
	if mhc.Labels == nil {
		mhc.Labels = map[string]string{}
	}
	mhc.Labels[clusterv1.ClusterNameLabel] = mhc.Spec.ClusterName
	mhc.OwnerReferences = util.EnsureOwnerRef(mhc.OwnerReferences, metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID,
	})
}
