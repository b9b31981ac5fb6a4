package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/paused"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/metrics"
)

// Finalizer lets the health check clear its marks when it is deleted; a mark left behind would read
// as a request for remediation to every other health check.
const Finalizer = "remediation.cluster.x-k8s.io/machinehealthcheck"

// unreachableRequeue is how often an unreachable workload cluster is looked at again, on top of the
// ClusterCache's own reconnect events.
const unreachableRequeue = 30 * time.Second

// firstConnectionRequeue is how often the health check looks again while the ClusterCache has not
// connected to a workload cluster for the first time yet (it also enqueues on connect).
const firstConnectionRequeue = 2 * time.Second

// etcdPollInterval is how often etcd member health is read when checks.etcdMember is set (etcd
// changes produce no Kubernetes events to react to).
const etcdPollInterval = 5 * time.Second

// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machinehealthchecks;machinehealthchecks/status;machinehealthchecks/finalizers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediationtemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines;machines/status,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=core;events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=kubeadmcontrolplanes,verbs=get;list;watch

// Reconciler reconciles a CAPR MachineHealthCheck: it marks unhealthy Machines, clears marks of
// healthy ones and creates one remediation request per marked Machine when the limits allow.
type Reconciler struct {
	Client       client.Client
	ClusterCache clustercache.ClusterCache

	// EtcdMembers, when set, reports the etcd member health of control-plane Machines for
	// checks.etcdMember. When nil the check is not run.
	EtcdMembers EtcdMemberSource

	// WatchFilterValue is the label value used to filter events prior to reconciliation.
	WatchFilterValue string

	// etcdUnhealthy remembers since when etcd members are unhealthy (machinehealthcheck_etcd.go).
	etcdUnhealthy etcdSince

	controller controller.Controller
	recorder   events.EventRecorder
	// reported and firstConnection hold what this process has seen between reconciles; their zero
	// values are ready to use.
	reported        reportedReasons
	firstConnection firstConnections
	templates       templateChecks
	writes          writeSlots
	memories        memories
	created         createdRequests
	statusWrites    statusWrites
	newMarks        newMarks
	machineEvents   machineEventBudget
	selectors       selectors
}

// EtcdMemberSource reports, per Node name, the health of the etcd members of a cluster.
type EtcdMemberSource interface {
	MemberHealth(ctx context.Context, cluster *clusterv1.Cluster) (map[string]EtcdMemberHealth, error)
}

