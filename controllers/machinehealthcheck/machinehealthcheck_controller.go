package machinehealthcheck

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
)

// Finalizer lets the health check clear its marks when it is deleted; a mark left behind would read
// as a request for remediation to every other health check.
const Finalizer = "remediation.cluster.x-k8s.io/machinehealthcheck"

// unreachableRequeue is how often an unreachable workload cluster is looked at again, on top of the
// ClusterCache's own reconnect events.
const unreachableRequeue = 30 * time.Second

// etcdPollInterval is how often etcd member health is read when checks.etcdMember is set (etcd
// changes produce no Kubernetes events to react to).
const etcdPollInterval = 5 * time.Second

// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machinehealthchecks;machinehealthchecks/status;machinehealthchecks/finalizers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediationtemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines;machines/status,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=core,resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=core;events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch

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
}

// EtcdMemberSource reports, per Node name, the health of the etcd members of a cluster.
type EtcdMemberSource interface {
	MemberHealth(ctx context.Context, cluster *clusterv1.Cluster) (map[string]EtcdMemberHealth, error)
}

// EtcdMemberHealth is the health of one etcd member, as seen now.
type EtcdMemberHealth struct {
	Healthy bool
	// Problem says what is wrong, e.g. "unreachable", "missing", "alarmed (NOSPACE)", "a learner".
	Problem string
}

// Reconcile implements the reconcile skeleton: get → cluster → patch helper → paused → deferred
// patch of owned conditions → reconcileNormal / reconcileDelete.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	defer func() {
		if ctx.Err() != nil {
			reterr = nil // shutting down: whoever runs next starts from the API's state
		}
	}()
	mhc := &caprv1.MachineHealthCheck{}
	if err := r.Client.Get(ctx, req.NamespacedName, mhc); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
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
		return ctrl.Result{}, err
	}

	defer func() {
		opts := []patch.Option{patch.WithOwnedConditions{Conditions: []string{
			caprv1.MachineHealthCheckPausedCondition, caprv1.MachineHealthCheckRemediationAllowedCondition, caprv1.MachineHealthCheckWorkloadClusterReachableCondition,
		}}}
		if reterr == nil {
			opts = append(opts, patch.WithStatusObservedGeneration{})
		}
		if err := helper.Patch(ctx, mhc, opts...); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, fmt.Errorf("patching MachineHealthCheck: %w", err)})
		}
	}()

	// The finalizer is added before any mark is written, so a mark never outlives its writer.
	if controllerutil.AddFinalizer(mhc, Finalizer) {
		return ctrl.Result{}, nil
	}
	return r.reconcileNormal(ctx, cluster, mhc)
}

