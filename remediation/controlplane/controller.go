package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/paused"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/fencing"
)

// Requeue intervals while waiting on the world (watches bring the controller back sooner).
const (
	waitShort = 2 * time.Second
	waitLong  = 15 * time.Second
	// pollUnwatched is the requeue of a wait on what no watch reports: etcd (a replacement's member
	// becoming a healthy voter, a removal etcd refused for now) and a control-plane object of a kind
	// the user chooses, read live (the Cluster topology bringing the replicas back): acted on within
	// a second of the change.
	pollUnwatched = 500 * time.Millisecond
)

// Events on a MachineRemediation.
const (
	EventStepStarted               = "StepStarted"
	EventStepFinished              = "StepFinished"
	EventRemediationFailed         = "RemediationFailed"
	EventQuorumLost                = "EtcdQuorumLost"
	EventFencedDeletingVictim      = "FencedDeletingVictim"
	EventRemediationRetried        = "RemediationRetried"
	EventRemediationWithdrawn      = "RemediationWithdrawn"
	EventRemediationYielded        = "RemediationYielded"
	EventSurplusReplacementDeleted = "SurplusReplacementDeleted"
	EventOrderReplanned            = "OrderReplanned"
	EventReplicasChangedElsewhere  = "ReplicasChangedElsewhere"
	EventDownMemberRemoved         = "DownMemberRemoved"
	EventDrainSkipped              = "DrainSkipped"
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

// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations/status,verbs=patch
// An escalation object blocks its MachineRemediation's deletion (blockOwnerDeletion), which the
// OwnerReferencesPermissionEnforcement admission plugin allows only with update on its finalizers.
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations/finalizers,verbs=update
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;patch;delete
// Clusters are patched only for Cluster spec.topology.controlPlane.replicas (a surge of a control
// plane the Cluster topology owns, server-side applied with TopologyFieldManager; topology.go).
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch;patch
// Only KubeadmControlPlane is granted here (read through the contract, patched for replicas and
// annotations); other control-plane providers are granted by a ClusterRole labelled
// remediation.cluster.x-k8s.io/aggregate-to-manager (config/rbac), not by a wildcard.
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=kubeadmcontrolplanes,verbs=get;list;watch;patch

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
	// EscalationTimeout, when set, turns an escalation step's timeoutSeconds into its timeout (tests:
	// the API's minimum of 60 s is too long to wait for).
	EscalationTimeout func(timeoutSeconds int32) time.Duration
	// Adapter, when set, replaces AdapterFor (tests: a provider whose scale-down preflight refuses,
	// so that DeleteFirst is taken on the sandbox, whose provider the Generic adapter describes).
	Adapter func(cp *unstructured.Unstructured) Adapter

	recorder events.EventRecorder
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil || r.APIReader == nil || r.Etcd == nil || r.Fencer == nil {
		return errors.New("client, APIReader, Etcd and Fencer must not be nil")
	}
	recorder, err := remediation.Watches{
		Name:             "capr-controlplane-remediation",
		WatchFilterValue: r.WatchFilterValue,
		// A remediation that finishes or goes away releases the control plane: wake the others of
		// its cluster now instead of at their next requeue.
		Released: r.remediationToSiblings,
		Counts:   func(*caprv1.MachineRemediation) bool { return true },
		Machine:  r.machineToRemediations,
		Cluster:  r.clusterToRemediations,
	}.Complete(ctx, mgr, options, r)
	if err != nil {
		return fmt.Errorf("setting up the control-plane remediation controller: %w", err)
	}
	r.recorder = recorder
	return nil
}

// remediationsOfCluster returns the requests for the remediations of a cluster's Machines.
func (r *Reconciler) remediationsOfCluster(ctx context.Context, namespace, clusterName, except string) []reconcile.Request {
	return remediation.RequestsOfCluster(ctx, r.Client, namespace, clusterName, except, func(mr *caprv1.MachineRemediation) (string, bool) {
		if mr.Status.ControlPlane != nil {
			return mr.Status.ControlPlane.ClusterName, true
		}
		return "", true
	})
}

