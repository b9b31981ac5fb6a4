package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/paused"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation/fencing"
)

// Requeue intervals while waiting on the world (watches bring the controller back sooner).
const (
	waitShort = 2 * time.Second
	waitLong  = 15 * time.Second
)

// Events on a MachineRemediation.
const (
	EventRemediationStarted   = "RemediationStarted"
	EventStepStarted          = "StepStarted"
	EventStepFinished         = "StepFinished"
	EventRemediationWaiting   = "RemediationWaiting"
	EventRemediationSucceeded = "RemediationSucceeded"
	EventRemediationFailed    = "RemediationFailed"
	EventQuorumLost           = "EtcdQuorumLost"
	EventFencingGaveUp        = "FencingGaveUp"
)

// EtcdProvider gives access to a workload cluster's etcd (WorkloadEtcd in production).
type EtcdProvider interface {
	ForCluster(ctx context.Context, cluster *clusterv1.Cluster) (EtcdCluster, error)
}

// StepEvent is reported to StepObserver when a step is issued or seen done.
type StepEvent struct {
	Remediation types.NamespacedName
	Step        caprv1.StepName
	// Done is false when the step is issued, true when its effect was seen.
	Done bool
	Time time.Time
}

// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations;machineremediations/status,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=*,verbs=get;list;watch;update;patch

// Reconciler drives control-plane MachineRemediations.
type Reconciler struct {
	Client client.Client
	// APIReader reads the MachineRemediation and the control-plane object live: the remediation's
	// own durable state must never be read stale from a cache (it would redo a step it already did).
	APIReader client.Reader
	Etcd      EtcdProvider
	Fencer    fencing.Fencer

	// WatchFilterValue is the label value used to filter events prior to reconciliation.
	WatchFilterValue string
	// StepObserver, when set, sees every step being issued and finishing (benchmarks, the demo).
	StepObserver func(StepEvent)

	recorder events.EventRecorder
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil || r.APIReader == nil || r.Etcd == nil || r.Fencer == nil {
		return errors.New("client, APIReader, Etcd and Fencer must not be nil")
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("capr-controlplane-remediation").
		For(&caprv1.MachineRemediation{}).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.machineToRemediations)).
		WithOptions(options).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the control-plane remediation controller: %w", err)
	}
	r.recorder = mgr.GetEventRecorder("capr-controlplane-remediation")
	return nil
}

// machineToRemediations enqueues the remediations of the Machine's cluster: a Machine appearing,
// getting its Node or going away is what a waiting step waits for.
func (r *Reconciler) machineToRemediations(ctx context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*clusterv1.Machine)
	if !ok {
		return nil
	}
	list := &caprv1.MachineRemediationList{}
	if err := r.Client.List(ctx, list, client.InNamespace(m.Namespace)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, mr := range list.Items {
		if mr.Name == m.Name || (mr.Status.ControlPlane != nil && mr.Status.ControlPlane.ClusterName == m.Spec.ClusterName) ||
			mr.Labels[clusterv1.ClusterNameLabel] == m.Spec.ClusterName {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&mr)})
		}
	}
	return out
}