func (r *Reconciler) reconcileNormal(ctx context.Context, cluster *clusterv1.Cluster, mhc *caprv1.MachineHealthCheck) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	now := time.Now()

	if mhc.Labels == nil {
		mhc.Labels = map[string]string{}
	}
	mhc.Labels[clusterv1.ClusterNameLabel] = mhc.Spec.ClusterName
	mhc.OwnerReferences = util.EnsureOwnerRef(mhc.OwnerReferences, metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID,
	})

	facts := factsOf(cluster)
	cfg := configOf(mhc)

	// Workload-cluster access. A cluster that cannot be reached marks nothing: a network partition
	// must never produce a wave of remediations.
	var remote client.Client
	if facts.controlPlaneInitialized {
		var err error
		remote, err = r.ClusterCache.GetClient(ctx, client.ObjectKeyFromObject(cluster))
		if err == nil {
			err = r.watchClusterNodes(ctx, cluster)
		}
		if err != nil {
			r.setUnreachable(mhc, err)
			return ctrl.Result{RequeueAfter: unreachableRequeue}, nil
		}
		conditions.Set(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckWorkloadClusterReachableCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineHealthCheckWorkloadClusterReachableReason})
	} else {
		conditions.Set(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckWorkloadClusterReachableCondition, Status: metav1.ConditionFalse,
			Reason:  caprv1.MachineHealthCheckControlPlaneNotInitializedReason,
			Message: "The control plane is not initialized yet: only control-plane Machines are checked, for node startup"})
	}

	targets, err := r.getTargets(ctx, remote, mhc)
	if err != nil {
		if remote != nil && isUnreachable(err) {
			r.setUnreachable(mhc, err)
			return ctrl.Result{RequeueAfter: unreachableRequeue}, nil
		}
		return ctrl.Result{}, err
	}
	if cfg.etcdMemberTimeout > 0 && r.EtcdMembers != nil && facts.controlPlaneInitialized {
		if err := r.observeEtcdMembers(ctx, cluster, targets, now); err != nil {
			// Never guess: without etcd state the etcd check neither marks nor clears.
			log.Info("Could not read etcd member health; the etcd member check is skipped this time", "err", err.Error())
		}
	}

	// Evaluate.
	evals := make([]evaluation, len(targets))
	var healthy, cpTargets, cpNotHealthy int
	var next time.Duration
	for i, t := range targets {
		evals[i] = evaluate(t, cfg, facts, now)
		if evals[i].verdict == verdictHealthy {
			healthy++
		}
		if isControlPlane(t.machine) {
			cpTargets++
			if evals[i].verdict != verdictHealthy {
				cpNotHealthy++
			}
		}
		if evals[i].nextCheck > 0 && (next == 0 || evals[i].nextCheck < next) {
			next = evals[i].nextCheck
		}
	}

	// Limits.
	expected := len(targets)
	trigger, err := triggerIfDecision(mhc.Spec.Remediation.TriggerIf, expected, expected-healthy)
	if err != nil {
		return ctrl.Result{}, err
	}
	cp := limitDecision{allowed: true, limit: -1}
	mhc.Status.ControlPlaneUnhealthyLimit = nil
	if cpTargets > 0 {
		cp = r.controlPlaneLimit(ctx, cluster, trigger.limit, cpNotHealthy)
		if cp.limit >= 0 {
			mhc.Status.ControlPlaneUnhealthyLimit = ptr.To(int32(cp.limit))
		}
	}

	// Apply marks and requests.
	requests, err := r.listRequests(ctx, mhc)
	if err != nil {
		return ctrl.Result{}, err
	}
	var errs []error
	var unhealthyNames []string
	restricted := 0
	for i, t := range targets {
		ev := evals[i]
		if ev.verdict == verdictUnhealthy {
			unhealthyNames = append(unhealthyNames, t.machine.Name)
		}
		if err := r.applyMarkAndEvent(ctx, t.machine, ev, cfg.checker, now); err != nil {
			errs = append(errs, err)
			continue
		}
		switch ev.verdict {
		case verdictUnhealthy:
			allowed := trigger.allowed && (!isControlPlane(t.machine) || cp.allowed)
			if !t.machine.DeletionTimestamp.IsZero() || annotations.IsPaused(cluster, t.machine) {
				continue
			}
			if !allowed {
				if _, ok := requests[t.machine.Name]; !ok {
					restricted++
				}
				continue
			}
			created, err := r.ensureRequest(ctx, mhc, t.machine, ev, requests)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if created {
				r.recorder.Eventf(t.machine, nil, corev1.EventTypeNormal, caprv1.EventRemediationRequested, "HealthCheck",
					"Remediation of Machine %s requested by %s: %s", t.machine.Name, cfg.checker, ev.reason)
			}
		case verdictHealthy:
			if err := r.withdrawRequest(ctx, mhc, t.machine, requests); err != nil {
				errs = append(errs, err)
			}
		}
	}

	// Status.
	sort.Strings(unhealthyNames)
	mhc.Status.ExpectedMachines = ptr.To(int32(expected))
	mhc.Status.CurrentHealthy = ptr.To(int32(healthy))
	mhc.Status.Targets = targetNames(targets)
	mhc.Status.UnhealthyMachines = unhealthyNames
	r.setRemediationAllowed(mhc, trigger, cp, restricted)

	if err := kerrors.NewAggregate(errs); err != nil {
		return ctrl.Result{}, err
	}
	// etcd is not watched: when the etcd member check is on, look again regularly.
	if cfg.etcdMemberTimeout > 0 && cpTargets > 0 && (next == 0 || next > etcdPollInterval) {
		next = etcdPollInterval
	}
	return ctrl.Result{RequeueAfter: next}, nil
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
	requests, err := r.listRequests(ctx, mhc)
	if err != nil {
		return err
	}
	var errs []error
	for i := range machines.Items {
		m := &machines.Items[i]
		if _, ok := ownMark(m, checker); !ok {
			continue
		}
		after := m.DeepCopy()
		delete(after.Annotations, caprv1.UnhealthyAnnotation)
		conditions.Delete(after, caprv1.MachineCAPRHealthCheckSucceededCondition)
		if err := patchMark(ctx, r.Client, m, after); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := r.withdrawRequest(ctx, mhc, m, requests); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return kerrors.NewAggregate(errs)
	}
	controllerutil.RemoveFinalizer(mhc, Finalizer)
	if err := helper.Patch(ctx, mhc); err != nil {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	return nil
}

