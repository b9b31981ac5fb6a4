package controlplane

import (
	"cmp"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation"
)

// waiting says why a remediation cannot proceed now.
type waiting struct {
	reason  string
	message string
	requeue time.Duration
	// warning, when set, is the reason of a Warning event emitted when the remediation starts
	// waiting for this reason (once per transition, not on every reconcile).
	warning string
}

// wait records a waiting state in the Progressing condition.
func (r *Reconciler) wait(s *scope, w *waiting) ctrl.Result {
	if w.reason == caprv1.MachineRemediationAnotherRemediationInProgressReason && !isWaitingFor(s.mr, w.reason) {
		metrics.LockWait()
	}
	if w.warning != "" && !isWaitingFor(s.mr, w.reason) {
		r.event(s.mr, corev1.EventTypeWarning, w.warning, w.message)
	}
	remediation.SetWaiting(s.mr, w.reason, w.message)
	return ctrl.Result{RequeueAfter: w.requeue}
}

// startPlan is what a remediation starts with.
type startPlan struct {
	decision   OrderDecision
	state      *etcdutil.State
	desired    int32
	retryCount int32
}

// reconcilePending checks the preconditions and, when they hold, starts the remediation in this
// same pass: lock, then Running recorded, then the first step on the next reconcile.
func (r *Reconciler) reconcilePending(ctx context.Context, s *scope) (ctrl.Result, error) {
	if s.mr.Status.Phase == "" {
		s.mr.Status.Phase = caprv1.MachineRemediationPhasePending
	}
	// A Pending request holds nothing, not even a fence hook left by a run that went back to Pending.
	if s.machine.Annotations[caprv1.FenceBeforeDeleteHookAnnotation] == s.mr.Name {
		if err := r.removeFenceHook(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	}
	if annotations.HasSkipRemediation(s.machine) {
		return ctrl.Result{}, r.withdraw(ctx, s)
	}
	retry, w, err := r.startPreconditions(ctx, s)
	switch {
	case err != nil:
		return ctrl.Result{}, err
	case retry.GiveUp:
		return r.fail(ctx, s, caprv1.MachineRemediationRetryLimitReachedReason, retry.Message)
	case w != nil:
		return r.wait(s, w), nil
	}
	plan, w, err := r.planStart(ctx, s, false)
	switch {
	case err != nil:
		return ctrl.Result{}, err
	case w != nil:
		return r.wait(s, w), nil
	}
	plan.retryCount = retry.RetryCount
	// The checks above read the Machine from the cache; CAPI's skip-remediation set a moment ago may
	// not be there yet, and a remediation started on it would run. The start decides on a live read.
	live := &clusterv1.Machine{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s.machine), live); err != nil {
		return ctrl.Result{}, fmt.Errorf("reading Machine %s before the start: %w", s.machine.Name, err)
	}
	if annotations.HasSkipRemediation(live) {
		s.machine = live
		return ctrl.Result{}, r.withdraw(ctx, s)
	}
	return r.start(ctx, s, plan)
}

