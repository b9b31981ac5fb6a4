package remediation

import (
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/predicates"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// This file is the skeleton both remediators (remediation/controlplane, remediation/worker) are built
// on: which of them owns a request, the watch chain, and the small helpers every step uses. Each
// remediator brings its own strategy (its steps, and which events wake which requests).

// IsWorkerRequest reports whether a request belongs to the worker remediator: the control-plane
// remediator did not record it (status.controlPlane: it may hold its cluster's lock and have changed
// etcd's membership, which only it can finish or undo, so that record decides over any other), and
// it recorded status.worker (durable, also once the Machine is gone) or its Machine exists and is
// not a control-plane Machine. The control-plane remediator leaves such requests alone and takes up
// every other one, so each request has exactly one owner.
func IsWorkerRequest(mr *caprv1.MachineRemediation, machine *clusterv1.Machine, machineGone bool) bool {
	return mr.Status.ControlPlane == nil && (mr.Status.Worker != nil || (!machineGone && !util.IsControlPlaneMachine(machine)))
}

// StepResult is what one attempt at a step found.
type StepResult struct {
	// Done: the step is over; Skipped (it had nothing to do) or Failed (done without effect, e.g. an
	// escalation step that timed out: the next step follows).
	Done, Skipped, Failed bool
	// Recovered: the Machine is healthy again; the remediation ends here, nothing deleted.
	Recovered bool
	Message   string
	// WaitReason, when set, is the Progressing reason while the step cannot proceed (with a Warning
	// event when it changes).
	WaitReason string
	Requeue    time.Duration
}

// Terminal is true for Succeeded and Failed requests.
func Terminal(mr *caprv1.MachineRemediation) bool {
	return mr.Status.Phase == caprv1.MachineRemediationPhaseSucceeded || mr.Status.Phase == caprv1.MachineRemediationPhaseFailed
}

// SetWaiting records in the Progressing condition why the remediation cannot proceed now.
func SetWaiting(mr *caprv1.MachineRemediation, reason, msg string) {
	conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
}

// Event records an event on a request (nothing when the remediator has no recorder: unit tests).
func Event(recorder events.EventRecorder, mr *caprv1.MachineRemediation, eventType, reason, msg string) {
	if recorder != nil {
		recorder.Eventf(mr, nil, eventType, reason, "Remediate", "%s", msg)
	}
}

// PhaseChangedOrDeleted passes the events of a request that can release what it held (the control
// plane, a slot of a MachineDeployment): its phase changing, its deletion starting, or it going.
// counts says whether the request is one whose events matter to the remediator.
func PhaseChangedOrDeleted(counts func(*caprv1.MachineRemediation) bool) predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		DeleteFunc: func(e event.DeleteEvent) bool {
			mr, ok := e.Object.(*caprv1.MachineRemediation)
			return ok && counts(mr)
		},
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*caprv1.MachineRemediation)
			n, ok2 := e.ObjectNew.(*caprv1.MachineRemediation)
			return ok1 && ok2 && counts(n) &&
				(o.Status.Phase != n.Status.Phase || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero())
		},
	}
}

// RequestsOfCluster returns the unfinished requests of a cluster's Machines, except the one named
// except. recordedCluster returns the cluster a request's remediator recorded ("" for none: its
// cluster-name label decides) and false for a request the remediator never acts on. Read-only, and
// run for watch events: without copies.
func RequestsOfCluster(ctx context.Context, c client.Reader, namespace, clusterName, except string,
	recordedCluster func(*caprv1.MachineRemediation) (string, bool)) []reconcile.Request {
	list := &caprv1.MachineRemediationList{}
	if err := c.List(ctx, list, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		mr := &list.Items[i]
		recorded, mine := recordedCluster(mr)
		if mr.Name == except || Terminal(mr) || !mine {
			continue
		}
		if recorded == clusterName || mr.Labels[clusterv1.ClusterNameLabel] == clusterName {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(mr)})
		}
	}
	return out
}

// Watches is a remediator's watch chain: its requests (For), the other requests whose phase changes
// can let one of them go on, their Machines, and their Cluster's pause transitions.
type Watches struct {
	// Name names the controller and its event recorder.
	Name string
	// WatchFilterValue is the label value used to filter events prior to reconciliation.
	WatchFilterValue string
	// Requests filters the requests reconciled (nil: all).
	Requests predicate.Predicate
	// Released maps a request that finished or went away to the requests it may let go on; Counts
	// says which requests' events matter (PhaseChangedOrDeleted).
	Released handler.MapFunc
	Counts   func(*caprv1.MachineRemediation) bool
	// Machine maps a Machine's event to the requests that wait on it.
	Machine handler.MapFunc
	// Cluster maps a Cluster's pause transition to its requests.
	Cluster handler.MapFunc
}

// Complete registers the controller of r with the manager and returns its event recorder.
func (w Watches) Complete(ctx context.Context, mgr ctrl.Manager, options controller.Options, r reconcile.Reconciler) (events.EventRecorder, error) {
	log := ctrl.LoggerFrom(ctx)
	scheme := mgr.GetScheme()
	filter := predicates.ResourceHasFilterLabel(scheme, log, w.WatchFilterValue)
	forPredicates := []predicate.Predicate{filter}
	if w.Requests != nil {
		forPredicates = []predicate.Predicate{w.Requests, filter}
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named(w.Name).
		For(&caprv1.MachineRemediation{}, builder.WithPredicates(forPredicates...)).
		Watches(&caprv1.MachineRemediation{}, handler.EnqueueRequestsFromMapFunc(w.Released),
			builder.WithPredicates(PhaseChangedOrDeleted(w.Counts), filter)).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(w.Machine), builder.WithPredicates(filter)).
		// Pausing or unpausing the Cluster stops or resumes its remediations.
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(w.Cluster),
			builder.WithPredicates(predicates.All(scheme, log, predicates.ClusterPausedTransitions(scheme, log), filter))).
		WithOptions(options).
		Complete(r)
	if err != nil {
		return nil, err //nolint:wrapcheck // each remediator says which controller failed
	}
	return mgr.GetEventRecorder(w.Name), nil
}

// finalWriteTimeout bounds the status write of a reconcile that the reconcile timeout cut short.
const finalWriteTimeout = 10 * time.Second

// WriteContext is the context of a reconcile's final status write. When the reconcile timeout
// (controllers.DefaultReconcileTimeout) has cut the reconcile short, ctx is done, yet what the
// reconcile decided must still be written, or it is lost (the condition saying why it waits, a step's
// message): the write gets a context of its own, bounded by finalWriteTimeout. On shutdown (ctx
// canceled) ctx is kept: the manager is leaving, and whoever runs next starts from the API's state.
func WriteContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
}