// Reconcile follows the CAPI skeleton: get → Machine and Cluster → patch helper → paused → deferred
// patch of owned conditions → pending / running.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	mr := &caprv1.MachineRemediation{}
	if err := r.APIReader.Get(ctx, req.NamespacedName, mr); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading MachineRemediation: %w", err)
	}
	if mr.Status.Phase == caprv1.MachineRemediationPhaseSucceeded || mr.Status.Phase == caprv1.MachineRemediationPhaseFailed || !mr.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	log := ctrl.LoggerFrom(ctx).WithValues("Machine", klog.KRef(mr.Namespace, mr.Name))
	ctx = ctrl.LoggerInto(ctx, log)

	machine := &clusterv1.Machine{}
	machineErr := r.Client.Get(ctx, client.ObjectKeyFromObject(mr), machine)
	if machineErr != nil && !apierrors.IsNotFound(machineErr) {
		return ctrl.Result{}, fmt.Errorf("reading Machine: %w", machineErr)
	}
	machineGone := apierrors.IsNotFound(machineErr)
	if machineGone && mr.Status.Phase != caprv1.MachineRemediationPhaseRunning {
		// Nothing was started and there is nothing left to remediate.
		return ctrl.Result{}, nil
	}
	clusterName := ""
	switch {
	case !machineGone:
		clusterName = machine.Spec.ClusterName
	case mr.Status.ControlPlane != nil:
		clusterName = mr.Status.ControlPlane.ClusterName
	}

	s := &scope{mr: mr, base: mr.DeepCopy(), machine: machine}
	defer func() {
		err := r.persist(ctx, s)
		switch {
		case ctx.Err() != nil:
			// Shutting down: nothing unrecorded was issued (see persist); the next run continues.
			reterr = nil
		case apierrors.IsConflict(err):
			// Someone wrote first: read again and redo from the new state (nothing was issued on
			// the basis of an unrecorded change, see persist).
			log.V(2).Info("MachineRemediation changed while being written, reconciling again")
			res = ctrl.Result{RequeueAfter: 100 * time.Millisecond}
		case err != nil:
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()

	if !machineGone && !util.IsControlPlaneMachine(machine) {
		if mr.Status.Phase == "" {
			mr.Status.Phase = caprv1.MachineRemediationPhasePending
		}
		setWaiting(mr, caprv1.MachineRemediationNoRemediatorReason, "This Machine is not a control-plane Machine; worker remediation is not handled by this CAPR version")
		return ctrl.Result{}, nil
	}

	cluster, err := util.GetClusterByName(ctx, r.Client, mr.Namespace, clusterName)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("reading Cluster %s: %w", clusterName, err)
	}
	s.cluster = cluster
	isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, mr)
	// EnsurePausedCondition may have patched the object: what it wrote is the new base.
	s.base = mr.DeepCopy()
	if err != nil || isPaused || requeue {
		return ctrl.Result{}, err
	}
	if err := r.gather(ctx, s); err != nil {
		setWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason, err.Error())
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}
	if machineGone {
		return r.reconcileMachineGone(ctx, s)
	}
	if mr.Status.Phase == caprv1.MachineRemediationPhaseRunning {
		return r.reconcileRunning(ctx, s)
	}
	return r.reconcilePending(ctx, s)
}

