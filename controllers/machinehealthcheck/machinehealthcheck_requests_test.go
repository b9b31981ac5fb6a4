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
		}), machine, true},
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
