package controlplane

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// surgeAskedWorld is a remediation of m-b whose surge of one was asked (ScaleUp done, replicas 4)
// and observed by the provider (generation 5), which has not created the Machine yet: its
// replacement is overdue.
func surgeAskedWorld(t *testing.T, opts ...worldOption) *world {
	return newWorld(t, append([]worldOption{withReplicas(4),
		withStep(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded, "raised replicas to 4"),
		withStep(caprv1.StepWaitForReplacement, caprv1.StepOutcomeInProgress, "waiting for the control-plane provider to create the replacement Machine"),
	}, opts...)...)
}

// failOverdue fails the remediation as its step timeout does.
func failOverdue(t *testing.T, g Gomega, w *world) {
	t.Helper()
	_, err := w.r.fail(t.Context(), w.s, caprv1.MachineRemediationStepTimedOutReason, "step WaitForReplacement did not finish within 30m0s")
	g.Expect(err).NotTo(HaveOccurred())
}

// providerObserves records, as the provider does at the end of a reconcile, that it observed the
// control-plane object's current generation.
func providerObserves(t *testing.T, g Gomega, w *world) {
	t.Helper()
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(w.s.cp.GroupVersionKind())
	g.Expect(w.client.Get(t.Context(), client.ObjectKeyFromObject(w.s.cp), cp)).To(Succeed())
	g.Expect(unstructured.SetNestedField(cp.Object, cp.GetGeneration(), "status", "observedGeneration")).To(Succeed())
	g.Expect(w.client.Update(t.Context(), cp)).To(Succeed())
}

// reconcileWhileRunning reconciles the running remediation (at most n times) as Reconcile does:
// the control-plane object read live first.
func reconcileWhileRunning(t *testing.T, g Gomega, w *world, n int) {
	t.Helper()
	for i := 0; i < n && w.s.mr.Status.Phase == caprv1.MachineRemediationPhaseRunning; i++ {
		g.Expect(w.client.Get(t.Context(), client.ObjectKeyFromObject(w.s.cp), w.s.cp)).To(Succeed())
		_, err := w.r.reconcileRunning(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.r.persist(t.Context(), w.s)).To(Succeed())
	}
}

// TestUndoWaitsForTheProviderToObserveTheReplicas: KubeadmControlPlane creates a Machine from the
// spec.replicas it read when its reconcile began, seconds later (undo.go says where in KCP's code).
// The remediation fails with its surge asked and not yet created, and sets the replicas back to 3; the
// provider's reconcile in flight, which read 4, creates the surge Machine after that (after the undo
// read the Machines live), then the provider observes the replicas set back. The undo kept the
// control plane meanwhile and marks that Machine for deletion: the provider's scale-down takes it,
// not an old Machine (the victim, unfenced). Before, the undo ended at once and the Machine was left
// unmarked.
func TestUndoWaitsForTheProviderToObserveTheReplicas(t *testing.T) {
	g := NewWithT(t)
	w := surgeAskedWorld(t, withProviderGenerations())
	failOverdue(t, g, w)
	g.Expect(w.replicas(g)).To(BeEquivalentTo(3))

	g.Expect(w.client.Create(t.Context(), cpMachine("m-d"))).To(Succeed())
	providerObserves(t, g, w)
	reconcileWhileRunning(t, g, w, 3)

	g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed))
	g.Expect(w.machine(g, "m-d").Annotations).To(HaveKey(clusterv1.DeleteMachineAnnotation),
		"the Machine the provider created from the replicas it read before the undo is marked for its scale-down")
	g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
}