// persist writes what changed in the MachineRemediation since it was read (metadata, then status),
// with optimistic locking: a write based on an outdated view fails instead of undoing a newer one.
// Steps call it before issuing an action, so that the action is recorded before it happens.
func (r *Reconciler) persist(ctx context.Context, s *scope) error {
	s.mr.Status.ObservedGeneration = s.mr.Generation
	if !equality.Semantic.DeepEqual(s.base.ObjectMeta, s.mr.ObjectMeta) {
		if err := r.Client.Patch(ctx, s.mr, client.MergeFromWithOptions(s.base, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("writing MachineRemediation metadata: %w", err)
		}
		s.base.ObjectMeta = *s.mr.ObjectMeta.DeepCopy()
	}
	if !equality.Semantic.DeepEqual(s.base.Status, s.mr.Status) {
		status := s.mr.Status.DeepCopy()
		if err := r.Client.Status().Patch(ctx, s.mr, client.MergeFromWithOptions(s.base, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("writing MachineRemediation status: %w", err)
		}
		s.mr.Status = *status
	}
	s.base = s.mr.DeepCopy()
	return nil
}

// reconcilePending checks the preconditions and, when they hold, takes the control plane and starts.
func (r *Reconciler) reconcilePending(ctx context.Context, s *scope) (ctrl.Result, error) {
	mr, m := s.mr, s.machine
	if mr.Status.Phase == "" {
		mr.Status.Phase = caprv1.MachineRemediationPhasePending
	}
	if !m.DeletionTimestamp.IsZero() {
		setWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason, "the Machine is already being deleted")
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}

	// Retry limits (KCP's meaning).
	retry := CheckRetryLimits(remediationRecord(m), mr.Spec.ControlPlane, now())
	switch {
	case retry.GiveUp:
		return r.fail(ctx, s, caprv1.MachineRemediationRetryLimitReachedReason, retry.Message)
	case !retry.WaitUntil.IsZero():
		setWaiting(mr, caprv1.MachineRemediationWaitingForRetryPeriodReason, retry.Message)
		return ctrl.Result{RequeueAfter: time.Until(retry.WaitUntil) + time.Second}, nil
	}

	// One control-plane remediation per cluster at a time.
	if l := lockOf(s.cp); l != nil && l.MachineRemediation != mr.Name {
		active, err := r.lockHolderActive(ctx, mr.Namespace, l)
		if err != nil {
			return ctrl.Result{}, err
		}
		if active {
			setWaiting(mr, caprv1.MachineRemediationAnotherRemediationInProgressReason, fmt.Sprintf(
				"the remediation of control-plane Machine %s is in progress; control-plane Machines are remediated one at a time", l.MachineRemediation))
			return ctrl.Result{RequeueAfter: waitLong}, nil
		}
	}

	desired, err := Replicas(s.cp)
	if err != nil {
		setWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason, err.Error())
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}
	if l := lockOf(s.cp); l != nil && l.MachineRemediation == mr.Name && l.DesiredReplicas > 0 {
		desired = l.DesiredReplicas // we crashed after taking the lock: keep what we recorded then
	}

	in := OrderInput{Policy: caprv1.ControlPlaneOrderAuto, Initialized: initialized(s.cluster), AddsLearners: s.adapter.AddsLearners()}
	if mr.Spec.ControlPlane != nil && mr.Spec.ControlPlane.Order != "" {
		in.Policy = mr.Spec.ControlPlane.Order
	}
	var state *etcdutil.State
	if in.Initialized {
		for _, other := range s.machines {
			if other.Name != m.Name && (!other.Status.NodeRef.IsDefined() || !other.DeletionTimestamp.IsZero()) {
				setWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason, fmt.Sprintf(
					"control-plane Machine %s is still provisioning or being deleted", other.Name))
				return ctrl.Result{RequeueAfter: waitShort}, nil
			}
		}
		state, err = r.inspectEtcd(ctx, s)
		if err != nil {
			setWaiting(mr, caprv1.MachineRemediationEtcdUnreachableReason, fmt.Sprintf("cannot read etcd state, nothing is done without it: %v", err))
			return ctrl.Result{RequeueAfter: waitLong}, nil
		}
		in.Counts = state.Counts()
		in.Victim = victimMember(state, s.victimNode())
		if first, err := r.firstCandidate(ctx, s, state); err != nil {
			return ctrl.Result{}, err
		} else if first != mr.Name {
			setWaiting(mr, caprv1.MachineRemediationAnotherRemediationInProgressReason, fmt.Sprintf(
				"control-plane Machine %s is more broken and is remediated first", first))
			return ctrl.Result{RequeueAfter: waitLong}, nil
		}
		view := ProviderView{ControlPlane: s.cp, Machines: s.machines, Victim: m, Etcd: state}
		in.ProviderRefusesScaleUpNow = s.adapter.ScaleUpRefusal(view, false)
		in.ProviderRefusesScaleUpAfterRemoval = s.adapter.ScaleUpRefusal(view, true)
	}
	decision := ChooseOrder(in)
	if decision.WaitReason != "" {
		msg := decision.WaitMessage
		if state != nil {
			if down := state.Unhealthy(); len(down) > 0 {
				msg += fmt.Sprintf("; unhealthy members: %v", down)
			}
		}
		if decision.WaitReason == caprv1.MachineRemediationQuorumLostReason && !isWaitingFor(mr, caprv1.MachineRemediationQuorumLostReason) {
			r.event(mr, corev1.EventTypeWarning, EventQuorumLost, msg)
		} else if !isWaitingFor(mr, decision.WaitReason) {
			r.event(mr, corev1.EventTypeWarning, EventRemediationWaiting, msg)
		}
		setWaiting(mr, decision.WaitReason, msg)
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}

	// Start: take the lock first (so nobody else starts), then record the plan.
	if err := r.takeLock(ctx, s, desired); err != nil {
		return ctrl.Result{}, err
	}
	cp := &caprv1.ControlPlaneRemediationStatus{
		ClusterName: s.cluster.Name, Order: decision.Order, OrderReason: decision.Reason,
		DesiredReplicas: ptr.To(desired), MemberName: s.victimNode(), RetryCount: retry.RetryCount,
	}
	for _, other := range s.machines {
		cp.MachinesBefore = append(cp.MachinesBefore, other.Name)
	}
	if state != nil {
		if member := state.ByName(s.victimNode()); member != nil {
			cp.MemberID = fmt.Sprintf("%x", member.ID)
		}
	}
	mr.Status.ControlPlane = cp
	// From here on the remediation outlives its Machine (which it deletes): it is re-owned by the
	// Cluster, so that its record is not garbage-collected with the Machine.
	mr.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: s.cluster.Name, UID: s.cluster.UID,
	}}
	if mr.Labels == nil {
		mr.Labels = map[string]string{}
	}
	mr.Labels[clusterv1.ClusterNameLabel] = s.cluster.Name
	mr.Status.Phase = caprv1.MachineRemediationPhaseRunning
	mr.Status.StartTime = ptr.To(metav1.Now())
	mr.Status.LastError = ""
	conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineRemediationStepInProgressReason, Message: "order " + string(decision.Order) + ": " + decision.Reason})
	table := ""
	if state != nil {
		table = "\n" + state.Table()
	}
	r.event(mr, corev1.EventTypeNormal, EventRemediationStarted, fmt.Sprintf("Remediating control-plane Machine %s, order %s: %s%s",
		m.Name, decision.Order, decision.Reason, table))
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation started", "order", decision.Order, "reason", decision.Reason)
	return ctrl.Result{RequeueAfter: time.Millisecond}, nil
}

