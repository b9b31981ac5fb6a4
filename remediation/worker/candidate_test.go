package worker

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestCandidateExplicitOnlyByTheMachineAnnotation: a request goes first in the maxInFlight queue only
// when its Machine carries cluster.x-k8s.io/remediate-machine; spec.source Manual, which anyone who
// may write a request can set, does not jump the queue.
func TestCandidateExplicitOnlyByTheMachineAnnotation(t *testing.T) {
	annotated := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Annotations: map[string]string{clusterv1.RemediateMachineAnnotation: ""}}}
	plain := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}}
	for _, tc := range []struct {
		name    string
		source  caprv1.RemediationSource
		machine *clusterv1.Machine
		want    bool
	}{
		{"manual request, plain Machine", caprv1.MachineRemediationSourceManual, plain, false},
		{"manual request, Machine not found", caprv1.MachineRemediationSourceManual, nil, false},
		{"health check request, annotated Machine", caprv1.MachineRemediationSourceHealthCheck, annotated, true},
		{"manual request, annotated Machine", caprv1.MachineRemediationSourceManual, annotated, true},
		{"CAPI request, plain Machine", "", plain, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: caprv1.MachineRemediationSpec{Source: tc.source}}
			if got := candidate(mr, tc.machine).Requested; got != tc.want {
				t.Errorf("Requested = %v, want %v", got, tc.want)
			}
		})
	}
}
