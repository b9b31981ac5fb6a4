package remediation

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

func TestSeenVersionsCurrent(t *testing.T) {
	request := func(rv string, status caprv1.MachineRemediationStatus) *caprv1.MachineRemediation {
		return &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", ResourceVersion: rv}, Status: status}
	}
	recorded := caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhasePending}
	tests := []struct {
		name   string
		seen   *caprv1.MachineRemediation // nil: nothing seen
		forget bool
		cached *caprv1.MachineRemediation
		want   bool
	}{
		{name: "nothing seen, nothing recorded: a new request", cached: request("5", caprv1.MachineRemediationStatus{}), want: true},
		{name: "nothing seen, a record (restart, leader change)", cached: request("5", recorded), want: false},
		{name: "nothing seen, only observedGeneration recorded", cached: request("5", caprv1.MachineRemediationStatus{ObservedGeneration: 1}), want: false},
		{name: "the version seen last", seen: request("7", recorded), cached: request("7", recorded), want: true},
		{name: "older than the version seen last", seen: request("7", recorded), cached: request("5", recorded), want: false},
		{name: "older than the version seen last, its status still empty", seen: request("7", recorded), cached: request("5", caprv1.MachineRemediationStatus{}), want: false},
		{name: "written since by someone else", seen: request("7", recorded), cached: request("9", recorded), want: false},
		{name: "forgotten, then a new request of the same name", seen: request("7", recorded), forget: true, cached: request("12", caprv1.MachineRemediationStatus{}), want: true},
		{name: "forgotten, then a request with a record", seen: request("7", recorded), forget: true, cached: request("7", recorded), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			var s SeenVersions
			if tt.seen != nil {
				s.Saw(tt.seen)
			}
			if tt.forget {
				s.Forget(types.NamespacedName{Namespace: "ns", Name: "m"})
			}
			g.Expect(s.Current(tt.cached)).To(Equal(tt.want))
		})
	}
}

func TestSeenVersionsKeepsRequestsApart(t *testing.T) {
	g := NewWithT(t)
	var s SeenVersions
	s.Saw(&caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "7"}})
	other := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", ResourceVersion: "7"},
		Status: caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhaseRunning}}
	g.Expect(s.Current(other)).To(BeFalse())
	sameNameElsewhere := other.DeepCopy()
	sameNameElsewhere.Namespace, sameNameElsewhere.Name = "other", "a"
	g.Expect(s.Current(sameNameElsewhere)).To(BeFalse())
}
