package worker

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/fencing"
)

// stepsOf returns the steps of a worker remediation, in order: the escalation chain, then fence and delete.
func stepsOf(mr *caprv1.MachineRemediation) []caprv1.StepName {
	out := make([]caprv1.StepName, 0, len(mr.Spec.Escalation)+2)
	for i := range mr.Spec.Escalation {
		out = append(out, caprv1.EscalationStepName(i))
	}
	return append(out, caprv1.StepFence, caprv1.StepDelete)
}

// nextStep is the first step not finished: not started, or still in progress ("" when all are
// finished; an escalation step that timed out is finished, as Failed).
func nextStep(mr *caprv1.MachineRemediation) caprv1.StepName {
	for _, name := range stepsOf(mr) {
		rec := mr.Status.Step(name)
		if rec == nil || rec.Outcome == caprv1.StepOutcomeInProgress || rec.Outcome == "" {
			return name
		}
	}
	return ""
}

// deleteIssued is the point of no return: the Delete step was started, so the Machine may be deleting.
func deleteIssued(mr *caprv1.MachineRemediation) bool {
	return mr.Status.Step(caprv1.StepDelete) != nil
}

// reconcileRunning keeps fence before delete whoever deletes: until the Fence step has finished the
// Machine carries the fence-before-delete hook (fencing.EnsureHook), so a MachineSet scale-down, a
// rollout or a person deleting it meanwhile is held until it is fenced here, and only then drained
// and deleted by CAPI's Machine controller. A Machine someone else is deleting gets no further step:
// the remediation waits for it to go (reconcileMachineGone then ends it, nothing deleted by CAPR).
func (r *Reconciler) reconcileRunning(ctx context.Context, s *scope) (ctrl.Result, error) {
	if !s.machine.DeletionTimestamp.IsZero() && !deleteIssued(s.mr) {
		return r.waitForDeletionByOthers(ctx, s, "")
	}
	if !fencing.StepFinished(s.mr) && fencing.HookNeeded(fencing.SpecOf(s.mr), s.victimNode(ctx)) {
		m, err := fencing.EnsureHook(ctx, r.Client, s.machine, s.mr.Name)
		if err != nil {
			return ctrl.Result{}, err
		}
		s.machine = m
	}
	return r.runSteps(ctx, s)
}

// waitForDeletionByOthers handles a Machine someone else is deleting before this remediation's Delete
// step: while the hook holds the deletion, the Machine is fenced now (the remediation's own Fence step
// may never come) and the hook removed once the fence is final; then the remediation waits for the
// Machine to go. prefix starts the condition's message (an abort says so).
func (r *Reconciler) waitForDeletionByOthers(ctx context.Context, s *scope, prefix string) (ctrl.Result, error) {
	// Whatever the Fence step did: a hook that holds a deletion (also one put back while an abort
	// unfences) is released only once the Machine is fenced again.
	if fencing.HeldDeletion(s.machine) {
		v, released, err := fencing.FenceHeld(ctx, r.Fencer, r.Client, r.APIReader, s.mr, fencingRequest(ctx, s, time.Time{}), time.Now(), r.persistFunc(s))
		if err != nil {
			return ctrl.Result{}, err
		}
		if !v.Done {
			reason := caprv1.MachineRemediationWaitingForFencingReason
			if v.TimedOut {
				reason = caprv1.MachineRemediationStepTimedOutReason
			}
			r.setWaitingWithEvent(s.mr, remediation.EventRemediationWaiting, reason, fmt.Sprintf(
				"%sMachine %s is being deleted by someone else; its deletion is held until it is fenced: %s", prefix, s.machine.Name, v.Message))
			return ctrl.Result{RequeueAfter: min(v.Requeue, waitShort)}, nil
		}
		if released {
			metrics.Fenced(metrics.KindWorker, v.Outcome(), time.Since(s.machine.DeletionTimestamp.Time))
			r.event(s.mr, corev1.EventTypeNormal, EventFencedDeletingMachine, fmt.Sprintf(
				"Machine %s is being deleted by someone else; fencing finished (%s), its deletion may proceed", s.machine.Name, v.Message))
		}
	}
	remediation.SetWaiting(s.mr, caprv1.MachineRemediationWaitingForPreconditionsReason, fmt.Sprintf(
		"%sMachine %s is being deleted by someone else (since %s); the remediation ends when it is gone", prefix, s.machine.Name,
		s.machine.DeletionTimestamp.UTC().Format(time.RFC3339)))
	return ctrl.Result{RequeueAfter: waitShort}, nil
}