// remediationToSiblings maps a remediation to the other remediations of its cluster. The request
// of a worker Machine wakes nobody: it never holds the control plane and is never a candidate
// (waitingCandidates considers control-plane Machines only), so its phase changes cannot change
// another remediation's decision.
func (r *Reconciler) remediationToSiblings(ctx context.Context, o client.Object) []reconcile.Request {
	mr, ok := o.(*caprv1.MachineRemediation)
	if !ok {
		return nil
	}
	m := &clusterv1.Machine{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(mr), m); err == nil && !util.IsControlPlaneMachine(m) {
		return nil
	}
	clusterName := mr.Labels[clusterv1.ClusterNameLabel]
	if mr.Status.ControlPlane != nil {
		clusterName = mr.Status.ControlPlane.ClusterName
	}
	if clusterName == "" {
		return nil
	}
	return r.remediationsOfCluster(ctx, mr.Namespace, clusterName, mr.Name)
}

// clusterToRemediations maps a Cluster to its remediations.
func (r *Reconciler) clusterToRemediations(ctx context.Context, o client.Object) []reconcile.Request {
	return r.remediationsOfCluster(ctx, o.GetNamespace(), o.GetName(), "")
}

// machineToRemediations enqueues the remediations of the Machine's cluster: a Machine appearing,
// getting its Node or going away is what a waiting step waits for. Only control-plane Machines are
// waited for (the remediator reads no other Machine, see gather), so a worker Machine's event
// enqueues only its own request: marking many workers at once costs one reconcile per Machine,
// not one per Machine and request of the cluster.
func (r *Reconciler) machineToRemediations(ctx context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*clusterv1.Machine)
	if !ok {
		return nil
	}
	if !util.IsControlPlaneMachine(m) {
		key := client.ObjectKeyFromObject(m)
		if err := r.Client.Get(ctx, key, &caprv1.MachineRemediation{}); err != nil {
			return nil
		}
		return []reconcile.Request{{NamespacedName: key}}
	}
	list := &caprv1.MachineRemediationList{}
	if err := r.Client.List(ctx, list, client.InNamespace(m.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		mr := &list.Items[i]
		if mr.Name == m.Name || (mr.Status.ControlPlane != nil && mr.Status.ControlPlane.ClusterName == m.Spec.ClusterName) ||
			mr.Labels[clusterv1.ClusterNameLabel] == m.Spec.ClusterName {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(mr)})
		}
	}
	return out
}

