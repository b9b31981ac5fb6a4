package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
)

// reconcileTerminal handles finished requests: a deleted one lets go of its finalizer, a Failed one
// with the retry annotation starts again from Pending. A finished request holds nothing (succeed and
// fail release the lock before they record the phase).
func (r *Reconciler) reconcileTerminal(ctx context.Context, s *scope) ctrl.Result {
	mr := s.mr
	if !mr.DeletionTimestamp.IsZero() {
		controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer)
		return ctrl.Result{}
	}
	if _, ok := mr.Annotations[caprv1.RetryAnnotation]; ok && mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
		delete(mr.Annotations, caprv1.RetryAnnotation)
		previous := conditions.GetMessage(mr, caprv1.MachineRemediationSucceededCondition)
		mr.Status = caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhasePending}
		remediation.SetWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason, "retry requested with annotation "+caprv1.RetryAnnotation)
		msg := fmt.Sprintf("Retry requested: the remediation starts again (it had failed: %s)", previous)
		r.event(mr, corev1.EventTypeNormal, EventRemediationRetried, msg)
		ctrl.LoggerFrom(ctx).Info("Failed control-plane remediation retried on request")
		return ctrl.Result{RequeueAfter: time.Millisecond}
	}
	return ctrl.Result{}
}

// reconcileDelete aborts: undo before the point of no return, finish after it. A deletion of the
// victim held by the hook is fenced first; a fence left is undone last, while the finalizer holds
// the request (the undo has already let the control plane go).
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	mr := s.mr
	if done, res, err := r.fenceHeldFirst(ctx, s); !done || err != nil {
		return res, err
	}
	if mr.Status.Phase == caprv1.MachineRemediationPhaseRunning {
		if r.pastPointOfNoReturn(ctx, s) {
			if !isWaitingFor(mr, caprv1.MachineRemediationAbortedReason) {
				r.event(mr, corev1.EventTypeWarning, remediation.EventRemediationAborted,
					"Deletion requested, but "+whyIrreversible(s)+": the remediation is finished first, then the request goes")
			}
			if s.machineGone {
				return r.reconcileMachineGone(ctx, s)
			}
			return r.reconcileRunning(ctx, s)
		}
		// Once undone it holds nothing any more (endUndo: back to Pending); only its fence may be left
		// to undo. An undo begun for another reason ends as that one says, and the request then goes.
		if done, res, err := r.undoThen(ctx, s, caprv1.MachineRemediationPhasePending, caprv1.MachineRemediationAbortedReason, func(undone string) string {
			return "Remediation aborted (the request was deleted): " + undone
		}); !done || err != nil {
			return res, err
		}
	}
	if err := r.releaseLock(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if done, res, err := r.unfenceEnded(ctx, s, "Remediation aborted (the request was deleted); its fence is undone before it goes: "); !done || err != nil {
		return res, err
	}
	controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer)
	return ctrl.Result{}, nil
}

// reconcileFinishedFence undoes the fence a finished (Failed) remediation still owes, then treats it
// as any finished request (retry, deletion): a retry never starts over a fence that is still there.
func (r *Reconciler) reconcileFinishedFence(ctx context.Context, s *scope) (ctrl.Result, error) {
	if done, res, err := r.unfenceEnded(ctx, s, "The remediation ended; its fence is undone: "); !done || err != nil {
		return res, err
	}
	return r.reconcileTerminal(ctx, s), nil
}

// reconcileMachineGone handles a running remediation whose Machine no longer exists.
func (r *Reconciler) reconcileMachineGone(ctx context.Context, s *scope) (ctrl.Result, error) {
	if current := currentStep(s.mr); current == caprv1.StepDelete || current == "" {
		return r.runSteps(ctx, s)
	}
	if r.pastPointOfNoReturn(ctx, s) {
		// The victim lost its member and is gone: what is left is to get the replacement, within the
		// bound of that wait.
		if done, err := r.replacementWaitEnds(ctx, s); done || err != nil {
			return ctrl.Result{}, err
		}
		return r.runSteps(ctx, s)
	}
	return r.fail(ctx, s, caprv1.MachineRemediationCannotRemediateReason, fmt.Sprintf(
		"Machine %s was deleted by someone else during step %s", s.mr.Name, currentStep(s.mr)))
}