// runSteps works on the current step. A step is recorded as started (and written) before it acts.
func (r *Reconciler) runSteps(ctx context.Context, s *scope) (ctrl.Result, error) {
	step := nextStep(s.mr)
	if step == "" {
		return r.succeed(ctx, s, fmt.Sprintf("Machine %s deleted; MachineSet %s replaces it", s.mr.Name, s.mr.Status.Worker.MachineSet))
	}
	rec := s.mr.Status.Step(step)
	if rec == nil {
		s.mr.Status.Steps = append(s.mr.Status.Steps, caprv1.RemediationStep{
			Name: step, StartTime: ptr.To(metav1.Now()), Outcome: caprv1.StepOutcomeInProgress,
		})
		s.mr.Status.CurrentStep = step
		if err := r.persist(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		rec = s.mr.Status.Step(step)
	}
	var res remediation.StepResult
	var err error
	switch step {
	case caprv1.StepFence:
		res, err = r.stepFence(ctx, s, rec)
	case caprv1.StepDelete:
		res, err = r.stepDelete(ctx, s, rec)
	default:
		res, err = r.stepEscalate(ctx, s, rec)
	}
	if err != nil {
		s.mr.Status.LastError = err.Error()
		return ctrl.Result{}, err
	}
	if res.Recovered {
		// Healthy again, nothing deleted: the Machine is let go of, its fence (if any) and hook included.
		if done, res, err := r.unfenceKept(ctx, s, fmt.Sprintf("Machine %s recovered; ", s.mr.Name)); !done || err != nil {
			return res, err
		}
		if _, _, err := fencing.RemoveHook(ctx, r.Client, r.APIReader, client.ObjectKeyFromObject(s.machine)); err != nil {
			return ctrl.Result{}, err
		}
		rec.Outcome, rec.FinishTime, rec.Message = caprv1.StepOutcomeSucceeded, ptr.To(metav1.Now()), res.Message
		return r.succeed(ctx, s, res.Message)
	}
	return r.recordStep(s, step, rec, res), nil
}

// recordStep writes a step attempt's outcome into the status (persisted by the deferred patch).
func (r *Reconciler) recordStep(s *scope, step caprv1.StepName, rec *caprv1.RemediationStep, res remediation.StepResult) ctrl.Result {
	mr := s.mr
	rec.Message = res.Message
	mr.Status.LastError = ""
	switch {
	case res.Done:
		rec.Outcome, rec.FinishTime = caprv1.StepOutcomeSucceeded, ptr.To(metav1.Now())
		switch {
		case res.Skipped:
			rec.Outcome = caprv1.StepOutcomeSkipped
		case res.Failed:
			rec.Outcome = caprv1.StepOutcomeFailed
		}
		metrics.StepFinished(metrics.KindWorker, string(step), string(rec.Outcome), rec.FinishTime.Sub(rec.StartTime.Time))
		return ctrl.Result{RequeueAfter: time.Millisecond}
	case res.WaitReason != "":
		eventReason := remediation.EventRemediationWaiting
		if res.WaitReason == caprv1.MachineRemediationStepTimedOutReason {
			eventReason = remediation.EventStepTimedOut
		}
		r.setWaitingWithEvent(mr, eventReason, res.WaitReason, fmt.Sprintf("step %s: %s", step, res.Message))
	default:
		conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineRemediationStepInProgressReason, Message: fmt.Sprintf("step %s: %s", step, res.Message)})
	}
	return ctrl.Result{RequeueAfter: res.Requeue}
}

