package controlplane

import (
	"testing"

	. "github.com/onsi/gomega"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// escalating is a running ScaleUpFirst remediation with a two-step escalation chain and the given
// step records.
func escalating(steps ...caprv1.RemediationStep) *caprv1.MachineRemediation {
	ref := caprv1.TemplateReference{APIVersion: "example.com/v1", Kind: "RebootTemplate", Name: "r"}
	return &caprv1.MachineRemediation{
		Spec: caprv1.MachineRemediationSpec{Escalation: []caprv1.EscalationStep{{TemplateRef: ref, TimeoutSeconds: 60}, {TemplateRef: ref, TimeoutSeconds: 60}}},
		Status: caprv1.MachineRemediationStatus{
			ControlPlane: &caprv1.ControlPlaneRemediationStatus{Order: caprv1.ControlPlaneOrderScaleUpFirst},
			Steps:        steps,
		},
	}
}

func step(name caprv1.StepName, outcome caprv1.StepOutcome) caprv1.RemediationStep {
	return caprv1.RemediationStep{Name: name, Outcome: outcome}
}

// TestPlanStepsEscalationFirst: the escalation runs before any step of the order.
func TestPlanStepsEscalationFirst(t *testing.T) {
	NewWithT(t).Expect(PlanSteps(escalating())).To(Equal([]caprv1.StepName{
		"Escalate1", "Escalate2", caprv1.StepScaleUp, caprv1.StepWaitForReplacement, caprv1.StepMoveLeader,
		caprv1.StepRemoveMember, caprv1.StepFence, caprv1.StepDelete,
	}))
}

// TestCurrentStepWithEscalation: an escalation step that timed out (Failed) is finished and the next
// one follows; one in progress is current; after the chain the order's first step is.
func TestCurrentStepWithEscalation(t *testing.T) {
	e1, e2 := caprv1.EscalationStepName(0), caprv1.EscalationStepName(1)
	tests := []struct {
		name string
		mr   *caprv1.MachineRemediation
		want caprv1.StepName
	}{
		{"nothing started", escalating(), e1},
		{"first in progress", escalating(step(e1, caprv1.StepOutcomeInProgress)), e1},
		{"first timed out", escalating(step(e1, caprv1.StepOutcomeFailed)), e2},
		{"chain skipped", escalating(step(e1, caprv1.StepOutcomeSkipped), step(e2, caprv1.StepOutcomeSkipped)), caprv1.StepScaleUp},
		{"both timed out", escalating(step(e1, caprv1.StepOutcomeFailed), step(e2, caprv1.StepOutcomeFailed)), caprv1.StepScaleUp},
		{"order under way", escalating(step(e1, caprv1.StepOutcomeFailed), step(e2, caprv1.StepOutcomeFailed),
			step(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded)), caprv1.StepWaitForReplacement},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(currentStep(tt.mr)).To(Equal(tt.want))
		})
	}
}

// TestMustReplan: the order is chosen again exactly once, before the first step of the order after
// an escalation chain, never for a remediation without one and never once the order has begun.
func TestMustReplan(t *testing.T) {
	e1, e2 := caprv1.EscalationStepName(0), caprv1.EscalationStepName(1)
	failed1, failed2 := step(e1, caprv1.StepOutcomeFailed), step(e2, caprv1.StepOutcomeFailed)
	g := NewWithT(t)
	g.Expect(mustReplan(escalating(failed1, failed2), caprv1.StepScaleUp)).To(BeTrue())
	g.Expect(mustReplan(escalating(failed1), e2)).To(BeFalse(), "an escalation step is not the order's")
	g.Expect(mustReplan(escalating(failed1, failed2, step(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded)), caprv1.StepWaitForReplacement)).
		To(BeFalse(), "the order has begun")
	none := escalating()
	none.Spec.Escalation = nil
	g.Expect(mustReplan(none, caprv1.StepScaleUp)).To(BeFalse(), "no escalation: the order chosen at the start stands")
}