// firstCandidate returns which of the cluster's pending control-plane remediations goes first.
func (r *Reconciler) firstCandidate(ctx context.Context, s *scope, state *etcdutil.State) (string, error) {
	list := &caprv1.MachineRemediationList{}
	if err := r.Client.List(ctx, list, client.InNamespace(s.mr.Namespace)); err != nil {
		return "", fmt.Errorf("listing MachineRemediations: %w", err)
	}
	byName := map[string]*clusterv1.Machine{}
	for _, m := range s.machines {
		byName[m.Name] = m
	}
	var cands []Candidate
	for _, other := range list.Items {
		if other.Name == s.mr.Name {
			other = *s.mr // the live copy, not the cached one
		}
		m, ok := byName[other.Name]
		if !ok || (other.Status.Phase != "" && other.Status.Phase != caprv1.MachineRemediationPhasePending) || !m.DeletionTimestamp.IsZero() {
			continue
		}
		if other.Name != s.mr.Name && (conditions.GetReason(&other, caprv1.MachineRemediationProgressingCondition) == caprv1.MachineRemediationWaitingForRetryPeriodReason) {
			continue // waiting for its retry period: it does not block others
		}
		cands = append(cands, Candidate{
			Name:      other.Name,
			Requested: annotations.HasRemediateMachine(m) || other.Spec.Source == caprv1.MachineRemediationSourceManual,
			Member:    victimMember(state, m.Status.NodeRef.Name),
			Created:   other.CreationTimestamp.Time,
		})
	}
	return FirstCandidate(cands), nil
}

// reconcileMachineGone handles a running remediation whose Machine no longer exists.
func (r *Reconciler) reconcileMachineGone(ctx context.Context, s *scope) (ctrl.Result, error) {
	if current := currentStep(s.mr); current == caprv1.StepDelete || current == "" {
		return r.runSteps(ctx, s)
	}
	return r.fail(ctx, s, caprv1.MachineRemediationCannotRemediateReason, fmt.Sprintf(
		"Machine %s was deleted by someone else during step %s", s.mr.Name, currentStep(s.mr)))
}

// fail ends the remediation: a person must act. The lock is released and replicas restored.
func (r *Reconciler) fail(ctx context.Context, s *scope, reason, msg string) (ctrl.Result, error) {
	if cp := s.mr.Status.ControlPlane; cp != nil && cp.DesiredReplicas != nil && s.cp != nil {
		if current, err := Replicas(s.cp); err == nil && current != *cp.DesiredReplicas {
			if err := r.setReplicas(ctx, s, *cp.DesiredReplicas, nil); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if err := r.releaseLock(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	s.mr.Status.Phase = caprv1.MachineRemediationPhaseFailed
	s.mr.Status.CompletionTime = ptr.To(metav1.Now())
	s.mr.Status.LastError = msg
	conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationSucceededCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	r.event(s.mr, corev1.EventTypeWarning, EventRemediationFailed, msg)
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation failed", "reason", reason, "message", msg)
	return ctrl.Result{}, nil
}

func setWaiting(mr *caprv1.MachineRemediation, reason, msg string) {
	conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
}

func isWaitingFor(mr *caprv1.MachineRemediation, reason string) bool {
	c := conditions.Get(mr, caprv1.MachineRemediationProgressingCondition)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason
}

func (r *Reconciler) event(mr *caprv1.MachineRemediation, eventType, reason, msg string) {
	if r.recorder != nil {
		r.recorder.Eventf(mr, nil, eventType, reason, "Remediate", "%s", msg)
	}
}
