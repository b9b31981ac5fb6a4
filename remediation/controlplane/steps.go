package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/escalation"
)

// stepResult is what one attempt at a step found (remediation.StepResult), and whether the step
// waits for a membership change that is not quorum-safe now.
type stepResult struct {
	remediation.StepResult
	// notQuorumSafe: the step waits because its membership change (adding the replacement's member,
	// moving leadership, removing the victim's member) is not quorum-safe now. If nothing
	// irreversible was done and no member joined since the start, after notQuorumSafeUndoAfter of such waiting
	// the remediation is undone and goes back to Pending (mayUndoNotQuorumSafe and undoNotQuorumSafe in running.go)
	// instead of holding the control plane until its step timeout.
	notQuorumSafe bool
}

// currentStep is the first step of the plan that is not finished (StepFinished).
func currentStep(mr *caprv1.MachineRemediation) caprv1.StepName {
	if mr.Status.ControlPlane == nil {
		return ""
	}
	for _, step := range PlanSteps(mr) {
		if !StepFinished(findStep(mr, step)) {
			return step
		}
	}
	return ""
}

func findStep(mr *caprv1.MachineRemediation, name caprv1.StepName) *caprv1.RemediationStep {
	for i := range mr.Status.Steps {
		if mr.Status.Steps[i].Name == name {
			return &mr.Status.Steps[i]
		}
	}
	return nil
}

// runSteps works on the current step: it records the step as started (persisted before anything is
// issued), observes whether its effect is visible, and otherwise issues it again (every step is
// idempotent). One step transition per reconcile keeps every transition observable from the API.
func (r *Reconciler) runSteps(ctx context.Context, s *scope) (ctrl.Result, error) {
	step := currentStep(s.mr)
	if step == "" {
		return r.succeed(ctx, s)
	}
	rec := findStep(s.mr, step)
	replanned := ""
	if rec == nil && mustReplan(s.mr, step) {
		// The escalation did not help, and it took time: the order chosen at the start was chosen
		// on an etcd state that may be gone. Choose again before the first membership step.
		w, msg, err := r.replan(ctx, s)
		if err != nil {
			return ctrl.Result{}, err
		}
		if w != nil {
			return r.waitAfterEscalation(ctx, s, w)
		}
		replanned = msg
		step = currentStep(s.mr)
		rec = findStep(s.mr, step)
	}
	if rec == nil {
		s.mr.Status.Steps = append(s.mr.Status.Steps, caprv1.RemediationStep{
			Name: step, StartTime: ptr.To(metav1.Now()), Outcome: caprv1.StepOutcomeInProgress,
		})
		s.mr.Status.CurrentStep = step
		conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineRemediationStepInProgressReason, Message: "step " + string(step)})
		if err := r.persist(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		if replanned != "" {
			r.event(s.mr, corev1.EventTypeNormal, EventOrderReplanned, replanned)
		}
		r.event(s.mr, corev1.EventTypeNormal, EventStepStarted, "Step "+string(step)+" started")
		r.observe(s, step, false)
		rec = findStep(s.mr, step)
	}

	res, err := r.runStepOfPass(ctx, s, step, rec)
	rec = findStep(s.mr, step)
	if err != nil {
		// Recorded in the status (lastError, the step's message), written when the reconcile
		// returns (Reconcile's deferred persist), and returned: controller-runtime counts it and
		// retries the step (every step is idempotent) with its backoff (controllers.controllerOptions).
		s.mr.Status.LastError = err.Error()
		rec.Message = err.Error()
		return ctrl.Result{}, fmt.Errorf("step %s: %w", step, err)
	}
	rec.Message = res.Message
	if res.Recovered {
		return r.recovered(ctx, s, rec, res.Message)
	}
	if !res.Done {
		if res.notQuorumSafe && r.mayUndoNotQuorumSafe(ctx, s, res.WaitReason) {
			return r.undoNotQuorumSafe(ctx, s, step, res.Message)
		}
		if res.WaitReason != "" {
			msg := fmt.Sprintf("step %s: %s", step, res.Message)
			if !isWaitingFor(s.mr, res.WaitReason) {
				// Said once, when the wait starts (the condition carries the latest word).
				eventType, reason := corev1.EventTypeNormal, remediation.EventRemediationWaiting
				if res.WaitReason == caprv1.MachineRemediationStepTimedOutReason {
					eventType, reason = corev1.EventTypeWarning, remediation.EventStepTimedOut
				}
				r.event(s.mr, eventType, reason, msg)
			}
			remediation.SetWaiting(s.mr, res.WaitReason, msg)
		} else {
			conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionTrue,
				Reason: caprv1.MachineRemediationStepInProgressReason, Message: fmt.Sprintf("step %s: %s", step, res.Message)})
		}
		return ctrl.Result{RequeueAfter: max(res.Requeue, 100*time.Millisecond)}, nil
	}
	rec.FinishTime = ptr.To(metav1.Now())
	rec.Outcome = caprv1.StepOutcomeSucceeded
	switch {
	case res.Skipped:
		rec.Outcome = caprv1.StepOutcomeSkipped
	case res.Failed:
		rec.Outcome = caprv1.StepOutcomeFailed
	}
	s.mr.Status.LastError = ""
	metrics.StepFinished(metrics.KindControlPlane, string(step), string(rec.Outcome), rec.FinishTime.Sub(rec.StartTime.Time))
	r.observe(s, step, true)
	r.event(s.mr, corev1.EventTypeNormal, EventStepFinished, fmt.Sprintf("Step %s %s: %s", step, rec.Outcome, res.Message))
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation step finished", "step", step, "outcome", rec.Outcome, "message", res.Message)
	if res.Skipped {
		// Nothing was issued: the next step starts in this reconcile (its start recorded, and this
		// step's outcome with it, before it issues anything), on the etcd state this one read. A new
		// reconcile would read etcd again, which with a dead member costs its dial timeout each time
		// (MoveLeader is skipped for a dead victim, right before RemoveMember).
		return r.runSteps(ctx, s)
	}
	return ctrl.Result{RequeueAfter: time.Millisecond}, nil
}

