package worker

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/controlplane"
)

// TestExactlyOneRemediatorOwnsARequest checks the discriminator from both sides: for every request
// state, at most one of the two remediators acts, and a recorded role decides after the Machine is gone.
func TestExactlyOneRemediatorOwnsARequest(t *testing.T) {
	worker := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Labels: map[string]string{}}}
	cp := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Labels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}}}
	workerStatus := caprv1.MachineRemediationStatus{Worker: &caprv1.WorkerRemediationStatus{MachineSet: "ms"}}
	cpStatus := caprv1.MachineRemediationStatus{ControlPlane: &caprv1.ControlPlaneRemediationStatus{ClusterName: "c"}}
	tests := []struct {
		name        string
		status      caprv1.MachineRemediationStatus
		machine     *clusterv1.Machine
		machineGone bool
		wantWorker  bool
		wantCP      bool
	}{
		{name: "new request, worker Machine", machine: worker, wantWorker: true},
		{name: "new request, control-plane Machine", machine: cp, wantCP: true},
		{name: "new request, Machine gone: nothing was done, the control-plane remediator cleans up", machineGone: true, wantCP: true},
		{name: "worker role recorded, Machine gone", status: workerStatus, machineGone: true, wantWorker: true},
		{name: "worker role recorded, Machine exists", status: workerStatus, machine: worker, wantWorker: true},
		{name: "control-plane role recorded, Machine gone", status: cpStatus, machineGone: true, wantCP: true},
		{name: "control-plane role recorded, Machine exists", status: cpStatus, machine: cp, wantCP: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mr := &caprv1.MachineRemediation{Status: tt.status}
			m := tt.machine
			if m == nil {
				m = &clusterv1.Machine{}
			}
			gotWorker := ownedByWorker(mr, m, tt.machineGone)
			gotCP := !controlplane.IsWorkerRequest(mr, m, tt.machineGone)
			if gotWorker != tt.wantWorker || gotCP != tt.wantCP {
				t.Fatalf("worker acts: %v (want %v), control plane acts: %v (want %v)", gotWorker, tt.wantWorker, gotCP, tt.wantCP)
			}
		})
	}
}
