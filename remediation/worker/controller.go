package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/escalation"
	"github.com/capr-io/capr/remediation/fencing"
)

// Requeue intervals while waiting on the world (watches bring the controller back sooner).
const (
	waitShort = 2 * time.Second
	waitLong  = 15 * time.Second
)

// DefaultDeleteTimeout is how long the Delete step waits for the Machine to go before it reports
// StepTimedOut (it keeps waiting: a deletion in progress cannot be undone).
const DefaultDeleteTimeout = 10 * time.Minute

// Events on a MachineRemediation.
const (
	EventNoRemediator         = "NoRemediator"
	EventEscalationCreated    = escalation.EventCreated
	EventEscalationObjectLeft = escalation.EventObjectLeft
	// EventFencedDeletingMachine: someone else deleted the Machine during the remediation; the hook
	// held the deletion until the Machine was fenced.
	EventFencedDeletingMachine = "FencedDeletingMachine"
)

// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations/status,verbs=patch
// An escalation object blocks its MachineRemediation's deletion (blockOwnerDeletion), which the
// OwnerReferencesPermissionEnforcement admission plugin allows only with update on its finalizers.
// +kubebuilder:rbac:groups=remediation.cluster.x-k8s.io,resources=machineremediations/finalizers,verbs=update
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinesets;machinedeployments,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=core;events.k8s.io,resources=events,verbs=create;patch

// Reconciler drives worker MachineRemediations.
type Reconciler struct {
	Client client.Client
	// APIReader reads MachineRemediations live: a request's own durable state (unless the cached
	// copy is known to be current, readRequest) and the number of remediations in flight must never
	// be read stale from a cache.
	APIReader client.Reader
	Fencer    fencing.Fencer

	// WatchFilterValue is the label value used to filter events prior to reconciliation.
	WatchFilterValue string
	// DeleteTimeout overrides DefaultDeleteTimeout (tests).
	DeleteTimeout time.Duration
	// EscalationTimeout, when set, turns an escalation step's timeoutSeconds into its timeout (tests:
	// the API's minimum of 60 s is too long to wait for).
	EscalationTimeout func(timeoutSeconds int32) time.Duration

	// admitMu serialises the admission decision and the write of Running, so that two requests of
	// one MachineDeployment never both take its last free slot (the manager runs with leader election:
	// one process decides).
	admitMu  sync.Mutex
	recorder events.EventRecorder
	// seen tells readRequest when the cached copy of a request is as new as this remediator's view.
	seen remediation.SeenVersions
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, options controller.Options) error {
	if r.Client == nil || r.APIReader == nil || r.Fencer == nil {
		return errors.New("client, APIReader and Fencer must not be nil")
	}
	recorder, err := remediation.Watches{
		Name:             "capr-worker-remediation",
		WatchFilterValue: r.WatchFilterValue,
		Requests:         notControlPlane(),
		// A worker remediation that finishes or goes away frees a slot of its MachineDeployment.
		Released: r.remediationToGroup,
		Counts:   func(mr *caprv1.MachineRemediation) bool { return mr.Status.Worker != nil },
		// The Machine going away ends the Delete step; its pause annotation stops the remediation.
		Machine: r.machineToRemediation,
		Cluster: r.clusterToRemediations,
	}.Complete(ctx, mgr, options, r)
	if err != nil {
		return fmt.Errorf("setting up the worker remediation controller: %w", err)
	}
	r.recorder = recorder
	return nil
}

// scope is what one reconcile works on.
type scope struct {
	mr          *caprv1.MachineRemediation
	machine     *clusterv1.Machine
	machineGone bool
	cluster     *clusterv1.Cluster
	// base is the request as last read or written; persist sends the difference.
	base *caprv1.MachineRemediation
}