// EtcdMemberHealth is the health of one etcd member, as seen now.
type EtcdMemberHealth struct {
	Healthy bool
	// Problem says what is wrong, e.g. "unreachable", "missing", "alarmed (NOSPACE)", "a learner".
	// "has no leader" and "a learner" also decide the etcd quorum (quorumOf).
	Problem string
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
			if wait := r.statusWrites.wait(req.NamespacedName, time.Now()); wait > 0 {
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
			r.statusWrites.wrote(req.NamespacedName, time.Now())
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
	// is said as such, and the round waits for the spec to change (which starts the next round).
	if _, err := r.selectors.of(mhc); err != nil {
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
	valid := memoryKey{uid: mhc.UID, generation: mhc.Generation, facts: facts}
	mem, work, full := r.memories.begin(key, valid, now)
	// The etcd member check observes every control-plane target's member, and etcd is polled, not
	// watched: such a health check always runs full passes.
	full = full || cfg.etcdMemberTimeout > 0
	finished := false
	defer func() {
		if !finished {
			// What a round that did not finish wrote is not known: the next one starts over.
			r.memories.invalidate(key)
		}
	}()
	obs, err := r.observe(ctx, cluster, mhc, remote, cfg, facts, mem, valid, work, full, now)
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

// reachWorkloadCluster returns a client of the workload cluster (nil before the control plane is
// initialized, when only control-plane Machines are checked, for node startup) and sets
// WorkloadClusterReachable. A cluster that cannot be reached marks nothing: a network partition must
// never produce a wave of remediations. When wait is not nil the round ends here with that result.
func (r *Reconciler) reachWorkloadCluster(ctx context.Context, cluster *clusterv1.Cluster, mhc *caprv1.MachineHealthCheck, facts clusterFacts, now time.Time) (remote client.Client, wait *ctrl.Result) {
	if !facts.controlPlaneInitialized {
		r.setCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckWorkloadClusterReachableCondition, Status: metav1.ConditionFalse,
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
		if r.firstConnection.waiting(ctx, r.ClusterCache, key, err, now) {
			// Nothing is marked either way; only the report waits for a real answer.
			ctrl.LoggerFrom(ctx).V(4).Info("Waiting for the first connection to the workload cluster", "err", err.Error())
			return nil, &ctrl.Result{RequeueAfter: firstConnectionRequeue}
		}
		r.setUnreachable(mhc, err)
		return nil, &ctrl.Result{RequeueAfter: unreachableRequeue}
	}
	r.firstConnection.done(key)
	r.setCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckWorkloadClusterReachableCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineHealthCheckWorkloadClusterReachableReason})
	return remote, nil
}

// observeEtcd reads etcd for the etcd member check: each control-plane target's member health
// (observeEtcdMembers) and whether etcd has quorum. Without etcd state the check neither marks nor
// clears, and the quorum is unknown (the zero etcdQuorum). A round without control-plane targets
// does not read etcd at all: only control-plane targets carry etcd facts and only the control-plane
// limit uses the quorum, so reading it would only delay the marks of the workers. Nor does a round
// of a cluster whose etcd is external: its control-plane Machines have no members.
func (r *Reconciler) observeEtcd(ctx context.Context, cluster *clusterv1.Cluster, cfg checkConfig, facts clusterFacts, targets []target, placement caprv1.EtcdPlacement, now time.Time) etcdQuorum {
	if cfg.etcdMemberTimeout <= 0 || r.EtcdMembers == nil || !facts.controlPlaneInitialized || !hasControlPlaneTarget(targets) ||
		placement == caprv1.EtcdPlacementExternal {
		return etcdQuorum{}
	}
	health, err := r.EtcdMembers.MemberHealth(ctx, cluster)
	if err != nil {
		ctrl.LoggerFrom(ctx).Info("Could not read etcd member health; the etcd member check and the quorum are skipped this time", "err", err.Error())
		return etcdQuorum{}
	}
	r.observeEtcdMembers(health, targets, now)
	q := quorumOf(health)
	if q.lost() {
		excuseLeaderless(targets)
	}
	return q
}

func hasControlPlaneTarget(targets []target) bool {
	for _, t := range targets {
		if util.IsControlPlaneMachine(t.machine) {
			return true
		}
	}
	return false
}

// round is what one reconcile evaluated, with the counts the limits and the status need. In a full
// pass targets are every target; in a round from memory (machinehealthcheck_memory.go) they are only
// those evaluated, and the counts and names are over every target all the same.
type round struct {
	targets []target
	evals   []evaluation
	// total is how many targets the health check has, healthy how many of them are healthy.
	total, healthy int
	// cpTargets and cpNotHealthy count the control-plane targets, and those not healthy;
	// cpStarting those not healthy only because they have no Node yet.
	cpTargets, cpNotHealthy, cpStarting int
	// names are every target's name and unhealthy those of the unhealthy targets, sorted.
	names, unhealthy []string
	// next > 0 is when the first running timeout of the targets evaluated expires.
	next time.Duration
}

// evaluateAll evaluates every target at time now.
func evaluateAll(targets []target, cfg checkConfig, facts clusterFacts, now time.Time) *round {
	rd := evaluateSome(targets, cfg, facts, now)
	var n counts
	for i, t := range targets {
		n.add(rememberedOf(t, rd.evals[i]), 1)
		if rd.evals[i].verdict == verdictUnhealthy {
			rd.unhealthy = append(rd.unhealthy, t.machine.Name)
		}
	}
	rd.total, rd.healthy, rd.cpTargets, rd.cpNotHealthy, rd.cpStarting = len(targets), n.healthy, n.cpTargets, n.cpNotHealthy, n.cpStarting
	rd.names = targetNames(targets)
	sort.Strings(rd.unhealthy)
	return rd
}

// evaluateSome evaluates the given targets at time now, without the counts.
func evaluateSome(targets []target, cfg checkConfig, facts clusterFacts, now time.Time) *round {
	rd := &round{targets: targets, evals: make([]evaluation, len(targets))}
	for i, t := range targets {
		ev := evaluate(t, cfg, facts, now)
		rd.evals[i] = ev
		if ev.nextCheck > 0 && (rd.next == 0 || ev.nextCheck < rd.next) {
			rd.next = ev.nextCheck
		}
	}
	return rd
}

// requeueMargin is how long after a timeout expires the round runs again: the work queue never fires
// early, so the round starting then sees the timeout expired (timedOut compares strictly).
const requeueMargin = 20 * time.Millisecond

// requeueAfter is when the round must run again without any event: just after the next timeout
// expiry (nextCheck less timedOut's slack, plus requeueMargin), and at least every
// etcdPollInterval when the etcd member check is on (etcd is not watched).
func (rd *round) requeueAfter(cfg checkConfig) time.Duration {
	next := rd.next
	if next > 0 {
		next = max(next-expirySlack, 0) + requeueMargin
	}
	if cfg.etcdMemberTimeout > 0 && rd.cpTargets > 0 && (next == 0 || next > etcdPollInterval) {
		next = etcdPollInterval
	}
	return next
}

// decideLimits applies triggerIf to all targets and, when there are control-plane targets, the
// control-plane limit (of cp, or cpErr why it could not be read) and the etcd quorum to them.
func (r *Reconciler) decideLimits(mhc *caprv1.MachineHealthCheck, rd *round, q etcdQuorum, cp *unstructured.Unstructured, cpErr error, now time.Time) (limits, error) {
	expected := rd.total
	trigger, err := triggerIfDecision(mhc.Spec.Remediation.TriggerIf, expected, expected-rd.healthy)
	if err != nil {
		return limits{}, err
	}
	lim := limits{}
	if c := mhc.Spec.Remediation.StormCooldownSeconds; c != nil {
		cond, decision, ends := stormCooldown(conditions.Get(mhc, caprv1.MachineHealthCheckStormCooldownCondition), time.Duration(*c)*time.Second, trigger, now)
		trigger, lim.storm, lim.cooldownEnds = decision, &cond, ends
	}
	cpLimit := limitDecision{allowed: true, limit: -1}
	if rd.cpTargets > 0 {
		cpLimit = controlPlaneLimit(cp, cpErr, trigger.limit, rd.cpNotHealthy, rd.cpStarting)
		if q.lost() {
			cpLimit = quorumLostDecision(cpLimit, q)
		}
	}
	lim.trigger, lim.controlPlane = trigger, cpLimit
	return lim, nil
}

// maxParallelWrites bounds how many Machines the health checker writes at once, over all its
// rounds (health checks reconciled in parallel share the bound, so that many health checks do not
// multiply the load on the API server). The decisions (verdicts and limits) are made for the whole
// round before anything is written, so writing in parallel changes only how soon the writes land,
// never which ones are made.
const maxParallelWrites = 16

// writeSlots is the process-wide bound on writes in flight; its zero value is ready to use.
type writeSlots struct {
	once  sync.Once
	slots chan struct{}
}

func (w *writeSlots) get() chan struct{} {
	w.once.Do(func() { w.slots = make(chan struct{}, maxParallelWrites) })
	return w.slots
}

// applyResult is what applyMarksAndRequests reports besides errors.
type applyResult struct {
	// restricted is how many unhealthy targets the limits refused a request.
	restricted int
	// requestChanged says a withdrawal met a request newer than the cache's (errRequestChanged:
	// the round is to run again soon).
	requestChanged bool
	// standIn says a created request the cache did not show yet stood in for it (listRequests):
	// the round is to run again after standInRecheck.
	standIn bool
	// requestsDeferred says the round marked Machines whose requests the next round decides
	// (machinehealthcheck_deferred.go): it is to run again at once.
	requestsDeferred bool
}

// applyMarksAndRequests writes each target's mark, requests remediation of the unhealthy targets
// the limits allow and withdraws the Pending requests of targets that are healthy again and of
// Machines no longer checked (skip-remediation, paused). It writes every mark first, then the
// requests, each pass at most maxParallelWrites at once: a Machine's request is only written
// after its own mark, and the marks, which are the health check's answer, are not queued behind
// the requests and the remediator's reaction to them. The request of a Machine marked in this round
// is left to the next round (machinehealthcheck_deferred.go), which records the mark's event.
func (r *Reconciler) applyMarksAndRequests(ctx context.Context, cluster *clusterv1.Cluster, mhc *caprv1.MachineHealthCheck, cfg checkConfig,
	rd *round, lim limits, excluded []*clusterv1.Machine) (applyResult, error) {
	requests, standIn, err := r.listRequests(ctx, mhc)
	if err != nil {
		return applyResult{}, err
	}
	var (
		mu             sync.Mutex
		errs           []error
		restricted     int
		requestChanged bool
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if errors.Is(err, errRequestChanged) {
			requestChanged = true
			return
		}
		errs = append(errs, err)
	}
	key := client.ObjectKeyFromObject(mhc)
	announce := r.newMarks.take(key) // the marks the previous round wrote
	var work []int
	for i, t := range rd.targets {
		if needsWrite(t.machine, rd.evals[i], cfg.checker, requests) {
			work = append(work, i)
		}
	}
	requestsDeferred := false
	marked, changes, requested := make([]bool, len(work)), make([]markChange, len(work)), make([]bool, len(work))
	forEachParallel(len(work), r.writes.get(), func(k int) {
		t, ev := rd.targets[work[k]], rd.evals[work[k]]
		base := t.machine
		if prev, ok := announce[base.Name]; ok && !isMarked(base, cfg.checker) {
			// The round the previous one queued at once may read the Machine before the cache shows
			// the mark written there: start from the copy written, not write the mark again.
			base = prev.machine
		}
		written, change, err := r.applyMark(ctx, base, ev, cfg.checker)
		if err != nil {
			fail(err)
			return
		}
		rd.targets[work[k]].machine = written // each call writes its own element
		marked[k], changes[k] = true, change
	})
	// The events are recorded once every mark and request is written: the recorder sends them in
	// the background, and they would otherwise compete with the remaining writes for the API server.
	defer func() {
		said := newRoundEvents(mhc, cfg.checker, &r.machineEvents)
		for k, i := range work {
			m := rd.targets[i].machine
			if changes[k] == markSet {
				r.newMarks.add(key, m, rd.evals[i]) // said by the next round, with its request
				continue
			}
			if prev, ok := announce[m.Name]; ok {
				delete(announce, m.Name)
				if requested[k] && changes[k] == markUnchanged {
					r.markEvent(ctx, said, m, markSet, true, prev.ev)
					continue
				}
				r.markEvent(ctx, said, prev.machine, markSet, false, prev.ev)
			}
			r.markEvent(ctx, said, m, changes[k], requested[k], rd.evals[i])
		}
		for _, name := range slices.Sorted(maps.Keys(announce)) { // not requested in this round
			r.markEvent(ctx, said, announce[name].machine, markSet, false, announce[name].ev)
		}
		said.flush(r.recorder)
	}()
	forEachParallel(len(work), r.writes.get(), func(k int) {
		if !marked[k] {
			return
		}
		t, ev := rd.targets[work[k]], rd.evals[work[k]]
		switch ev.verdict {
		case verdictUnhealthy:
			if changes[k] == markSet {
				mu.Lock()
				requestsDeferred = true
				mu.Unlock()
				return
			}
			if !t.machine.DeletionTimestamp.IsZero() || annotations.IsPaused(cluster, t.machine) {
				return
			}
			if !lim.allow(t.machine) {
				if _, ok := requests[t.machine.Name]; !ok {
					mu.Lock()
					restricted++
					mu.Unlock()
				}
				return
			}
			created, err := r.ensureRequest(ctx, mhc, t.machine, ev, requests)
			if err != nil {
				fail(err)
				return
			}
			requested[k] = created
		case verdictHealthy:
			if markedByOthers(t.machine, cfg.checker) {
				// Another health check still finds the Machine unhealthy and needs the request: it
				// withdraws it once it finds the Machine healthy too.
				return
			}
			if err := r.withdrawRequest(ctx, mhc, t.machine, requests, "the Machine is healthy again"); err != nil {
				fail(err)
			}
		}
	})
	forEachParallel(len(excluded), r.writes.get(), func(i int) {
		if err := r.withdrawRequest(ctx, mhc, excluded[i], requests, "remediation of the Machine is skipped or paused"); err != nil {
			fail(err)
		}
	})
	return applyResult{restricted: restricted, requestChanged: requestChanged, standIn: standIn, requestsDeferred: requestsDeferred}, kerrors.NewAggregate(errs)
}

// needsWrite reports whether applying the evaluation may write anything for the Machine: a
// pending target is left as it is, and a healthy one that carries no mark of this health check,
// already reports healthy or is marked by another health check only, and has no request to
// withdraw needs nothing. It is the cheap filter in front of applyMark, which decides exactly.
func needsWrite(m *clusterv1.Machine, ev evaluation, checker string, requests map[string]client.Object) bool {
	switch ev.verdict {
	case verdictUnhealthy:
		return true
	case verdictHealthy:
		if _, ok := requests[m.Name]; ok {
			return true
		}
		if isMarked(m, checker) {
			return true
		}
		if conditions.IsFalse(m, caprv1.MachineCAPRHealthCheckSucceededCondition) {
			return false // another health check's mark, which this one leaves alone
		}
		return !hasSameCondition(m, metav1.Condition{Type: caprv1.MachineCAPRHealthCheckSucceededCondition,
			Status: metav1.ConditionTrue, Reason: caprv1.MachineCAPRHealthCheckSucceededReason})
	default:
		return false
	}
}

// forEachParallel calls fn(0..n-1), each holding a slot of sem (so at most cap(sem) at once, with
// whoever else shares sem), and returns when every call returned. fn must not take another slot.
func forEachParallel(n int, sem chan struct{}, fn func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() {
				<-sem
				wg.Done()
			}()
			fn(i)
		}()
	}
	wg.Wait()
}

