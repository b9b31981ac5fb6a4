package controlplane

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

func requiredNetworkFence() *caprv1.FencingSpec {
	return &caprv1.FencingSpec{Policy: caprv1.FencingRequired, Backends: []caprv1.FencingBackend{
		{Type: caprv1.FencingBackendNetworkFence, NetworkFenceClassNames: []string{"c"}}}}
}

// fencedWorld is a Replace-order remediation (Fence, then Delete) of m-b whose Fence step ran: the
// fence is recorded and owed.
func fencedWorld(t *testing.T, g Gomega) *world {
	w := newWorld(t, withOrder(caprv1.ControlPlaneOrderReplace),
		withFence(fencing.Result{Outcome: fencing.Fenced, Message: "fenced", Backends: []fencing.BackendResult{
			{Type: caprv1.FencingBackendNetworkFence, State: caprv1.FencingBackendFenced, Message: "NetworkFence Succeeded"}}}, nil))
	w.s.mr.Spec.Fencing = requiredNetworkFence()
	controllerutil.AddFinalizer(w.s.mr, caprv1.MachineRemediationFinalizer)
	res, err := w.run(caprv1.StepFence)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.done).To(BeTrue())
	return w
}

// TestFenceStepRecordsTheFence: the Fence step records what was fenced, by which backend and when,
// and the unfencing it owes.
func TestFenceStepRecordsTheFence(t *testing.T) {
	g := NewWithT(t)
	w := fencedWorld(t, g)
	rec := w.s.mr.Status.Fencing
	g.Expect(rec).NotTo(BeNil())
	g.Expect(rec.NodeName).To(Equal(nodeOf("m-b")))
	g.Expect(rec.Backends).To(HaveLen(1))
	g.Expect(rec.Backends[0].State).To(Equal(caprv1.FencingBackendFenced))
	g.Expect(rec.Backends[0].FencedTime).NotTo(BeNil())
	g.Expect(fencing.Owed(w.s.mr)).To(BeTrue())
}

// TestAbortBeforeTheDeleteUnfencesFirst: a request deleted after its Fence step but before its
// Delete step (not past the point of no return) keeps its finalizer while the unfence is pending,
// saying so, and lets go once it is done; the kept Machine is unfenced without waiting for its Node.
func TestAbortBeforeTheDeleteUnfencesFirst(t *testing.T) {
	g := NewWithT(t)
	w := fencedWorld(t, g)
	w.s.mr.DeletionTimestamp = &metav1.Time{Time: metav1.Now().Time}
	w.fencer.unfenceErr = fmt.Errorf("%w: NetworkFence set Unfenced, waiting for csi-addons", fencing.ErrUnfencePending)

	_, err := w.r.reconcileDelete(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.fencer.unfences).To(HaveLen(1))
	g.Expect(w.fencer.unfences[0].AfterDelete).To(BeFalse(), "the victim is kept")
	g.Expect(w.fencer.unfences[0].Node).To(Equal(nodeOf("m-b")))
	g.Expect(w.s.mr.Finalizers).To(ContainElement(caprv1.MachineRemediationFinalizer))
	g.Expect(conditions.GetReason(w.s.mr, caprv1.MachineRemediationProgressingCondition)).To(Equal(caprv1.MachineRemediationWaitingForUnfencingReason))
	g.Expect(fencing.Owed(w.s.mr)).To(BeTrue())

	w.fencer.unfenceErr = nil
	_, err = w.r.reconcileDelete(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fencing.Owed(w.s.mr)).To(BeFalse())
	g.Expect(w.s.mr.Status.Fencing.UnfencedTime).NotTo(BeNil())
	g.Expect(w.s.mr.Finalizers).NotTo(ContainElement(caprv1.MachineRemediationFinalizer))
}

// TestSucceedUnfencesAfterTheDeleteFirst: a remediation whose victim is gone does not succeed while
// its fence is owed; it asks for the unfence of a deleted Machine (the Node must be gone too).
func TestSucceedUnfencesAfterTheDeleteFirst(t *testing.T) {
	g := NewWithT(t)
	w := fencedWorld(t, g)
	w.fencer.unfenceErr = fmt.Errorf("%w: Node m-b-node still exists", fencing.ErrUnfencePending)
	_, err := w.r.succeed(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
	g.Expect(w.fencer.unfences).To(HaveLen(1))
	g.Expect(w.fencer.unfences[0].AfterDelete).To(BeTrue())
	g.Expect(conditions.GetMessage(w.s.mr, caprv1.MachineRemediationProgressingCondition)).To(ContainSubstring("still exists"))

	w.fencer.unfenceErr = nil
	_, err = w.r.succeed(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(w.s.mr.Status.Fencing.Backends[0].State).To(Equal(caprv1.FencingBackendUnfenced))
}

// TestAFencedRemediationDoesNotGiveWay: once its victim is fenced a remediation finishes; it neither
// gives way nor yields (the victim is about to go).
func TestAFencedRemediationDoesNotGiveWay(t *testing.T) {
	g := NewWithT(t)
	w := fencedWorld(t, g)
	conditions.Set(w.s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse,
		Reason: caprv1.MachineRemediationNotQuorumSafeReason, LastTransitionTime: metav1.NewTime(metav1.Now().Add(-2 * giveWayAfter))})
	g.Expect(w.r.mayGiveWay(t.Context(), w.s, caprv1.MachineRemediationNotQuorumSafeReason)).To(BeFalse())
	w.s.mr.Status.Fencing = nil
	g.Expect(w.r.mayGiveWay(t.Context(), w.s, caprv1.MachineRemediationNotQuorumSafeReason)).To(BeTrue(), "the same remediation without a fence may")
}