// Reconcile follows the CAPI skeleton: get → Machine and Cluster → base for the patch → paused → deferred
// patch → delete / Machine gone / running / pending.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	mr, err := r.readRequest(ctx, req.NamespacedName)
	if err != nil {
		return ctrl.Result{}, err
	}
	if mr == nil {
		return ctrl.Result{}, r.releaseOrphanedHook(ctx, req.NamespacedName)
	}
	machine, machineGone, err := r.readMachine(ctx, client.ObjectKeyFromObject(mr))
	if err != nil {
		return ctrl.Result{}, err
	}
	if !remediation.IsWorkerRequest(mr, machine, machineGone) {
		return ctrl.Result{}, nil // the control-plane remediator's
	}
	log := ctrl.LoggerFrom(ctx).WithValues("Machine", klog.KRef(mr.Namespace, mr.Name))
	ctx = ctrl.LoggerInto(ctx, log)
	s := &scope{mr: mr, machine: machine, machineGone: machineGone}

	if remediation.Terminal(mr) {
		if !mr.DeletionTimestamp.IsZero() {
			return ctrl.Result{}, r.removeFinalizer(ctx, mr)
		}
		return ctrl.Result{}, nil
	}
	cluster, err := util.GetClusterByName(ctx, r.Client, mr.Namespace, clusterNameOf(s))
	if err != nil {
		if apierrors.IsNotFound(err) && !mr.DeletionTimestamp.IsZero() {
			return ctrl.Result{}, r.removeFinalizer(ctx, mr)
		}
		return ctrl.Result{}, fmt.Errorf("reading Cluster %s: %w", clusterNameOf(s), err)
	}
	s.cluster = cluster
	log = log.WithValues("Cluster", klog.KObj(cluster))
	ctx = ctrl.LoggerInto(ctx, log)

	s.base = mr.DeepCopy()
	if !annotations.IsPaused(cluster, mr) {
		// Not paused: the condition EnsurePausedCondition would write in a patch of its own (and then
		// return to wait for the update event) goes out with this reconcile's other changes (persist).
		conditions.Set(mr, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionFalse, Reason: clusterv1.NotPausedReason})
	}
	if isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, mr); err != nil || isPaused || requeue {
		return ctrl.Result{}, err
	}
	defer func() {
		writeCtx, cancel := remediation.WriteContext(ctx)
		defer cancel()
		if err := r.persist(writeCtx, s); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()

	switch {
	case !mr.DeletionTimestamp.IsZero():
		return r.reconcileDelete(ctx, s)
	case machineGone:
		return r.reconcileMachineGone(ctx, s)
	case annotations.HasPaused(machine):
		remediation.SetWaiting(mr, caprv1.MachineRemediationPausedReason,
			fmt.Sprintf("Machine %s has annotation %s: nothing is done until it is removed", machine.Name, clusterv1.PausedAnnotation))
		return ctrl.Result{}, nil
	case mr.Status.Phase == caprv1.MachineRemediationPhaseRunning && mr.Status.Worker == nil:
		// start records the worker status before Running, so only a status written by someone else
		// gets here: nothing this remediator did can be resumed from it, and nothing is done.
		remediation.SetWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason,
			"status.phase is Running but status.worker is missing (the status was not written by CAPR's worker remediator): nothing is done; delete the request to start again")
		return ctrl.Result{}, nil
	case mr.Status.Phase == caprv1.MachineRemediationPhaseRunning && mr.Status.Worker.MachineSet == "":
		// start runs only for a Machine a MachineSet replaces, and records it: a Running request
		// whose record names none (e.g. Running written over a NoRemediator record) was not started
		// here, and its Machine, which nothing would replace, is never deleted.
		remediation.SetWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason,
			"status.phase is Running but status.worker names no MachineSet (the status was not written by CAPR's worker remediator): nothing is done; delete the request to start again")
		return ctrl.Result{}, nil
	case mr.Status.Phase == caprv1.MachineRemediationPhaseRunning:
		return r.reconcileRunning(ctx, s)
	}
	return r.reconcilePending(ctx, s)
}

// readRequest reads the request from the cache when that copy is known to be no older than what
// this remediator last wrote or read live (remediation.SeenVersions: its status is the record of
// what was done, and a step must never be decided from an older copy), else live. A request the
// cache does not have is not read live: it is gone (its delete event, and the requeues still
// queued for it, end here without a request to the API server), or so new that its create event
// is still on its way and reconciles it then. It returns nil when the request does not exist.
func (r *Reconciler) readRequest(ctx context.Context, key client.ObjectKey) (*caprv1.MachineRemediation, error) {
	mr := &caprv1.MachineRemediation{}
	err := r.Client.Get(ctx, key, mr)
	if err == nil && !r.seen.Current(mr) {
		if err = r.APIReader.Get(ctx, key, mr); err == nil {
			r.seen.Saw(mr)
		}
	}
	switch {
	case err == nil:
		return mr, nil
	case apierrors.IsNotFound(err):
		r.seen.Forget(key)
		return nil, nil
	default:
		return nil, fmt.Errorf("reading MachineRemediation: %w", err)
	}
}