func (r *Reconciler) observe(s *scope, step caprv1.StepName, done bool) {
	if r.StepObserver != nil {
		r.StepObserver(StepEvent{Remediation: types.NamespacedName{Namespace: s.mr.Namespace, Name: s.mr.Name}, Step: step, Done: done, Time: time.Now()})
	}
}

// runStepOfPass runs one step (runStep) and then what follows any step of a pass: the dead members of
// waiting requests go as soon as the victim's is gone (removeWaitingDownMembers).
func (r *Reconciler) runStepOfPass(ctx context.Context, s *scope, step caprv1.StepName, rec *caprv1.RemediationStep) (stepResult, error) {
	res, err := r.runStep(ctx, s, step, rec)
	if err != nil {
		return res, err
	}
	also, err := r.removeWaitingDownMembers(ctx, s)
	if also != "" {
		res.Message += "; " + also
	}
	return res, err
}

func (r *Reconciler) runStep(ctx context.Context, s *scope, step caprv1.StepName, rec *caprv1.RemediationStep) (stepResult, error) {
	switch step {
	case caprv1.StepScaleUp:
		return r.stepScaleUp(ctx, s)
	case caprv1.StepWaitForReplacement:
		return r.stepWaitForReplacement(ctx, s)
	case caprv1.StepMoveLeader, caprv1.StepRemoveMember:
		if s.externalEtcd() {
			// Only a record written before the placement was recorded can list these steps.
			return stepResult{StepResult: remediation.StepResult{Done: true, Skipped: true, Message: "etcd is external: the victim has no etcd member"}}, nil
		}
		if step == caprv1.StepMoveLeader {
			return r.stepMoveLeader(ctx, s, rec)
		}
		return r.stepRemoveMember(ctx, s)
	case caprv1.StepFence:
		return r.stepFence(ctx, s, rec)
	case caprv1.StepDelete:
		return r.stepDelete(ctx, s)
	}
	if escalation.Index(s.mr, step) >= 0 {
		return r.stepEscalate(ctx, s, rec)
	}
	return stepResult{}, fmt.Errorf("unknown step %q", step)
}

// etcdOrWait returns the etcd state, or the wait result that says etcd cannot be read (a step never
// guesses without it).
func (r *Reconciler) etcdOrWait(ctx context.Context, s *scope) (*etcdutil.State, *stepResult) {
	state, err := r.inspectEtcd(ctx, s)
	if err != nil {
		return nil, &stepResult{StepResult: remediation.StepResult{WaitReason: caprv1.MachineRemediationEtcdUnreachableReason, Message: "cannot read etcd state: " + err.Error(), Requeue: waitShort}}
	}
	return state, nil
}