// fencingRequest is what the Fencer is asked for this remediation. A Machine that is gone is named
// from the request (same name and namespace): an External fence is found by the Machine's name.
func fencingRequest(ctx context.Context, s *scope, started time.Time) fencing.Request {
	m := s.machine
	if s.machineGone {
		m = &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: s.mr.Namespace, Name: s.mr.Name}}
	}
	return fencing.Request{Cluster: s.cluster, Machine: m, Node: s.victimNode(ctx), Spec: fencing.SpecOf(s.mr), Started: started}
}

// victimNode is the Node to fence: the one recorded in status.worker.nodeName, else the Machine's
// nodeRef as it is now, recorded (persisted with the reconcile's other changes, before any backend
// acts: fencing.FenceRecorded). A Node can register after the request was recorded (a node-startup
// timeout, an escalation reboot): the control-plane remediator reads it the same way
// (controlplane's scope.victimNode). CAPI sets a nodeRef once and never changes it (cluster-api
// core/reconcilers/machine, machine_controller_noderef.go reconcileNode), so a recorded name stays right.
func (s *scope) victimNode(ctx context.Context) string {
	w := s.mr.Status.Worker
	if w == nil {
		return ""
	}
	if w.NodeName == "" && !s.machineGone && s.machine.Status.NodeRef.IsDefined() {
		w.NodeName = s.machine.Status.NodeRef.Name
		ctrl.LoggerFrom(ctx).Info("Machine has a Node now, recorded as the fencing target", "Node", klog.KRef("", w.NodeName))
	}
	return w.NodeName
}

// persistFunc writes the request now (fencing.FenceRecorded: the fence is recorded before it is made).
func (r *Reconciler) persistFunc(s *scope) func(context.Context) error {
	return func(ctx context.Context) error { return r.persist(ctx, s) }
}

// unfenceKept undoes the fence of a Machine that is kept (an abort, a recovery). While that takes,
// the fence-before-delete hook is kept on it, so that a deletion by someone else meanwhile is held
// and fenced again (waitForDeletionByOthers) instead of proceeding half-unfenced.
func (r *Reconciler) unfenceKept(ctx context.Context, s *scope, prefix string) (bool, ctrl.Result, error) {
	if !fencing.Owed(s.mr) {
		return true, ctrl.Result{}, nil
	}
	m, err := fencing.EnsureHook(ctx, r.Client, s.machine, s.mr.Name)
	if err != nil {
		return false, ctrl.Result{}, err
	}
	s.machine = m
	return r.unfence(ctx, s, false, prefix)
}

// unfence undoes the fence recorded in the request (fencing.UnfenceRecorded): after the Machine and
// its Node are gone (afterDelete), or for a Machine kept by an abort. While it is not done the
// request says so and waits; done is true at once when nothing is owed.
func (r *Reconciler) unfence(ctx context.Context, s *scope, afterDelete bool, prefix string) (done bool, res ctrl.Result, err error) {
	req := fencingRequest(ctx, s, time.Time{})
	req.AfterDelete = afterDelete
	done, msg, err := fencing.UnfenceRecorded(ctx, r.Fencer, s.mr, req, time.Now())
	if err != nil || done {
		return done, ctrl.Result{}, err
	}
	r.setWaitingWithEvent(s.mr, remediation.EventRemediationWaiting, caprv1.MachineRemediationWaitingForUnfencingReason, prefix+msg)
	return false, ctrl.Result{RequeueAfter: waitShort}, nil
}