// releaseOrphanedHook removes CAPR's deletion hooks (remediation.DeletionHooks) whose
// MachineRemediation no longer exists (its finalizer removed by hand, or CAPR stopped mid-way and the
// request deleted): nothing would ever remove them, and they would hold the Machine's deletion
// forever (the provider, KCP included, does nothing while a Machine is deleting). Requests are named
// after their Machine, which a hook's value names. The request is confirmed gone live before a hook is
// removed: the cache may not have it yet. An orphaned replicas-back hook is logged as such: the
// control plane's replicas may still include the remediation's surge, and its provider may now
// replace the victim at them (docs/operations/runbook.md).
func (r *Reconciler) releaseOrphanedHook(ctx context.Context, key client.ObjectKey) error {
	m := &clusterv1.Machine{}
	if err := r.Client.Get(ctx, key, m); err != nil {
		return client.IgnoreNotFound(err)
	}
	var orphaned []string
	for _, hook := range remediation.DeletionHooks {
		if m.Annotations[hook] == key.Name {
			orphaned = append(orphaned, hook)
		}
	}
	if len(orphaned) == 0 {
		return nil
	}
	if err := r.APIReader.Get(ctx, key, &caprv1.MachineRemediation{}); !apierrors.IsNotFound(err) {
		if err != nil {
			return fmt.Errorf("reading MachineRemediation: %w", err)
		}
		return nil // it exists: its create event reconciles it
	}
	live, removed, err := remediation.RemoveMachineAnnotations(ctx, r.Client, r.APIReader, key, orphaned...)
	if err != nil || len(removed) == 0 {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("Removed the deletion hooks of a MachineRemediation that no longer exists", "Machine", klog.KObj(live), "hooks", removed)
	return nil
}

// readMachine reads the request's Machine. "Not found" in the cache is confirmed live: a Machine
// that is gone ends a remediation, so a lagging cache must not decide it.
func (r *Reconciler) readMachine(ctx context.Context, key client.ObjectKey) (*clusterv1.Machine, bool, error) {
	m := &clusterv1.Machine{}
	err := r.Client.Get(ctx, key, m)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, m)
	}
	switch {
	case err == nil:
		return m, false, nil
	case apierrors.IsNotFound(err):
		return m, true, nil
	default:
		return nil, false, fmt.Errorf("reading Machine: %w", err)
	}
}

// clusterNameOf returns the Cluster of the remediation: the Machine's, or what the remediation recorded.
func clusterNameOf(s *scope) string {
	if !s.machineGone {
		return s.machine.Spec.ClusterName
	}
	if s.mr.Status.Worker != nil && s.mr.Status.Worker.ClusterName != "" {
		return s.mr.Status.Worker.ClusterName
	}
	return s.mr.Labels[clusterv1.ClusterNameLabel]
}

// persist writes what changed in the request since it was read (remediation.Persist). Steps call
// it before issuing an action, so that the action is recorded before it happens.
func (r *Reconciler) persist(ctx context.Context, s *scope) error {
	read := s.mr.ResourceVersion
	gone, err := remediation.Persist(ctx, r.Client, s.base, s.mr)
	switch {
	case gone:
		r.seen.Forget(client.ObjectKeyFromObject(s.mr))
	case s.mr.ResourceVersion != read:
		r.seen.Saw(s.mr) // what was written, also when a later write of the two failed
	}
	return err
}

// removeFinalizer lets a finished request (or one whose Cluster is gone) go; it is called before
// persist's base exists.
func (r *Reconciler) removeFinalizer(ctx context.Context, mr *caprv1.MachineRemediation) error {
	base := mr.DeepCopy()
	if !controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer) {
		return nil
	}
	if err := r.Client.Patch(ctx, mr, client.MergeFrom(base)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("removing the finalizer of MachineRemediation %s: %w", mr.Name, err)
	}
	return nil
}

// setWaitingWithEvent sets the waiting condition and, when the reason changes, records a Warning event.
func (r *Reconciler) setWaitingWithEvent(mr *caprv1.MachineRemediation, eventReason, reason, msg string) {
	if conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition) != reason ||
		conditions.IsTrue(mr, caprv1.MachineRemediationProgressingCondition) {
		r.event(mr, corev1.EventTypeWarning, eventReason, msg)
	}
	remediation.SetWaiting(mr, reason, msg)
}

func (r *Reconciler) event(mr *caprv1.MachineRemediation, eventType, reason, msg string) {
	remediation.Event(r.recorder, mr, eventType, reason, msg)
}
