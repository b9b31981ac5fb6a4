package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/escalation"
)

// Escalation of a control-plane Machine (spec.escalation, e.g. a reboot before any membership
// change) runs while the remediation holds the control plane, as its first steps: one control-plane
// action per cluster at a time, reboots included. Each step's object is created only when the
// victim's etcd member may go down for a while without losing quorum (quorum.CanTakeDown). A
// recovery ends the remediation with nothing replaced; otherwise the order is chosen again on the
// etcd state of then (replan) before the first membership step. Undo, abort and yielding to a more
// broken Machine delete the escalation objects (undo).

// escalationRunner runs the escalation chain (remediation/escalation) for this remediator.
func (r *Reconciler) escalationRunner() *escalation.Runner {
	return &escalation.Runner{Client: r.Client, APIReader: r.APIReader, Timeout: r.EscalationTimeout, Event: r.event}
}

// stepEscalate runs one escalation step.
func (r *Reconciler) stepEscalate(ctx context.Context, s *scope, rec *caprv1.RemediationStep) (stepResult, error) {
	res, err := r.escalationRunner().Step(ctx, s.mr, s.machine, s.cluster.Name, rec, r.takeDownGate(s), now())
	return stepResult{StepResult: res}, err
}

// takeDownGate refuses an escalation step's object while the victim's member going down (the
// step's reboot) would lose quorum, or while etcd cannot be read. A control plane that is not
// initialized has no quorum to keep; with external etcd, another Machine must serve the API.
func (r *Reconciler) takeDownGate(s *scope) escalation.Gate {
	return func(ctx context.Context) (string, string, error) {
		if initialized, known := controlPlaneInitialized(s.cluster); known && !initialized {
			return "", "", nil
		}
		if s.externalEtcd() {
			// No member goes down with the victim; the API must stay served while it reboots.
			if len(s.servingOthers()) == 0 {
				return caprv1.MachineRemediationNoServingControlPlaneReason, fmt.Sprintf(
					"the step may take %s down for a while, and no other control-plane Machine serves the API", s.mr.Name), nil
			}
			return "", "", nil
		}
		state, wait := r.etcdOrWait(ctx, s)
		if wait != nil {
			return wait.WaitReason, wait.Message, nil
		}
		victim := etcdutil.Victim{}
		if m := state.ByName(s.victimNode()); m != nil {
			victim = etcdutil.Victim{Healthy: m.Up(), Learner: m.IsLearner}
		}
		if c := state.Counts(); !etcdutil.CanTakeDown(c, victim) {
			return caprv1.MachineRemediationNotQuorumSafeReason, fmt.Sprintf(
				"the step may take the etcd member of %s down for a while, which is not quorum-safe now (%d/%d voting members healthy, %d unreachable; the healthy members other than the victim must make %d on their own, as unreachable members may be carrying the quorum)",
				s.victimNode(), c.Healthy, c.Voting, c.Unreachable, etcdutil.Quorum(c.Voting)), nil
		}
		return "", "", nil
	}
}

// mustReplan is true when step, about to be started, is the first step of the order after an
// escalation chain: nothing but escalation steps has been recorded.
func mustReplan(mr *caprv1.MachineRemediation, step caprv1.StepName) bool {
	if len(mr.Spec.Escalation) == 0 || escalation.Index(mr, step) >= 0 {
		return false
	}
	for _, rec := range mr.Status.Steps {
		if escalation.Index(mr, rec.Name) < 0 {
			return false
		}
	}
	return true
}

// replan chooses the order again after the escalation (planStart, as the holder of the control
// plane) and records it; it returns why the remediation must wait instead, or what it chose.
func (r *Reconciler) replan(ctx context.Context, s *scope) (*waiting, string, error) {
	plan, w, err := r.planStart(ctx, s, true)
	if err != nil || w != nil {
		return w, "", err
	}
	before := s.mr.Status.ControlPlane
	plan.desired = ptr.Deref(before.DesiredReplicas, plan.desired)
	plan.retryCount = before.RetryCount
	s.mr.Status.ControlPlane = controlPlaneRecord(s, plan)
	msg := fmt.Sprintf("The escalation did not help; order chosen again on the etcd state of now: %s (%s)", plan.decision.Order, plan.decision.Reason)
	if before.Order != plan.decision.Order {
		msg += fmt.Sprintf(", was %s", before.Order)
	}
	ctrl.LoggerFrom(ctx).Info("Control-plane order chosen again after the escalation", "order", plan.decision.Order, "was", before.Order)
	return nil, msg, nil
}

// waitAfterEscalation waits while no order can be taken after the escalation; past the step timeout
// (counted from the last escalation step's end) it fails, undone: nothing irreversible was done.
func (r *Reconciler) waitAfterEscalation(ctx context.Context, s *scope, w *waiting) (ctrl.Result, error) {
	var last time.Time
	for _, step := range escalation.Steps(s.mr) {
		if rec := findStep(s.mr, step); rec != nil && rec.FinishTime != nil && rec.FinishTime.After(last) {
			last = rec.FinishTime.Time
		}
	}
	limit := stepTimeout(s.mr, caprv1.StepRemoveMember)
	if !last.IsZero() && now().After(last.Add(limit)) {
		return r.fail(ctx, s, caprv1.MachineRemediationStepTimedOutReason, fmt.Sprintf(
			"the escalation did not help and no order could be taken within %s after it (last: %s)", limit, w.message))
	}
	w.message = "the escalation did not help; choosing the order again: " + w.message
	return r.wait(s, w), nil
}

// recovered ends a remediation whose Machine is healthy again during its escalation: nothing was
// replaced, so the hook and the control plane are let go of and the request is owned by its Machine
// again (it goes with the Machine, and the health checker replaces it should the Machine fail again).
func (r *Reconciler) recovered(ctx context.Context, s *scope, rec *caprv1.RemediationStep, msg string) (ctrl.Result, error) {
	if done, res, err := r.unfenceEnded(ctx, s, "Machine recovered; its fence is undone first: "); !done || err != nil {
		return res, err
	}
	if err := r.removeFenceHook(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.releaseLock(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	mr := s.mr
	rec.Outcome, rec.FinishTime, rec.Message = caprv1.StepOutcomeSucceeded, ptr.To(metav1.Now()), msg
	mr.Status.Phase = caprv1.MachineRemediationPhaseSucceeded
	mr.Status.CurrentStep = ""
	mr.Status.LastError = ""
	mr.Status.CompletionTime = ptr.To(metav1.Now())
	mr.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: s.machine.Name, UID: s.machine.UID,
	}}
	conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse, Reason: caprv1.MachineRemediationSucceededReason, Message: msg})
	conditions.Set(mr, metav1.Condition{Type: caprv1.MachineRemediationSucceededCondition, Status: metav1.ConditionTrue, Reason: caprv1.MachineRemediationSucceededReason, Message: msg})
	metrics.StepFinished(metrics.KindControlPlane, string(rec.Name), string(rec.Outcome), rec.FinishTime.Sub(rec.StartTime.Time))
	r.observe(s, rec.Name, true)
	r.event(mr, corev1.EventTypeNormal, remediation.EventRemediationSucceeded, msg)
	metrics.RemediationFinished(metrics.KindControlPlane, string(caprv1.MachineRemediationPhaseSucceeded))
	ctrl.LoggerFrom(ctx).Info("Control-plane Machine recovered during the escalation; nothing replaced", "step", rec.Name)
	return ctrl.Result{}, nil
}