// stepFence asks the Fencer until its outcome is final. Required never finishes unconfirmed: past
// the fencing timeout it reports StepTimedOut and keeps waiting; BestEffort finishes with a Warning.
func (r *Reconciler) stepFence(ctx context.Context, s *scope, rec *caprv1.RemediationStep) (remediation.StepResult, error) {
	res, err := fencing.FenceRecorded(ctx, r.Fencer, s.mr, fencingRequest(ctx, s, rec.StartTime.Time), time.Now(), r.persistFunc(s))
	if err != nil {
		return remediation.StepResult{}, fmt.Errorf("fencing node %q: %w", s.victimNode(ctx), err)
	}
	v := fencing.Judge(res, fencing.SpecOf(s.mr), rec.StartTime.Time, time.Now())
	if v.Done {
		metrics.Fenced(metrics.KindWorker, v.Outcome(), time.Since(rec.StartTime.Time))
		// Fenced (or let go by the policy): the hook must no longer hold a deletion.
		if _, _, err := fencing.RemoveHook(ctx, r.Client, r.APIReader, client.ObjectKeyFromObject(s.machine)); err != nil {
			return remediation.StepResult{}, err
		}
	}
	switch {
	case v.GaveUp:
		r.event(s.mr, corev1.EventTypeWarning, remediation.EventFencingGaveUp, v.Message)
		return remediation.StepResult{Done: true, Message: v.Message}, nil
	case v.Done:
		return remediation.StepResult{Done: true, Skipped: v.Skipped, Message: v.Message}, nil
	case v.TimedOut:
		return remediation.StepResult{WaitReason: caprv1.MachineRemediationStepTimedOutReason, Requeue: v.Requeue, Message: v.Message}, nil
	}
	return remediation.StepResult{WaitReason: caprv1.MachineRemediationWaitingForFencingReason, Message: v.Message, Requeue: v.Requeue}, nil
}

// stepDelete deletes the Machine (its MachineSet replaces it) and waits for it to go. It refuses
// unless the Fence step finished (fence before delete).
func (r *Reconciler) stepDelete(ctx context.Context, s *scope, rec *caprv1.RemediationStep) (remediation.StepResult, error) {
	fence := s.mr.Status.Step(caprv1.StepFence)
	if fence == nil || (fence.Outcome != caprv1.StepOutcomeSucceeded && fence.Outcome != caprv1.StepOutcomeSkipped) {
		return remediation.StepResult{}, fmt.Errorf("refusing to delete Machine %s: the Fence step has not finished", s.mr.Name)
	}
	m := s.machine
	if m.DeletionTimestamp.IsZero() {
		// Fenced (checked above): a hook still there can only be left by a crash between the Fence
		// step's removal and its record, and must not hold the deletion.
		if _, _, err := fencing.RemoveHook(ctx, r.Client, r.APIReader, client.ObjectKeyFromObject(m)); err != nil {
			return remediation.StepResult{}, err
		}
		if err := r.Client.Delete(ctx, m, client.Preconditions{UID: ptr.To(m.UID)}); err != nil && !apierrors.IsNotFound(err) {
			return remediation.StepResult{}, fmt.Errorf("deleting Machine %s: %w", m.Name, err)
		}
		ctrl.LoggerFrom(ctx).Info("Deleted worker Machine", "MachineSet", s.mr.Status.Worker.MachineSet)
		return remediation.StepResult{Message: "Machine deleted; waiting for it to drain and go", Requeue: waitShort}, nil
	}
	timeout := DefaultDeleteTimeout
	if r.DeleteTimeout > 0 {
		timeout = r.DeleteTimeout
	}
	msg := fmt.Sprintf("Machine %s is being deleted (since %s)", m.Name, m.DeletionTimestamp.UTC().Format(time.RFC3339))
	if time.Since(rec.StartTime.Time) > timeout {
		return remediation.StepResult{WaitReason: caprv1.MachineRemediationStepTimedOutReason, Requeue: waitLong,
			Message: fmt.Sprintf("%s and not gone within %s; still waiting (check its drain and finalizers)", msg, timeout)}, nil
	}
	return remediation.StepResult{Message: msg, Requeue: waitShort}, nil
}

// reconcileMachineGone ends a remediation whose Machine is gone: deleted by the Delete step, or by
// someone else before it (then nothing is left to remediate either). A fence made on the way is
// undone first, once the Node is gone too.
func (r *Reconciler) reconcileMachineGone(ctx context.Context, s *scope) (ctrl.Result, error) {
	if done, res, err := r.unfence(ctx, s, true, fmt.Sprintf("Machine %s is gone; ", s.mr.Name)); !done || err != nil {
		return res, err
	}
	if rec := s.mr.Status.Step(caprv1.StepDelete); rec != nil {
		if rec.Outcome == caprv1.StepOutcomeInProgress {
			rec.Outcome, rec.FinishTime = caprv1.StepOutcomeSucceeded, ptr.To(metav1.Now())
			rec.Message = fmt.Sprintf("Machine %s is gone", s.mr.Name)
		}
		return r.succeed(ctx, s, fmt.Sprintf("Machine %s deleted; MachineSet %s replaces it", s.mr.Name, s.mr.Status.Worker.MachineSet))
	}
	if err := r.deleteStartedEscalationObjects(ctx, s.mr); err != nil {
		return ctrl.Result{}, err
	}
	return r.succeed(ctx, s, fmt.Sprintf("Machine %s was deleted outside this remediation: nothing is left to remediate", s.mr.Name))
}

