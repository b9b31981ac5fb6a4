package scenarios_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/builder"
	"github.com/capr-io/capr/test/sandbox"
)

// TestHandWrittenControlPlaneRequestGetsTheHealthCheckFencing is the control-plane twin of the worker
// remediator's TestHandWrittenRequestGetsTheHealthCheckFencing: a request
// written by hand with fencing Disabled, for a control-plane Machine that a CAPR health check with
// Required fencing covers, is fenced as the health check says. It starts with
// status.appliedFencing Required raised by that health check (the start's condition and a
// FencingRaised event say so), goes through its surge and the victim's member removal, then waits at
// Fence while the fence is not confirmed: the victim is not deleted until it is, and then the
// remediation completes. Without the raise its Fence step is skipped and the victim deleted at once.
func TestHandWrittenControlPlaneRequestGetsTheHealthCheckFencing(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withHealthCheck(func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.Fencing = sandbox.ExternalFencing("gate")
		// The health check itself never requests a remediation here: only the hand-written request does.
		mhc.Spec.Remediation.TriggerIf = &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromInt32(0))}
	}))
	check := writeData(t, wc)
	gate, deletions := startCAPRBehindGate(t, wc)
	victim := controlPlane(g, wc)[1]
	// The manager has the health check in its cache once its health checker reported on it.
	g.Eventually(func(g Gomega) *int32 {
		mhc := &caprv1.MachineHealthCheck{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: "cp"}, mhc)).To(Succeed())
		return mhc.Status.ExpectedMachines
	}, remediationTimeout, 200*time.Millisecond).Should(HaveValue(BeEquivalentTo(3)))

	g.Expect(sb.Client.Create(ctx, builder.MachineRemediation(wc.Namespace, wc.Name, victim.Name).
		Source(caprv1.MachineRemediationSourceManual).Fencing(&caprv1.FencingSpec{Policy: caprv1.FencingDisabled}).Build())).To(Succeed())

	const raised = "fencing Required with backends [External] applies, from MachineHealthCheck(s) cp covering the Machine (the request's spec.fencing says Disabled)"
	waitingAtFence := func(g Gomega) {
		m := &clusterv1.Machine{}
		err := sb.Client.Get(ctx, client.ObjectKeyFromObject(&victim), m)
		g.Expect(apierrors.IsNotFound(err)).To(BeFalse(), "the victim was deleted before its fence was confirmed")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(m.DeletionTimestamp.IsZero()).To(BeTrue(), "the victim is being deleted before its fence was confirmed")
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.AppliedFencing).NotTo(BeNil())
		g.Expect(mr.Status.AppliedFencing.Policy).To(Equal(caprv1.FencingRequired))
		g.Expect(mr.Status.AppliedFencing.RaisedBy).To(Equal([]string{"cp"}))
		g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.StepFence))
		g.Expect(conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition)).To(Equal(caprv1.MachineRemediationWaitingForFencingReason))
		g.Expect(conditions.GetMessage(mr, caprv1.MachineRemediationProgressingCondition)).To(ContainSubstring(raised))
	}
	g.Eventually(waitingAtFence, remediationTimeout, 200*time.Millisecond).Should(Succeed())
	g.Expect(eventCount(g, wc.Namespace, victim.Name, caprv1.EventFencingRaised)).To(Equal(1))
	g.Consistently(waitingAtFence, 5*time.Second, 250*time.Millisecond).Should(Succeed())

	gate.Open()
	mr := waitRemediated(t, wc, victim.Name, 3)
	g.Expect(mr.Status.Step(caprv1.StepFence).Outcome).To(Equal(caprv1.StepOutcomeSucceeded))
	g.Expect(mr.Spec.Fencing.Policy).To(Equal(caprv1.FencingDisabled), "the request's own spec is left as written")
	// From the API server, against the backend's confirmation (ms): the deletion took effect only
	// once the victim was fenced.
	g.Expect(deletions.SeenAfter(victim.Name, sandbox.MachineReleased, gate.FencedAtFor(victim.Name))).To(Succeed())
	check()
}
