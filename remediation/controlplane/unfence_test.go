package controlplane

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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
	g.Expect(res.Done).To(BeTrue())
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

// TestAbortBeforeTheDeleteUnfencesBeforeLettingGo: a request deleted after its Fence step but before
// its Delete step (not past the point of no return) is undone at once (it holds the control plane no
// more), keeps its finalizer and the fence hook on the kept victim while the unfence is pending
// (saying so), and lets go of both once it is done. The kept Machine is unfenced as a kept one (the
// fencer then waits for its Node to be Ready, not gone).
func TestAbortBeforeTheDeleteUnfencesBeforeLettingGo(t *testing.T) {
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
	g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending), "undone: it holds the control plane no more")
	g.Expect(w.machine(g, "m-b").Annotations).To(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation), "a deletion meanwhile is held and fenced again")

	w.fencer.unfenceErr = nil
	_, err = w.r.reconcileDelete(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fencing.Owed(w.s.mr)).To(BeFalse())
	g.Expect(w.s.mr.Status.Fencing.UnfencedTime).NotTo(BeNil())
	g.Expect(w.s.mr.Finalizers).NotTo(ContainElement(caprv1.MachineRemediationFinalizer))
	g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
}

// TestAbortWhileSomeoneElseDeletesTheVictimFencesItFirst: the victim is being deleted by someone else,
// its deletion held by the hook, when the request is deleted, before the fence is final. The abort
// neither undoes nor lets the hook go: it asks the fencer, waits while the fence is not confirmed,
// and releases the deletion only once it is.
func TestAbortWhileSomeoneElseDeletesTheVictimFencesItFirst(t *testing.T) {
	g := NewWithT(t)
	w := newWorld(t, withOrder(caprv1.ControlPlaneOrderReplace), withMachines(cpMachine("m-a"),
		cpMachine("m-b", beingDeleted(), withMachineAnnotation(caprv1.FenceBeforeDeleteHookAnnotation, "m-b")), cpMachine("m-c")),
		withFence(fencing.Result{Outcome: fencing.Waiting, Message: "NetworkFence: no result from csi-addons yet"}, nil))
	w.s.mr.Spec.Fencing = requiredNetworkFence()
	controllerutil.AddFinalizer(w.s.mr, caprv1.MachineRemediationFinalizer)
	// Deleted as the API server records it (the fake client refuses a patch that sets it).
	w.s.mr.DeletionTimestamp = &metav1.Time{Time: metav1.Now().Time}
	w.s.base.DeletionTimestamp = w.s.mr.DeletionTimestamp

	for range 2 {
		_, err := w.r.reconcileDelete(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.machine(g, "m-b").Annotations).To(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation), "released unfenced")
		g.Expect(w.s.mr.Finalizers).To(ContainElement(caprv1.MachineRemediationFinalizer))
		g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning), "nothing undone before the fence is final")
		g.Expect(conditions.GetMessage(w.s.mr, caprv1.MachineRemediationProgressingCondition)).To(ContainSubstring("held until it is fenced"))
	}
	g.Expect(w.fencer.requests).NotTo(BeEmpty())
	g.Expect(fencing.Owed(w.s.mr)).To(BeTrue(), "the fence is recorded before the fencer acts")

	w.fencer.result = fencing.Result{Outcome: fencing.Fenced, Message: "fenced"}
	w.fencer.unfenceErr = fmt.Errorf("%w: Node m-b-node still exists", fencing.ErrUnfencePending)
	_, err := w.r.reconcileDelete(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation), "fenced: the deletion may proceed")
	g.Expect(w.fencer.unfences).NotTo(BeEmpty())
	g.Expect(w.fencer.unfences[len(w.fencer.unfences)-1].AfterDelete).To(BeTrue(), "a deleting victim is unfenced only once its Node is gone")
	g.Expect(w.s.mr.Finalizers).To(ContainElement(caprv1.MachineRemediationFinalizer))
}

// TestFailWhileSomeoneElseDeletesTheVictimFencesItFirst: a failure (here a step timeout's) does not
// undo, and so never releases a held deletion, before the victim is fenced.
func TestFailWhileSomeoneElseDeletesTheVictimFencesItFirst(t *testing.T) {
	g := NewWithT(t)
	w := newWorld(t, withMachines(cpMachine("m-a"),
		cpMachine("m-b", beingDeleted(), withMachineAnnotation(caprv1.FenceBeforeDeleteHookAnnotation, "m-b")), cpMachine("m-c")),
		withFence(fencing.Result{Outcome: fencing.Waiting, Message: "not confirmed"}, nil))
	w.s.mr.Spec.Fencing = requiredNetworkFence()
	_, err := w.r.fail(t.Context(), w.s, caprv1.MachineRemediationStepTimedOutReason, "step ScaleUp timed out")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
	g.Expect(w.machine(g, "m-b").Annotations).To(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
	g.Expect(w.fencer.requests).To(HaveLen(1))
}

// TestFenceStepOfAVictimGoneIsDone: past the point of no return the victim was deleted by someone
// else (after its held deletion was fenced): the Fence step has nothing to fence and finishes,
// without asking the fencer about a Machine that is gone.
func TestFenceStepOfAVictimGoneIsDone(t *testing.T) {
	g := NewWithT(t)
	w := newWorld(t)
	w.s.mr.Spec.Fencing = requiredNetworkFence()
	w.s.machineGone = true
	res, err := w.run(caprv1.StepFence)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done).To(BeTrue())
	g.Expect(w.fencer.requests).To(BeEmpty())
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
		Reason: caprv1.MachineRemediationNotQuorumSafeReason, LastTransitionTime: metav1.NewTime(metav1.Now().Add(-2 * notQuorumSafeUndoAfter))})
	g.Expect(w.r.mayUndoNotQuorumSafe(t.Context(), w.s, caprv1.MachineRemediationNotQuorumSafeReason)).To(BeFalse())
	w.s.mr.Status.Fencing = nil
	g.Expect(w.r.mayUndoNotQuorumSafe(t.Context(), w.s, caprv1.MachineRemediationNotQuorumSafeReason)).To(BeTrue(), "the same remediation without a fence may")
}

// TestUndoMarksASurgeCreatedMeanwhile: the provider created the surge Machine after the reconcile's
// cached read (it acts on replicas at once). The undo reads the Machines again after replicas are
// back and marks it, so the provider's scale-down takes the surge, not an old Machine (the victim,
// unfenced).
func TestUndoMarksASurgeCreatedMeanwhile(t *testing.T) {
	g := NewWithT(t)
	w := newWorld(t, withReplicas(4), withMachines(cpMachine("m-a"), cpMachine("m-b"), cpMachine("m-c")))
	late := cpMachine("m-d")
	g.Expect(w.client.Create(t.Context(), late)).To(Succeed()) // in the API, not in the reconcile's view
	_, err := w.r.undo(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
	d := w.machine(g, "m-d")
	g.Expect(d).NotTo(BeNil())
	g.Expect(d.Annotations).To(HaveKey(clusterv1.DeleteMachineAnnotation))
	g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
}