// succeed ends the remediation and lets the request go when it is deleted.
func (r *Reconciler) succeed(ctx context.Context, s *scope, msg string) (ctrl.Result, error) {
	mr := s.mr
	mr.Status.Phase = caprv1.MachineRemediationPhaseSucceeded
	mr.Status.CurrentStep = ""
	mr.Status.CompletionTime = ptr.To(metav1.Now())
	controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer) // nothing is left to finish or undo
	conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse,
		Reason: caprv1.MachineRemediationSucceededReason, Message: msg})
	conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationSucceededCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineRemediationSucceededReason, Message: msg})
	r.event(mr, corev1.EventTypeNormal, remediation.EventRemediationSucceeded, msg)
	metrics.RemediationFinished(metrics.KindWorker, string(caprv1.MachineRemediationPhaseSucceeded))
	ctrl.LoggerFrom(ctx).Info("Worker remediation succeeded", "message", msg)
	return ctrl.Result{}, nil
}

// reconcileDelete aborts: before the Delete step the Machine is kept (and unfenced when the Fencer
// can); after it, the Machine's deletion is already under way and the request goes once it is gone.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	mr := s.mr
	switch {
	case s.machineGone && fencing.Owed(mr):
		// The request goes only once the fence made on the way is undone (the Node gone too).
		if done, res, err := r.unfence(ctx, s, true, fmt.Sprintf("The request was deleted and Machine %s is gone; ", mr.Name)); !done || err != nil {
			return res, err
		}
		controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer)
		return ctrl.Result{}, nil
	case mr.Status.Phase != caprv1.MachineRemediationPhaseRunning || s.machineGone:
		controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer)
		return ctrl.Result{}, nil
	case !s.machine.DeletionTimestamp.IsZero() && !deleteIssued(mr):
		// Someone else is deleting the Machine: it is not kept whatever the request says, so the hook
		// stays until it is fenced (never unfenced now: it is about to go) and the request goes with it.
		return r.waitForDeletionByOthers(ctx, s, "The request was deleted, but ")
	case deleteIssued(mr):
		rec := mr.Status.Step(caprv1.StepDelete)
		res, err := r.stepDelete(ctx, s, rec)
		if err != nil {
			return ctrl.Result{}, err
		}
		msg := "The request was deleted after the Machine's deletion was issued: it goes once the Machine is gone; " + res.Message
		r.setWaitingWithEvent(mr, remediation.EventRemediationAborted, caprv1.MachineRemediationAbortedReason, msg)
		return ctrl.Result{RequeueAfter: waitShort}, nil
	}
	if err := r.deleteStartedEscalationObjects(ctx, mr); err != nil {
		return ctrl.Result{}, err
	}
	if done, res, err := r.unfenceKept(ctx, s, fmt.Sprintf("The request was deleted before Machine %s was deleted: the Machine is kept; ", mr.Name)); !done || err != nil {
		return res, err
	}
	if _, _, err := fencing.RemoveHook(ctx, r.Client, r.APIReader, client.ObjectKeyFromObject(s.machine)); err != nil {
		return ctrl.Result{}, err
	}
	msg := fmt.Sprintf("Remediation aborted (the request was deleted) before Machine %s was deleted: the Machine is kept", mr.Name)
	remediation.SetWaiting(mr, caprv1.MachineRemediationAbortedReason, msg)
	r.event(mr, corev1.EventTypeNormal, remediation.EventRemediationAborted, msg)
	metrics.RemediationFinished(metrics.KindWorker, metrics.ResultAborted)
	ctrl.LoggerFrom(ctx).Info("Worker remediation aborted")
	controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer)
	return ctrl.Result{}, nil
}