// Reconcile follows the CAPI skeleton: get → Machine and Cluster → patch helper → paused → deferred
// persist → delete / Machine gone / running / pending.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	// The request of an existing worker Machine is remediation/worker's unless this remediator
	// recorded it (IsWorkerRequest on the cached copies): leave it before the live read. A cached
	// request older than the live one is reconciled again when the cache catches up; one the cache
	// does not have is gone (its deletion costs the API server no read) or its create event is coming.
	if m := (&clusterv1.Machine{}); r.Client.Get(ctx, req.NamespacedName, m) == nil && !util.IsControlPlaneMachine(m) {
		cached := &caprv1.MachineRemediation{}
		if err := r.Client.Get(ctx, req.NamespacedName, cached); apierrors.IsNotFound(err) || (err == nil && remediation.IsWorkerRequest(cached, m, false)) {
			return ctrl.Result{}, nil
		}
	}
	mr := &caprv1.MachineRemediation{}
	if err := r.APIReader.Get(ctx, req.NamespacedName, mr); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading MachineRemediation: %w", err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("Machine", klog.KRef(mr.Namespace, mr.Name))
	ctx = ctrl.LoggerInto(ctx, log)

	machine := &clusterv1.Machine{}
	machineErr := r.Client.Get(ctx, client.ObjectKeyFromObject(mr), machine)
	if machineErr != nil && !apierrors.IsNotFound(machineErr) {
		return ctrl.Result{}, fmt.Errorf("reading Machine: %w", machineErr)
	}
	machineGone := apierrors.IsNotFound(machineErr)
	if remediation.IsWorkerRequest(mr, machine, machineGone) {
		return ctrl.Result{}, nil // remediation/worker's: not even observedGeneration is written here
	}

	s := &scope{mr: mr, base: mr.DeepCopy(), machine: machine, machineGone: machineGone}
	defer func() {
		writeCtx, cancel := remediation.WriteContext(ctx)
		defer cancel()
		err := r.persist(writeCtx, s)
		switch {
		case errors.Is(ctx.Err(), context.Canceled):
			// Shutting down: nothing unrecorded was issued (see persist); the next run continues.
			reterr = nil
		case ctx.Err() != nil:
			// The reconcile timeout (controllers.DefaultReconcileTimeout) cut it short: as when
			// shutting down nothing unrecorded was issued, what it decided was written all the same
			// (WriteContext), and the error has the request reconciled again, with backoff, instead
			// of at the next event.
			reterr = kerrors.NewAggregate([]error{reterr, err, fmt.Errorf("reconciling MachineRemediation: %w", context.Cause(ctx))})
		case apierrors.IsConflict(err):
			// Someone wrote first: read again and redo from the new state (nothing was issued on
			// the basis of an unrecorded change, see persist). A step's error is retried with its
			// back-off instead (controller-runtime ignores a requeue returned with an error).
			log.V(2).Info("MachineRemediation changed while being written, reconciling again")
			if reterr == nil {
				res = ctrl.Result{RequeueAfter: 100 * time.Millisecond}
			}
		case err != nil:
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()

	if remediation.Terminal(mr) && !fencing.Owed(mr) {
		return r.reconcileTerminal(ctx, s), nil
	}
	if mr.Status.Phase == caprv1.MachineRemediationPhaseRunning && mr.Status.ControlPlane == nil {
		reconcileRunningWithoutRecord(s)
		return ctrl.Result{}, nil
	}
	// A request whose Machine does not exist and that never started has nothing to remediate, whatever
	// its Cluster is (or whether it exists): that is what it says (machineNotFound), not what reading
	// its Cluster finds. It waits, for the Machine may not be in the cache yet (the Machine's events
	// bring it back); a lock a start that did not complete took is still released below.
	unstarted := machineGone && mr.DeletionTimestamp.IsZero() && !remediation.Terminal(mr) && mr.Status.Phase != caprv1.MachineRemediationPhaseRunning
	clusterName := clusterNameOf(s)
	if clusterName == "" {
		// A request whose Machine is gone before it was ever started: nothing was done and nothing
		// is left to remediate. (Before taking the lock a request is always labelled with its
		// Cluster, so a request without the label holds nothing.)
		controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer)
		if unstarted {
			r.wait(s, machineNotFound(mr))
		}
		return ctrl.Result{}, nil
	}
	cluster, err := util.GetClusterByName(ctx, r.Client, mr.Namespace, clusterName)
	if err != nil {
		if apierrors.IsNotFound(err) && !mr.DeletionTimestamp.IsZero() {
			controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer)
			return ctrl.Result{}, nil
		}
		if apierrors.IsNotFound(err) && unstarted {
			return r.wait(s, machineNotFound(mr)), nil // no Cluster, no lock to release
		}
		return ctrl.Result{}, fmt.Errorf("reading Cluster %s: %w", clusterName, err)
	}
	s.cluster = cluster
	isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, mr)
	// EnsurePausedCondition may have patched the object: what it wrote is the new base.
	s.base = mr.DeepCopy()
	if err != nil || isPaused || requeue {
		return ctrl.Result{}, err
	}
	if unstarted {
		r.wait(s, machineNotFound(mr))
	}
	if err := r.gather(ctx, s); err != nil {
		if !unstarted {
			// (An unstarted request's condition says why nothing is done; a lock it may hold is
			// released once the control plane can be read.)
			remediation.SetWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason, err.Error())
		}
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}
	if msg := pausedBy(s); msg != "" {
		remediation.SetWaiting(mr, caprv1.MachineRemediationPausedReason, msg)
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}
	switch {
	case remediation.Terminal(mr):
		return r.reconcileFinishedFence(ctx, s)
	case !mr.DeletionTimestamp.IsZero():
		return r.reconcileDelete(ctx, s)
	case machineGone && mr.Status.Phase != caprv1.MachineRemediationPhaseRunning:
		// Nothing was started and there is nothing left to remediate (the condition says so); a lock
		// taken in a start that did not complete is released.
		return ctrl.Result{}, r.releaseLock(ctx, s)
	case machineGone:
		return r.reconcileMachineGone(ctx, s)
	case mr.Status.Phase == caprv1.MachineRemediationPhaseRunning:
		return r.reconcileRunning(ctx, s)
	}
	res, err = r.reconcilePending(ctx, s)
	if mr.Status.Phase != caprv1.MachineRemediationPhaseRunning {
		// A Pending request never holds the lock across reconciles: holding it while waiting would
		// block the remediation that has to go first (and wait on it in turn).
		if relErr := r.releaseLock(ctx, s); relErr != nil {
			err = kerrors.NewAggregate([]error{err, relErr})
		}
	}
	return res, err
}