// TestUndoKeepsTheControlPlaneUntilTheProviderObserved: while the provider has not observed the
// replicas set back, the undone remediation stays Running with its outcome recorded
// (status.controlPlane.undo), keeps the lock and the fence hook, and says what it waits for; whatever
// reconciles it next goes on with the undo (not with its steps or its step timeout), and it ends as
// recorded once the provider has observed them.
func TestUndoKeepsTheControlPlaneUntilTheProviderObserved(t *testing.T) {
	g := NewWithT(t)
	w := surgeAskedWorld(t, withProviderGenerations())
	w.s.mr.Status.AppliedFencing = &caprv1.AppliedFencing{Policy: caprv1.FencingRequired}
	g.Expect(w.r.ensureFenceHook(t.Context(), w.s)).To(Succeed())
	g.Expect(w.r.takeLock(t.Context(), w.s, 3)).To(Succeed())
	failOverdue(t, g, w)

	waiting := func() {
		t.Helper()
		mr := w.s.mr
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
		g.Expect(mr.Status.ControlPlane.Undo).NotTo(BeNil())
		g.Expect(mr.Status.ControlPlane.Undo.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed))
		g.Expect(conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition)).To(Equal(caprv1.MachineRemediationStepTimedOutReason))
		g.Expect(conditions.GetMessage(mr, caprv1.MachineRemediationProgressingCondition)).To(And(
			ContainSubstring("left as found: replicas back from 4 to 3"),
			ContainSubstring("waiting for the control-plane provider to observe them (TestControlPlane wc-cp observed generation 5 of 6)")))
		g.Expect(w.controlPlaneAnnotations(g)).To(HaveKey(caprv1.ControlPlaneLockAnnotation))
		g.Expect(w.machine(g, "m-b").Annotations).To(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
	}
	waiting()
	reconcileWhileRunning(t, g, w, 2)
	waiting()
	g.Expect(w.replicas(g)).To(BeEquivalentTo(3))

	providerObserves(t, g, w)
	reconcileWhileRunning(t, g, w, 1)
	mr := w.s.mr
	g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed))
	g.Expect(mr.Status.ControlPlane.Undo).To(BeNil())
	g.Expect(conditions.GetReason(mr, caprv1.MachineRemediationSucceededCondition)).To(Equal(caprv1.MachineRemediationStepTimedOutReason))
	g.Expect(mr.Status.LastError).To(And(ContainSubstring("left as found: replicas back from 4 to 3"), ContainSubstring("then the control-plane lock released")))
	g.Expect(w.controlPlaneAnnotations(g)).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
}

// TestUndoWaitForTheProviderIsBounded: a provider that never records what it observed (its
// reconciles keep failing) holds the undo for undoObserveTimeout, after which it ends and says what
// may be left.
func TestUndoWaitForTheProviderIsBounded(t *testing.T) {
	g := NewWithT(t)
	w := surgeAskedWorld(t, withProviderGenerations())
	failOverdue(t, g, w)
	g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
	w.s.mr.Status.ControlPlane.Undo.StartTime = metav1.NewTime(time.Now().Add(-undoObserveTimeout - time.Second))
	reconcileWhileRunning(t, g, w, 1)
	g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed))
	g.Expect(w.s.mr.Status.LastError).To(ContainSubstring("did not observe the replicas set back to 3 within 2m0s (TestControlPlane wc-cp observed generation 5 of 6)"))
}

// TestUndoOfAProviderWithoutObservedGenerationEndsAtOnce: without status.observedGeneration nothing
// says what the provider has observed: the undo ends at once, reading the Machines once, as before.
// Without a surge asked there is nothing the provider may act on, whatever it reports.
func TestUndoOfAProviderWithoutObservedGenerationEndsAtOnce(t *testing.T) {
	t.Run("no observedGeneration", func(t *testing.T) {
		g := NewWithT(t)
		w := surgeAskedWorld(t)
		failOverdue(t, g, w)
		g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
	})
	t.Run("no surge asked", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withProviderGenerations(), withStep(caprv1.StepMoveLeader, caprv1.StepOutcomeInProgress, ""))
		w.s.cp.SetGeneration(6) // changed by someone else and not observed yet: none of the remediation's doing
		failOverdue(t, g, w)
		g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseFailed))
	})
}