// withdraw deletes a Pending request for a Machine that carries CAPI's
// cluster.x-k8s.io/skip-remediation: that Machine must never be remediated, and a request left
// behind would start the moment the annotation is removed.
func (r *Reconciler) withdraw(ctx context.Context, s *scope) error {
	msg := fmt.Sprintf("Machine %s has annotation %s: the request is withdrawn", s.machine.Name, clusterv1.MachineSkipRemediationAnnotation)
	remediation.SetWaiting(s.mr, caprv1.MachineRemediationWaitingForPreconditionsReason, msg)
	err := r.Client.Delete(ctx, s.mr, client.Preconditions{UID: &s.mr.UID, ResourceVersion: &s.mr.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("withdrawing the request of skipped Machine %s: %w", s.machine.Name, err)
	}
	r.event(s.mr, corev1.EventTypeNormal, EventRemediationWithdrawn, msg)
	ctrl.LoggerFrom(ctx).Info("Remediation request withdrawn: the Machine skips remediation")
	// The next reconcile sees the deletion and removes the finalizer.
	s.base = s.mr.DeepCopy()
	return nil
}

// startPreconditions are the checks that need no etcd state: the Machine, the retry limits, and that
// no other control-plane remediation of the cluster runs.
func (r *Reconciler) startPreconditions(ctx context.Context, s *scope) (RetryDecision, *waiting, error) {
	if !s.machine.DeletionTimestamp.IsZero() {
		return RetryDecision{}, &waiting{reason: caprv1.MachineRemediationWaitingForPreconditionsReason,
			message: "the Machine is already being deleted", requeue: waitLong}, nil
	}
	retry := CheckRetryLimits(remediationRecord(s.machine), s.mr.Spec.ControlPlane, now())
	if retry.GiveUp {
		return retry, nil, nil
	}
	if !retry.WaitUntil.IsZero() {
		return retry, &waiting{reason: caprv1.MachineRemediationWaitingForRetryPeriodReason, message: retry.Message,
			requeue: time.Until(retry.WaitUntil) + time.Second}, nil
	}
	// One control-plane remediation per cluster at a time. The durable state decides (the Running
	// requests of the cluster); the lock on the control-plane object only serialises starts.
	running, err := r.runningRemediation(ctx, s)
	if err != nil {
		return retry, nil, err
	}
	holder := ""
	if l := lockOf(s.cp); l != nil && l.MachineRemediation != s.mr.Name {
		active, err := r.lockHolderActive(ctx, s.mr.Namespace, l)
		if err != nil {
			return retry, nil, err
		}
		if active {
			holder = l.MachineRemediation
		}
	}
	if other := cmp.Or(running, holder); other != "" {
		return retry, &waiting{reason: caprv1.MachineRemediationAnotherRemediationInProgressReason, requeue: waitLong, message: fmt.Sprintf(
			"the remediation of control-plane Machine %s is in progress; control-plane Machines are remediated one at a time", other)}, nil
	}
	if _, replicasErr := Replicas(s.cp); replicasErr != nil {
		return retry, &waiting{reason: caprv1.MachineRemediationWaitingForPreconditionsReason, message: replicasErr.Error(), requeue: waitLong}, nil //nolint:nilerr // a control plane without spec.replicas is a reason to wait, said in the condition
	}
	return retry, nil, nil
}

// planStart reads the world (initialization, the other control-plane Machines, etcd) and chooses the
// order, or says why the remediation must wait. running is true when a running remediation chooses
// again after its escalation: it holds the control plane, so the other requests' ranks no longer
// decide who starts (a more broken one is given way to by yieldToMoreBroken).
func (r *Reconciler) planStart(ctx context.Context, s *scope, running bool) (startPlan, *waiting, error) {
	desired, _ := Replicas(s.cp)
	if s.replicasField() == caprv1.ReplicasFieldClusterTopology {
		// The Cluster's field is what a surge changes and the undo restores (Topology.Busy has
		// checked that the control-plane object has it too).
		src, err := r.readReplicas(ctx, s)
		if err != nil {
			return startPlan{}, &waiting{reason: caprv1.MachineRemediationWaitingForPreconditionsReason, requeue: waitLong, message: err.Error()}, nil //nolint:nilerr // said in the condition
		}
		desired = src.current
	}
	if l := lockOf(s.cp); l != nil && l.MachineRemediation == s.mr.Name && l.DesiredReplicas > 0 {
		desired = l.DesiredReplicas // a start that crashed after taking the lock: keep what it recorded
	}
	initialized, known := controlPlaneInitialized(s.cluster)
	if !known {
		return startPlan{}, &waiting{reason: caprv1.MachineRemediationControlPlaneInitializationUnknownReason, requeue: waitLong, message: fmt.Sprintf(
			"Cluster %s reports neither that its control plane is initialized nor that it is not (condition %s, status.initialization.controlPlaneInitialized); nothing is done until it does",
			s.cluster.Name, clusterv1.ClusterControlPlaneInitializedCondition)}, nil
	}
	in := OrderInput{Policy: caprv1.ControlPlaneOrderAuto, Initialized: initialized, AddsLearners: s.adapter.AddsLearners()}
	_, in.LearnerJoinsProblem = learnerJoins(s.cp)
	if s.mr.Spec.ControlPlane != nil && s.mr.Spec.ControlPlane.Order != "" {
		in.Policy = s.mr.Spec.ControlPlane.Order
	}
	var state *etcdutil.State
	if initialized {
		for _, other := range s.machines {
			if other.Name != s.machine.Name && (!other.Status.NodeRef.IsDefined() || !other.DeletionTimestamp.IsZero()) {
				return startPlan{}, &waiting{reason: caprv1.MachineRemediationWaitingForPreconditionsReason, requeue: waitShort, message: fmt.Sprintf(
					"control-plane Machine %s is still provisioning or being deleted", other.Name)}, nil
			}
		}
		if s.externalEtcd() {
			// No member on the Machines: etcd is not read, and the Machines serving the API decide.
			in.ExternalEtcd = true
			in.ServingOthers = len(s.servingOthers())
			in.VictimServes = !s.machineGone && s.adapter.ServesAPI(s.machine) == ""
		} else {
			var err error
			state, err = r.inspectEtcd(ctx, s)
			if err != nil {
				return startPlan{}, &waiting{reason: caprv1.MachineRemediationEtcdUnreachableReason, requeue: waitLong,
					message: fmt.Sprintf("cannot read etcd state, nothing is done without it: %v", err)}, nil
			}
			in.Counts = state.Counts()
			in.Victim = victimMember(state, s.victimNode())
			if m := state.ByName(s.victimNode()); m != nil {
				in.VictimUnreachable = !m.Reachable
				if in.Victim == VictimHealthy {
					in.VictimProblem = m.Problem
				}
			}
		}
		if !running {
			first, err := r.firstCandidate(ctx, s, state)
			if err != nil {
				return startPlan{}, nil, err
			}
			if first != s.mr.Name {
				return startPlan{}, &waiting{reason: caprv1.MachineRemediationAnotherRemediationInProgressReason, requeue: waitLong, message: fmt.Sprintf(
					"control-plane Machine %s is more broken and is remediated first", first)}, nil
			}
		}
		view := ProviderView{ControlPlane: s.cp, Machines: s.machines, Victim: s.machine, Etcd: state}
		if busy := s.adapter.Busy(view); busy != "" && !holdsLock(s) {
			return startPlan{}, &waiting{reason: caprv1.MachineRemediationWaitingForPreconditionsReason, requeue: waitShort, message: busy}, nil
		}
		in.setProvider(s.adapter, view)
	}
	decision := ChooseOrder(in)
	if decision.WaitReason != "" {
		msg := decision.WaitMessage
		if state != nil {
			if down := state.Unhealthy(); len(down) > 0 {
				msg += fmt.Sprintf("; unhealthy members: %v", down)
			}
		}
		warning := remediation.EventRemediationWaiting
		if decision.WaitReason == caprv1.MachineRemediationQuorumLostReason {
			warning = EventQuorumLost
		}
		return startPlan{}, &waiting{reason: decision.WaitReason, message: msg, requeue: waitLong, warning: warning}, nil
	}
	return startPlan{decision: decision, state: state, desired: desired}, nil, nil
}

// start takes the lock and records Running in one pass. The request is labelled with its Cluster and
// carries the finalizer before the lock is taken, so that whatever happens next can find the lock
// and release it; if recording Running fails, the lock is released again.
func (r *Reconciler) start(ctx context.Context, s *scope, plan startPlan) (ctrl.Result, error) {
	mr := s.mr
	raised, w := r.decideFencing(ctx, s)
	if w != nil {
		return r.wait(s, w), nil
	}
	metaChanged := controllerutil.AddFinalizer(mr, caprv1.MachineRemediationFinalizer)
	if mr.Labels[clusterv1.ClusterNameLabel] != s.cluster.Name {
		if mr.Labels == nil {
			mr.Labels = map[string]string{}
		}
		mr.Labels[clusterv1.ClusterNameLabel] = s.cluster.Name
		metaChanged = true
	}
	if metaChanged {
		if err := r.persist(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.takeLock(ctx, s, plan.desired); err != nil {
		if apierrors.IsConflict(err) {
			// Someone changed the control-plane object (another start, a provider): look again.
			return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
		}
		return ctrl.Result{}, err
	}
	cp := controlPlaneRecord(s, plan)
	mr.Status.ControlPlane = cp
	// From here on the remediation outlives its Machine (which it deletes): it is re-owned by the
	// Cluster, so that its record is not garbage-collected with the Machine.
	mr.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: s.cluster.Name, UID: s.cluster.UID,
	}}
	mr.Status.Phase = caprv1.MachineRemediationPhaseRunning
	mr.Status.StartTime = ptr.To(metav1.Now())
	mr.Status.LastError = ""
	conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineRemediationStepInProgressReason, Message: "order " + string(plan.decision.Order) + ": " + plan.decision.Reason + noteOf(raised)})
	if err := r.persist(ctx, s); err != nil {
		// Not started: give the lock back so that nobody waits on a start that did not happen.
		if relErr := r.releaseLock(ctx, s); relErr != nil {
			ctrl.LoggerFrom(ctx).Error(relErr, "Releasing the control-plane lock after a failed start")
		}
		return ctrl.Result{}, err
	}
	table := ""
	if plan.state != nil {
		table = "\n" + plan.state.Table()
	}
	how := ""
	if cp.SurgeReason != "" {
		how = "; " + cp.SurgeReason
	}
	metrics.RemediationStarted(metrics.KindControlPlane, string(plan.decision.Order))
	r.event(mr, corev1.EventTypeNormal, remediation.EventRemediationStarted, fmt.Sprintf("Remediating control-plane Machine %s, order %s: %s%s%s",
		s.machine.Name, plan.decision.Order, plan.decision.Reason, how, table))
	r.fencingRaisedEvent(s, raised)
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation started", "order", plan.decision.Order, "reason", plan.decision.Reason,
		"Cluster", klog.KObj(s.cluster))
	// Running is recorded: the first step follows in this reconcile, as in any reconcile of a running
	// remediation, on the etcd state the order was chosen on (a new reconcile would read etcd again,
	// which with a dead member costs its dial timeout).
	return r.reconcileRunning(ctx, s)
}