// reconcileRunningWithoutRecord handles a request whose status says Running but has no
// status.controlPlane: start records both in one write, so CAPR did not write it (a hand-written or
// edited status). Nothing can be resumed from it and nothing is done; its deletion is let through
// (it holds nothing CAPR could undo, and a lock naming it is stale once it is gone: lockHolderActive).
func reconcileRunningWithoutRecord(s *scope) {
	if !s.mr.DeletionTimestamp.IsZero() {
		controllerutil.RemoveFinalizer(s.mr, caprv1.MachineRemediationFinalizer)
		return
	}
	remediation.SetWaiting(s.mr, caprv1.MachineRemediationWaitingForPreconditionsReason,
		"status.phase is Running but status.controlPlane is missing (the status was not written by CAPR's control-plane remediator): nothing is done; delete the request to start again")
}

// machineNotFound is the wait of a request whose Machine does not exist and that never started.
func machineNotFound(mr *caprv1.MachineRemediation) *waiting {
	return &waiting{reason: caprv1.MachineRemediationMachineNotFoundReason, warning: caprv1.MachineRemediationMachineNotFoundReason,
		message: fmt.Sprintf("Machine %s does not exist in namespace %s: nothing to remediate, nothing is done (a request is named after its Machine); it goes on if the Machine appears, else delete the request",
			mr.Name, mr.Namespace)}
}

// clusterNameOf returns the Cluster of the remediation: the Machine's, or, once the Machine is gone,
// what the remediation recorded.
func clusterNameOf(s *scope) string {
	switch {
	case !s.machineGone:
		return s.machine.Spec.ClusterName
	case s.mr.Status.ControlPlane != nil && s.mr.Status.ControlPlane.ClusterName != "":
		return s.mr.Status.ControlPlane.ClusterName
	default:
		return s.mr.Labels[clusterv1.ClusterNameLabel]
	}
}

// pausedBy says why the remediation must not act now: CAPI's cluster.x-k8s.io/paused on the Machine
// or on the control-plane object (Cluster.spec.paused and the request's own annotation are handled by
// paused.EnsurePausedCondition).
func pausedBy(s *scope) string {
	switch {
	case !s.machineGone && annotations.HasPaused(s.machine):
		return fmt.Sprintf("Machine %s has annotation %s: nothing is done until it is removed", s.machine.Name, clusterv1.PausedAnnotation)
	case s.cp != nil && annotations.HasPaused(s.cp):
		return fmt.Sprintf("%s %s has annotation %s: nothing is done until it is removed", s.cp.GetKind(), s.cp.GetName(), clusterv1.PausedAnnotation)
	}
	return ""
}

// persist writes what changed in the MachineRemediation since it was read (remediation.Persist).
// Steps call it before issuing an action, so that the action is recorded before it happens.
func (r *Reconciler) persist(ctx context.Context, s *scope) error {
	_, err := remediation.Persist(ctx, r.Client, s.base, s.mr)
	return err
}

// firstCandidate returns which of the cluster's pending control-plane remediations goes first.
func (r *Reconciler) firstCandidate(ctx context.Context, s *scope, state *etcdutil.State) (string, error) {
	cands, err := r.waitingCandidates(ctx, s, state)
	if err != nil {
		return "", err
	}
	return FirstCandidate(cands), nil
}

// waitingCandidates returns the cluster's Pending control-plane remediations that may start (this one
// included while it is Pending), with how broken each victim's etcd member is.
func (r *Reconciler) waitingCandidates(ctx context.Context, s *scope, state *etcdutil.State) ([]Candidate, error) {
	list := &caprv1.MachineRemediationList{}
	if err := r.Client.List(ctx, list, client.InNamespace(s.mr.Namespace)); err != nil {
		return nil, fmt.Errorf("listing MachineRemediations: %w", err)
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
		cands = append(cands, candidate(&other, m, state))
	}
	return cands, nil
}

// candidate describes a remediation for FirstCandidate and YieldTo. Without etcd state (external
// etcd: no member to judge) every victim counts as equally broken. Only the Machine's remediate-machine
// annotation makes it an explicit request: spec.source is writable by anyone who may create a request.
func candidate(mr *caprv1.MachineRemediation, m *clusterv1.Machine, state *etcdutil.State) Candidate {
	member := VictimUnhealthy
	if state != nil {
		member = victimMember(state, m.Status.NodeRef.Name)
	}
	return Candidate{
		Name:      mr.Name,
		Requested: annotations.HasRemediateMachine(m),
		Member:    member,
		Created:   mr.CreationTimestamp.Time,
	}
}

func isWaitingFor(mr *caprv1.MachineRemediation, reason string) bool {
	c := conditions.Get(mr, caprv1.MachineRemediationProgressingCondition)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason
}

func (r *Reconciler) event(mr *caprv1.MachineRemediation, eventType, reason, msg string) {
	remediation.Event(r.recorder, mr, eventType, reason, msg)
}
