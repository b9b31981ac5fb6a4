package controlplane

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestCandidateExplicitOnlyByTheMachineAnnotation: a control-plane request is explicit (goes first
// among equally broken members) only when its Machine carries cluster.x-k8s.io/remediate-machine;
// spec.source Manual, which anyone who may write a request can set, is not.
func TestCandidateExplicitOnlyByTheMachineAnnotation(t *testing.T) {
	for _, tc := range []struct {
		name      string
		source    caprv1.RemediationSource
		annotated bool
		want      bool
	}{
		{"manual request, plain Machine", caprv1.MachineRemediationSourceManual, false, false},
		{"health check request, annotated Machine", caprv1.MachineRemediationSourceHealthCheck, true, true},
		{"manual request, annotated Machine", caprv1.MachineRemediationSourceManual, true, true},
		{"CAPI request, plain Machine", "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}}
			if tc.annotated {
				m.Annotations = map[string]string{clusterv1.RemediateMachineAnnotation: ""}
			}
			mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: caprv1.MachineRemediationSpec{Source: tc.source}}
			if got := candidate(mr, m, nil).Requested; got != tc.want {
				t.Errorf("Requested = %v, want %v", got, tc.want)
			}
		})
	}
	// Among equally broken members, the Manual request created first still goes first: age, not source.
	older := Candidate{Name: "older", Member: VictimUnhealthy}
	manual := candidate(&caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Name: "manual", CreationTimestamp: metav1.Now()},
		Spec: caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceManual}}, &clusterv1.Machine{}, nil)
	if got := FirstCandidate([]Candidate{manual, older}); got != "older" {
		t.Errorf("FirstCandidate = %q, want the older request", got)
	}
}
