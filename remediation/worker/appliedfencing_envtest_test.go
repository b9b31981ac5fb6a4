//go:build envtest

package worker_test

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	capienv "github.com/capr-io/capr/test/envtest"
)

// TestHandWrittenRequestGetsTheHealthCheckFencing: a request written by hand without fencing, for a
// Machine that a CAPR health check with Required fencing covers, is fenced as the health check says:
// it waits for the fence, says why in its condition, status.appliedFencing and an event,
// and the Machine is deleted only once the fence is confirmed. Without the health check's policy the
// Fence step would be skipped and the Machine deleted at once.
func TestHandWrittenRequestGetsTheHealthCheckFencing(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	f.workerWithNode(g, "w1", corev1.ConditionTrue)
	mhc := capienv.NewHealthCheck(f.ns, f.cluster.Name, "a", 1)
	mhc.Spec.Remediation.Fencing = required()
	// The health check itself never requests a remediation here: only the hand-written request does.
	mhc.Spec.Remediation.TriggerIf = &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromInt32(0))}
	g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())
	// The manager has the health check in its cache once its health checker reported on it.
	g.Eventually(func(g Gomega) *int32 {
		got := &caprv1.MachineHealthCheck{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(mhc), got)).To(Succeed())
		return got.Status.ExpectedMachines
	}, eventually, poll).Should(HaveValue(BeEquivalentTo(1)))

	f.request(g, getMachine(g, f.ns, "w1"), nil, caprv1.MachineRemediationSourceManual)

	waiting := func(g Gomega) {
		reason, msg := progressing(g, f.ns, "w1")
		g.Expect(reason).To(Equal(caprv1.MachineRemediationWaitingForFencingReason))
		g.Expect(msg).To(ContainSubstring("fencing Required with backends [NetworkFence] applies, from MachineHealthCheck(s) hc covering the Machine (the request's spec.fencing says Disabled)"))
		mr := getRemediation(g, f.ns, "w1")
		g.Expect(mr.Status.AppliedFencing).NotTo(BeNil())
		g.Expect(mr.Status.AppliedFencing.Policy).To(Equal(caprv1.FencingRequired))
		g.Expect(mr.Status.AppliedFencing.RaisedBy).To(Equal([]string{"hc"}))
		g.Expect(mr.Status.Step(caprv1.StepDelete)).To(BeNil())
		g.Expect(machineExists(g, f.ns, "w1")).To(BeTrue())
	}
	g.Eventually(waiting, eventually, poll).Should(Succeed())
	g.Expect(backend.wasAsked(f.node("w1"))).To(BeTrue())
	g.Eventually(func(g Gomega) []string { return eventReasons(g, f.ns, "w1") }, eventually, poll).
		Should(ContainElement(caprv1.EventFencingRaised))
	g.Consistently(waiting, quiet, poll).Should(Succeed())

	backend.confirm(f.node("w1"))
	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, "w1") }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(machineExists(g, f.ns, "w1")).To(BeFalse())
	mr := getRemediation(g, f.ns, "w1")
	g.Expect(mr.Status.Step(caprv1.StepFence).Outcome).To(Equal(caprv1.StepOutcomeSucceeded))
	g.Expect(mr.Spec.Fencing).To(BeNil(), "the request's own spec is left as written")
}
