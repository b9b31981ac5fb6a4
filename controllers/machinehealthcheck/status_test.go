package machinehealthcheck

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestCountsOnly: only a status that differs in its counts and lists alone may wait; a condition,
// observedGeneration or no change at all is never held back.
func TestCountsOnly(t *testing.T) {
	base := func() *caprv1.MachineHealthCheckStatus {
		return &caprv1.MachineHealthCheckStatus{
			ExpectedMachines: ptr.To[int32](10), CurrentHealthy: ptr.To[int32](10), RemediationsAllowed: ptr.To[int32](10),
			Targets:            []string{"a", "b"},
			ObservedGeneration: 1,
			Conditions: []metav1.Condition{{Type: caprv1.MachineHealthCheckRemediationAllowedCondition, Status: metav1.ConditionTrue,
				Reason: caprv1.MachineHealthCheckRemediationAllowedReason}},
		}
	}
	tests := []struct {
		name   string
		change func(s *caprv1.MachineHealthCheckStatus)
		want   bool
	}{
		{"nothing", func(*caprv1.MachineHealthCheckStatus) {}, false},
		{"currentHealthy", func(s *caprv1.MachineHealthCheckStatus) { s.CurrentHealthy = ptr.To[int32](9) }, true},
		{"expectedMachines and targets", func(s *caprv1.MachineHealthCheckStatus) {
			s.ExpectedMachines = ptr.To[int32](3)
			s.Targets = append(s.Targets, "c")
		}, true},
		{"unhealthyMachines and remediationsAllowed", func(s *caprv1.MachineHealthCheckStatus) {
			s.UnhealthyMachines = []string{"a"}
			s.RemediationsAllowed = ptr.To[int32](9)
		}, true},
		{"controlPlaneUnhealthyLimit", func(s *caprv1.MachineHealthCheckStatus) { s.ControlPlaneUnhealthyLimit = ptr.To[int32](1) }, true},
		{"a condition", func(s *caprv1.MachineHealthCheckStatus) {
			s.CurrentHealthy = ptr.To[int32](0)
			s.Conditions[0].Status, s.Conditions[0].Reason = metav1.ConditionFalse, caprv1.MachineHealthCheckTooManyUnhealthyReason
		}, false},
		{"a condition's message", func(s *caprv1.MachineHealthCheckStatus) { s.Conditions[0].Message = "x" }, false},
		{"observedGeneration", func(s *caprv1.MachineHealthCheckStatus) { s.ObservedGeneration = 2 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, after := base(), base()
			tt.change(after)
			NewWithT(t).Expect(countsOnly(before, after)).To(Equal(tt.want))
		})
	}
}

// TestStatusWritesWait: a change of counts waits for the rest of the interval after the last write
// of the same health check, and not at all for another one or after the interval.
func TestStatusWritesWait(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	s := &statusWrites{}
	g.Expect(s.wait(a, t0)).To(BeZero(), "never written")
	s.wrote(a, t0)
	g.Expect(s.wait(a, t0.Add(300*time.Millisecond))).To(Equal(statusWriteInterval - 300*time.Millisecond))
	g.Expect(s.wait(b, t0.Add(300*time.Millisecond))).To(BeZero(), "another health check")
	g.Expect(s.wait(a, t0.Add(statusWriteInterval))).To(BeZero())
	s.forget(a)
	g.Expect(s.wait(a, t0)).To(BeZero(), "forgotten")
}