// updateStatus reports the round in the health check's status.
func (r *Reconciler) updateStatus(mhc *caprv1.MachineHealthCheck, rd *round, lim limits, restricted int) {
	mhc.Status.ExpectedMachines = ptr.To(int32(rd.total))
	mhc.Status.CurrentHealthy = ptr.To(int32(rd.healthy))
	mhc.Status.Targets = slices.Clone(rd.names)
	mhc.Status.UnhealthyMachines = rd.unhealthy
	mhc.Status.ControlPlaneUnhealthyLimit = nil
	if rd.cpTargets > 0 && lim.controlPlane.limit >= 0 {
		mhc.Status.ControlPlaneUnhealthyLimit = ptr.To(int32(lim.controlPlane.limit))
	}
	r.setRemediationAllowed(mhc, lim, restricted)
	r.setStormCooldown(mhc, lim.storm)
	metrics.HealthCheckRound(mhc.Namespace, mhc.Name, rd.total, len(mhc.Status.UnhealthyMachines))
}

// setStormCooldown sets StormCooldown (removed when no cooldown is configured), with an event when
// a cooldown starts or ends.
func (r *Reconciler) setStormCooldown(mhc *caprv1.MachineHealthCheck, c *metav1.Condition) {
	if c == nil {
		conditions.Delete(mhc, caprv1.MachineHealthCheckStormCooldownCondition)
		return
	}
	previous := conditions.GetReason(mhc, caprv1.MachineHealthCheckStormCooldownCondition)
	if !r.setCondition(mhc, *c) {
		return
	}
	switch {
	case c.Reason == caprv1.MachineHealthCheckStormCooldownReason:
		r.recorder.Eventf(mhc, nil, corev1.EventTypeNormal, caprv1.EventStormCooldownStarted, "HealthCheck", "%s", c.Message)
	case previous == caprv1.MachineHealthCheckStormCooldownReason && c.Reason == caprv1.MachineHealthCheckNoStormReason:
		r.recorder.Eventf(mhc, nil, corev1.EventTypeNormal, caprv1.EventStormCooldownEnded, "HealthCheck", "%s", c.Message)
	}
}