// applyMarkAndEvent writes the mark of one target when it changed, with an event.
func (r *Reconciler) applyMarkAndEvent(ctx context.Context, m *clusterv1.Machine, ev evaluation, checker string, now time.Time) error {
	after := m.DeepCopy()
	change := applyMark(after, ev, checker, now)
	if change == markUnchanged {
		return nil
	}
	if err := patchMark(ctx, r.Client, m, after); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // deleted meanwhile: nothing to mark
		}
		return err
	}
	*m = *after
	switch change {
	case markSet:
		ctrl.LoggerFrom(ctx).Info("Machine marked unhealthy", "Machine", klog.KObj(m), "reason", ev.reason, "message", ev.message)
		r.recorder.Eventf(m, nil, corev1.EventTypeNormal, caprv1.EventMachineMarkedUnhealthy, "HealthCheck",
			"Machine %s has been marked as unhealthy by %s: %s", m.Name, checker, ev.message)
	case markCleared:
		ctrl.LoggerFrom(ctx).Info("Machine healthy again, mark cleared", "Machine", klog.KObj(m))
		r.recorder.Eventf(m, nil, corev1.EventTypeNormal, caprv1.EventMachineMarkCleared, "HealthCheck",
			"Machine %s is healthy again; mark by %s cleared", m.Name, checker)
	}
	return nil
}

// getTargets lists the Machines selected by the health check and reads their Nodes.
func (r *Reconciler) getTargets(ctx context.Context, remote client.Client, mhc *caprv1.MachineHealthCheck) ([]target, error) {
	selector, err := machineSelector(mhc)
	if err != nil {
		return nil, err
	}
	machines := &clusterv1.MachineList{}
	if err := r.Client.List(ctx, machines, client.InNamespace(mhc.Namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return nil, fmt.Errorf("listing Machines: %w", err)
	}
	targets := make([]target, 0, len(machines.Items))
	for i := range machines.Items {
		m := &machines.Items[i]
		if annotations.HasPaused(m) || annotations.HasSkipRemediation(m) {
			continue
		}
		t := target{machine: m}
		if remote != nil && m.Status.NodeRef.IsDefined() {
			node := &corev1.Node{}
			if err := remote.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node); err != nil {
				if !apierrors.IsNotFound(err) {
					return nil, fmt.Errorf("reading Node %s of Machine %s: %w", m.Status.NodeRef.Name, m.Name, err)
				}
				t.nodeMissing = true
			} else {
				t.node = node
			}
		}
		targets = append(targets, t)
	}
	return targets, nil
}

// machineSelector is the health check's selector restricted to its cluster.
func machineSelector(mhc *caprv1.MachineHealthCheck) (labels.Selector, error) {
	ls := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for k, v := range mhc.Spec.Selector.MatchLabels {
		ls.MatchLabels[k] = v
	}
	ls.MatchLabels[clusterv1.ClusterNameLabel] = mhc.Spec.ClusterName
	for _, e := range mhc.Spec.Selector.MatchExpressions {
		ls.MatchExpressions = append(ls.MatchExpressions, metav1.LabelSelectorRequirement{Key: e.Key, Operator: e.Operator, Values: e.Values})
	}
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, fmt.Errorf("invalid spec.selector: %w", err)
	}
	return s, nil
}

func (r *Reconciler) setUnreachable(mhc *caprv1.MachineHealthCheck, err error) {
	if c := conditions.Get(mhc, caprv1.MachineHealthCheckWorkloadClusterReachableCondition); c == nil || c.Status != metav1.ConditionFalse ||
		c.Reason != caprv1.MachineHealthCheckWorkloadClusterUnreachableReason {
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, caprv1.EventWorkloadClusterUnreachable, "HealthCheck",
			"Workload cluster %s cannot be reached; no Machine is marked until it can: %v", mhc.Spec.ClusterName, err)
	}
	conditions.Set(mhc, metav1.Condition{
		Type:    caprv1.MachineHealthCheckWorkloadClusterReachableCondition,
		Status:  metav1.ConditionFalse,
		Reason:  caprv1.MachineHealthCheckWorkloadClusterUnreachableReason,
		Message: fmt.Sprintf("Workload cluster cannot be reached, no Machine is marked until it can: %v", err),
	})
}

func (r *Reconciler) setRemediationAllowed(mhc *caprv1.MachineHealthCheck, trigger, cp limitDecision, restricted int) {
	switch {
	case !trigger.allowed:
		mhc.Status.RemediationsAllowed = ptr.To(int32(0))
		conditions.Set(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionFalse,
			Reason: caprv1.MachineHealthCheckTooManyUnhealthyReason, Message: trigger.message})
	case !cp.allowed:
		mhc.Status.RemediationsAllowed = ptr.To(int32(trigger.remaining))
		conditions.Set(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionFalse,
			Reason: caprv1.MachineHealthCheckControlPlaneQuorumLimitReason, Message: cp.message})
	default:
		mhc.Status.RemediationsAllowed = ptr.To(int32(trigger.remaining))
		conditions.Set(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineHealthCheckRemediationAllowedReason})
	}
	if restricted > 0 {
		msg := trigger.message
		if trigger.allowed {
			msg = cp.message
		}
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, caprv1.EventRemediationRestricted, "HealthCheck", "%s", msg)
	}
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