// controlPlaneRecord is what a remediation records when it starts with plan (and again when it
// chooses its order after the escalation): the order, the surge, the Machines and the victim's member
// as they are now.
func controlPlaneRecord(s *scope, plan startPlan) *caprv1.ControlPlaneRemediationStatus {
	cp := &caprv1.ControlPlaneRemediationStatus{
		ClusterName: s.cluster.Name, Order: plan.decision.Order, OrderReason: plan.decision.Reason,
		DesiredReplicas: ptr.To(plan.desired), MemberName: s.victimNode(), RetryCount: plan.retryCount,
		Etcd: s.etcdPlacement(), ReplicasField: s.replicasField(),
	}
	switch plan.decision.Order {
	case caprv1.ControlPlaneOrderReplace:
	case caprv1.ControlPlaneOrderDeleteFirst, caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval:
		cp.Surge, cp.SurgeReason = 0, "no surge: the victim is deleted first and the provider replaces it"
	default:
		plan := s.adapter.Surge(s.cp)
		cp.Surge, cp.Replacements, cp.SurgeReason = plan.Replicas, plan.Machines, plan.Reason
	}
	for _, other := range s.machines {
		cp.MachinesBefore = append(cp.MachinesBefore, other.Name)
	}
	if plan.state != nil {
		if member := plan.state.ByName(s.victimNode()); member != nil {
			cp.MemberID = fmt.Sprintf("%x", member.ID)
		}
	}
	return cp
}

// controlPlaneInitialized reads whether the control plane is initialized, failing closed: known is
// false when the Cluster says neither (no status yet), and nothing is done then.
func controlPlaneInitialized(cluster *clusterv1.Cluster) (initialized, known bool) {
	if ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) {
		return true, true
	}
	c := conditions.Get(cluster, clusterv1.ClusterControlPlaneInitializedCondition)
	switch {
	case c == nil || c.Status == metav1.ConditionUnknown:
		return false, false
	default:
		return c.Status == metav1.ConditionTrue, true
	}
}