// reconcileDelete clears every mark this health check wrote and withdraws its Pending requests, then
// releases the finalizer.
func (r *Reconciler) reconcileDelete(ctx context.Context, helper *patch.Helper, mhc *caprv1.MachineHealthCheck) error {
	if !controllerutil.ContainsFinalizer(mhc, Finalizer) {
		return nil
	}
	checker := checkerName(mhc)
	machines := &clusterv1.MachineList{}
	if err := r.Client.List(ctx, machines, client.InNamespace(mhc.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: mhc.Spec.ClusterName}); err != nil {
		return fmt.Errorf("listing Machines: %w", err)
	}
	// The mark names its health checks (applyMark); one written before it did is this one's on the
	// Machines it selects. A selector that no longer parses selects none of them.
	selector, err := r.selectors.of(mhc)
	if err != nil {
		selector = labels.Nothing()
	}
	requests, _, err := r.listRequests(ctx, mhc)
	if err != nil {
		return err
	}
	var errs []error
	for i := range machines.Items {
		m := &machines.Items[i]
		if isMarked(m, checker) {
			after := m.DeepCopy()
			changed, err := unmark(after, checker, selector.Matches(labels.Set(m.Labels)))
			if err == nil && changed {
				err = patchMark(ctx, r.Client, m, after)
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
		}
		// Every Pending request of this health check is withdrawn, whether or not the Machine still
		// carries the mark: a withdrawal refused by a conflict (a remediator wrote the request) is
		// retried on the next reconcile, when the mark cleared above is already gone. Another health
		// check that still marks the Machine requests it again: the deletion is an event of the
		// request, which starts its round over the Machine (requestToHealthChecks).
		if err := r.withdrawRequest(ctx, mhc, m, requests, "its health check is being deleted"); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return kerrors.NewAggregate(errs)
	}
	r.reported.forget(mhc.UID)
	r.memories.forget(client.ObjectKeyFromObject(mhc))
	r.statusWrites.forget(client.ObjectKeyFromObject(mhc))
	r.newMarks.take(client.ObjectKeyFromObject(mhc))
	metrics.HealthCheckDeleted(mhc.Namespace, mhc.Name)
	r.templates.forget(mhc.UID)
	controllerutil.RemoveFinalizer(mhc, Finalizer)
	if err := helper.Patch(ctx, mhc); err != nil {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	return nil
}

// applyMark writes the mark of one target when it changed and says what changed; markEvent
// reports it.
// The Machine read from the cache is never modified (it is read without a copy, see getTargets):
// the written copy is returned instead.
func (r *Reconciler) applyMark(ctx context.Context, m *clusterv1.Machine, ev evaluation, checker string) (*clusterv1.Machine, markChange, error) {
	after := m.DeepCopy()
	change, err := applyMark(after, ev, checker)
	if err != nil || change == markUnchanged {
		return m, markUnchanged, err
	}
	if err := patchMark(ctx, r.Client, m, after); err != nil {
		if apierrors.IsNotFound(err) {
			return m, markUnchanged, nil // deleted meanwhile: nothing to mark
		}
		return m, markUnchanged, err
	}
	return after, change, nil
}

// markEvent logs a mark set or cleared, or a request created, and records one event on the Machine
// (past machineEventsPerRound of its kind in the round, one event on the health check for all the
// others: roundEvents).
func (r *Reconciler) markEvent(ctx context.Context, said *roundEvents, m *clusterv1.Machine, change markChange, requested bool, ev evaluation) {
	checker := said.checker
	switch {
	case change == markSet:
		ns, name, _ := strings.Cut(checker, "/")
		metrics.Marked(ns, name, ev.reason)
		ctrl.LoggerFrom(ctx).Info("Machine marked unhealthy", "Machine", klog.KObj(m), "reason", ev.reason, "message", ev.message, "remediationRequested", requested)
		// One event per mark: a request created in the same round is said in it, not in an event
		// of its own, so that a wave of marks costs the API server one event write per Machine.
		outcome := ""
		if requested {
			outcome = "; remediation requested"
		}
		said.add(r.recorder, m, caprv1.EventMachineMarkedUnhealthy, requested,
			"Machine %s has been marked as unhealthy by %s: %s%s", m.Name, checker, ev.message, outcome)
	case requested:
		said.add(r.recorder, m, caprv1.EventRemediationRequested, true,
			"Remediation of Machine %s requested by %s: %s", m.Name, checker, ev.reason)
	case change == markCleared:
		others := ""
		if markedByOthers(m, checker) {
			others = "; another health check still marks it (see its condition " + caprv1.MachineCAPRHealthCheckSucceededCondition + ")"
		}
		ctrl.LoggerFrom(ctx).Info("Machine healthy again, mark cleared", "Machine", klog.KObj(m), "markedByOthers", others != "")
		said.add(r.recorder, m, caprv1.EventMachineMarkCleared, false,
			"Machine %s is healthy again; mark by %s cleared%s", m.Name, checker, others)
	}
}

// machineEventsPerRound is how many events of one reason (marked, remediation requested, cleared) a
// round records on Machines, and machineEventsPerSecond how many the health checks of one namespace
// record together (machineEventBudget). The others of a round are said in one event of that reason
// on the health check, which counts and names them: the way client-go's EventCorrelator aggregates
// similar events of one object, across the Machines of one health check. A storm of N marks then
// costs the API server about machineEventsPerSecond event writes per second and one per health check
// and round instead of N; each Machine's condition still says why it is marked, and the log has a
// line per Machine.
const (
	machineEventsPerRound  = 10
	machineEventsPerSecond = 10
)

// aggregatedNames is how many Machines an aggregated event names.
const aggregatedNames = 20

// roundEvents collects a round's events beyond machineEventsPerRound or the namespace's budget, by
// reason.
type roundEvents struct {
	mhc     *caprv1.MachineHealthCheck
	checker string
	budget  *machineEventBudget
	now     time.Time // when the round records its events
	sent    map[string]int
	// more are the Machines of each reason past the limit, in the round's order, and requested how
	// many of them had their remediation requested.
	more      map[string][]string
	requested map[string]int
	reasons   []string
}

func newRoundEvents(mhc *caprv1.MachineHealthCheck, checker string, budget *machineEventBudget) *roundEvents {
	return &roundEvents{mhc: mhc, checker: checker, budget: budget, now: time.Now(), sent: map[string]int{}, more: map[string][]string{}, requested: map[string]int{}}
}

// add records an event of reason on Machine m, or keeps it for the aggregated event once the round
// recorded machineEventsPerRound of that reason or the namespace's budget for it is spent.
func (e *roundEvents) add(rec events.EventRecorder, m *clusterv1.Machine, reason string, requested bool, format string, args ...any) {
	if e.sent[reason] < machineEventsPerRound && e.budget.allow(m.Namespace, reason, e.now) {
		e.sent[reason]++
		rec.Eventf(m, nil, corev1.EventTypeNormal, reason, "HealthCheck", format, args...)
		return
	}
	if _, ok := e.more[reason]; !ok {
		e.reasons = append(e.reasons, reason)
	}
	e.more[reason] = append(e.more[reason], m.Name)
	if requested {
		e.requested[reason]++
	}
}

// flush records one event on the health check per reason that went past the limit.
func (e *roundEvents) flush(rec events.EventRecorder) {
	for _, reason := range e.reasons {
		names := e.more[reason]
		listed := strings.Join(names[:min(len(names), aggregatedNames)], ", ")
		if len(names) > aggregatedNames {
			listed += fmt.Sprintf(" and %d more", len(names)-aggregatedNames)
		}
		var what string
		switch reason {
		case caprv1.EventMachineMarkedUnhealthy:
			what = fmt.Sprintf("marked as unhealthy (remediation requested for %d of them)", e.requested[reason])
		case caprv1.EventRemediationRequested:
			what = "requested for remediation"
		default:
			what = "healthy again, their marks cleared"
		}
		rec.Eventf(e.mhc, nil, corev1.EventTypeNormal, reason, "HealthCheck",
			"%d more Machines %s by %s in this round, without an event of their own: %s", len(names), what, e.checker, listed)
	}
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
// and rebuilds the memory; otherwise only the Machines in work are read and evaluated (changed since
// the last round, or watched: machinehealthcheck_memory.go), and the counts come from the memory.
func (r *Reconciler) observe(ctx context.Context, cluster *clusterv1.Cluster, mhc *caprv1.MachineHealthCheck, remote client.Client, cfg checkConfig,
	facts clusterFacts, mem *memory, valid memoryKey, work []string, full bool, now time.Time) (observation, error) {
	var o observation
	if full {
		targets, excluded, err := r.getTargets(ctx, remote, mhc)
		if err != nil {
			return o, err
		}
		if hasControlPlaneTarget(targets) {
			o.cp, o.cpErr = r.controlPlaneObject(ctx, cluster)
		}
		o.etcd = r.observeEtcd(ctx, cluster, cfg, facts, targets, etcdutil.PlacementOf(o.cp), now)
		o.rd, o.excluded = evaluateAll(targets, cfg, facts, now), excluded
		mem.reset(o.rd, valid, now)
		metrics.HealthCheckEvaluated(mhc.Namespace, mhc.Name, metrics.PassFull, len(targets))
		return o, nil
	}
	targets, excluded, gone, err := r.getSomeTargets(ctx, remote, mhc, work)
	if err != nil {
		return o, err
	}
	o.rd, o.excluded = evaluateSome(targets, cfg, facts, now), excluded
	mem.update(targets, o.rd.evals, gone)
	mem.summarize(o.rd)
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
	selector, err := r.selectors.of(mhc)
	if err != nil {
		return nil, nil, err
	}
	// Machines and Nodes are read from the caches without copies: a round only reads them, and a
	// mark is written from a deep copy (applyMark), so nothing here may modify them in place.
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
	selector, err := r.selectors.of(mhc)
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

// machineSelector is the health check's selector restricted to its cluster.
func machineSelector(mhc *caprv1.MachineHealthCheck) (labels.Selector, error) {
	ls := mhc.Spec.Selector.LabelSelector()
	if ls.MatchLabels == nil {
		ls.MatchLabels = map[string]string{}
	}
	ls.MatchLabels[clusterv1.ClusterNameLabel] = mhc.Spec.ClusterName
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, fmt.Errorf("invalid spec.selector: %w", err)
	}
	return s, nil
}

// setUnreachable reports that the workload cluster cannot be reached, with a Warning event when it
// just became so.
func (r *Reconciler) setUnreachable(mhc *caprv1.MachineHealthCheck, err error) {
	if r.setCondition(mhc, metav1.Condition{
		Type:    caprv1.MachineHealthCheckWorkloadClusterReachableCondition,
		Status:  metav1.ConditionFalse,
		Reason:  caprv1.MachineHealthCheckWorkloadClusterUnreachableReason,
		Message: fmt.Sprintf("Workload cluster cannot be reached, no Machine is marked until it can: %v", err),
	}) {
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, caprv1.EventWorkloadClusterUnreachable, "HealthCheck",
			"Workload cluster %s cannot be reached; no Machine is marked until it can: %v", mhc.Spec.ClusterName, err)
	}
}

// setInvalidSelector reports that spec.selector does not parse: RemediationAllowed is False with
// reason InvalidSelector, and a Warning event when it just became so.
func (r *Reconciler) setInvalidSelector(ctx context.Context, mhc *caprv1.MachineHealthCheck, err error) {
	ctrl.LoggerFrom(ctx).Info("Health check not run: its selector does not parse", "machineHealthCheck", klog.KObj(mhc), "err", err.Error())
	mhc.Status.RemediationsAllowed = ptr.To(int32(0))
	msg := fmt.Sprintf("No Machine is checked until spec.selector is fixed: %v", err)
	c := metav1.Condition{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionFalse,
		Reason: caprv1.MachineHealthCheckInvalidSelectorReason, Message: msg}
	if r.setCondition(mhc, c) {
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, caprv1.EventInvalidSelector, "HealthCheck", "%s", msg)
	}
}

// setRemediationAllowed sets RemediationAllowed and status.remediationsAllowed from the limits, which
// always agree: remediationsAllowed is how many more targets may become unhealthy and still be
// remediated now, 0 whenever RemediationAllowed is False. Entering etcd quorum loss is a Warning
// event naming the dead members.
func (r *Reconciler) setRemediationAllowed(mhc *caprv1.MachineHealthCheck, lim limits, restricted int) {
	refusal := lim.refusal()
	if refusal == nil {
		mhc.Status.RemediationsAllowed = ptr.To(int32(lim.remaining()))
		r.setCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineHealthCheckRemediationAllowedReason})
		return
	}
	mhc.Status.RemediationsAllowed = ptr.To(int32(0))
	entered := r.setCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionFalse,
		Reason: refusal.reason, Message: refusal.message})
	if entered && refusal.reason == caprv1.MachineHealthCheckEtcdQuorumLostReason {
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, caprv1.EventEtcdQuorumLost, "HealthCheck", "%s", refusal.message)
	}
	if restricted > 0 {
		metrics.ShortCircuited(mhc.Namespace, mhc.Name, refusal.reason)
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, caprv1.EventRemediationRestricted, "HealthCheck", "%s", refusal.message)
	}
}

