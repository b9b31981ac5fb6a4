package machinehealthcheck

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestFinishedWithMachineKept: only a request that ended by recovery (nothing deleted) is replaced
// when its Machine is unhealthy again; the record of a remediation that deleted its Machine is kept
// even while a cache still shows that Machine (the fault suite saw control-plane records vanish).
func TestFinishedWithMachineKept(t *testing.T) {
	succeeded := func(mutate func(*caprv1.MachineRemediation)) *caprv1.MachineRemediation {
		mr := &caprv1.MachineRemediation{Status: caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhaseSucceeded}}
		mutate(mr)
		return mr
	}
	oneStep := []caprv1.EscalationStep{{TemplateRef: caprv1.TemplateReference{Kind: "RebootTemplate"}, TimeoutSeconds: 60}}
	machine := &clusterv1.Machine{}
	deleting := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: time.Now()}}}
	tests := []struct {
		name string
		mr   *caprv1.MachineRemediation
		m    *clusterv1.Machine
		want bool
	}{
		{"worker, recovered during escalation", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.Worker = &caprv1.WorkerRemediationStatus{}
			mr.Spec.Escalation = oneStep
			mr.Status.Steps = []caprv1.RemediationStep{{Name: caprv1.EscalationStepName(0), Outcome: caprv1.StepOutcomeSucceeded}}
		}), machine, true},
		{"control plane, recovered during escalation", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.ControlPlane = &caprv1.ControlPlaneRemediationStatus{}
			mr.Spec.Escalation = []caprv1.EscalationStep{oneStep[0], oneStep[0]}
			mr.Status.Steps = []caprv1.RemediationStep{
				{Name: caprv1.EscalationStepName(0), Outcome: caprv1.StepOutcomeFailed},
				{Name: caprv1.EscalationStepName(1), Outcome: caprv1.StepOutcomeSucceeded},
			}
		}), machine, true},
		{"control plane, escalation timed out, replaced (stale cache)", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.ControlPlane = &caprv1.ControlPlaneRemediationStatus{}
			mr.Spec.Escalation = oneStep
			mr.Status.Steps = []caprv1.RemediationStep{
				{Name: caprv1.EscalationStepName(0), Outcome: caprv1.StepOutcomeFailed},
				{Name: caprv1.StepFence, Outcome: caprv1.StepOutcomeSkipped},
				{Name: caprv1.StepDelete, Outcome: caprv1.StepOutcomeSucceeded},
			}
		}), machine, false},
		{"escalation skipped (a manual request), Machine deleted outside", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.Worker = &caprv1.WorkerRemediationStatus{}
			mr.Spec.Escalation = oneStep
			mr.Status.Steps = []caprv1.RemediationStep{{Name: caprv1.EscalationStepName(0), Outcome: caprv1.StepOutcomeSkipped}}
		}), machine, false},
		{"worker, deleted by its Delete step (stale cache)", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.Worker = &caprv1.WorkerRemediationStatus{}
			mr.Status.Steps = []caprv1.RemediationStep{{Name: caprv1.StepDelete}}
		}), machine, false},
		{"control plane, replaced (stale cache)", succeeded(func(mr *caprv1.MachineRemediation) {
			mr.Status.ControlPlane = &caprv1.ControlPlaneRemediationStatus{}
		}), machine, false},
		{"Machine being deleted", succeeded(func(*caprv1.MachineRemediation) {}), deleting, false},
		{"still running", &caprv1.MachineRemediation{Status: caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhaseRunning}}, machine, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(finishedWithMachineKept(tt.mr, tt.m)).To(Equal(tt.want))
		})
	}
}