// setCondition sets a condition of the health check and reports whether its reason changed, i.e.
// whether this is a transition worth an event. The previous reason is the one this process last
// set, or, after a restart, the one on the object read at reconcile start: two reconciles in quick
// succession can both start from a cache that has not seen the first one's status patch yet, and
// must not both report the same transition.
func (r *Reconciler) setCondition(mhc *caprv1.MachineHealthCheck, c metav1.Condition) bool {
	previous := ""
	if old := conditions.Get(mhc, c.Type); old != nil {
		previous = old.Reason
	}
	conditions.Set(mhc, c)
	return r.reported.swap(mhc.UID, c.Type, previous, c.Reason) != c.Reason
}

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
	if e := mhc.Spec.Checks.EtcdMember; e != nil {
		cfg.etcdMemberTimeout = time.Duration(ptr.Deref(e.TimeoutSeconds, caprv1.DefaultEtcdMemberTimeoutSeconds)) * time.Second
	}
	return cfg
}

// checkerName identifies a health check in the marks it writes.
func checkerName(mhc *caprv1.MachineHealthCheck) string {
	return mhc.Namespace + "/" + mhc.Name
}

func targetNames(targets []target) []string {
	names := make([]string, 0, len(targets))
	for _, t := range targets {
		names = append(names, t.machine.Name)
	}
	sort.Strings(names)
	return names
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
