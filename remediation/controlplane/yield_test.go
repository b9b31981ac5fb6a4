package controlplane

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// A running remediation of m-b (healthy member) after its scale-up: replicas 4, replacement m-d
// (with a Node when started) not up yet. m-c waits with a request of its own.
func yieldWorld(t *testing.T, g Gomega, mcMember fakeMember, mcPhase caprv1.RemediationPhase, started bool, extra ...worldOption) *world {
	t.Helper()
	replacement := cpMachine("m-d", withoutNode())
	if started {
		replacement = cpMachine("m-d")
	}
	opts := append([]worldOption{
		withReplicas(4), withReplacement(replacement),
		withStep(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded, ""),
		withStep(caprv1.StepWaitForReplacement, caprv1.StepOutcomeInProgress, ""),
		withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), mcMember)),
	}, extra...)
	w := newWorld(t, opts...)
	w.s.mr.Status.CurrentStep = caprv1.StepWaitForReplacement
	setLock(g, w)
	other := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "m-c",
		CreationTimestamp: metav1.NewTime(time.Now())}}
	g.Expect(w.client.Create(t.Context(), other)).To(Succeed())
	other.Status.Phase = mcPhase
	g.Expect(w.client.Status().Update(t.Context(), other)).To(Succeed())
	return w
}

// setLock writes the control-plane lock for the world's remediation, in the fake API and in the scope.
func setLock(g Gomega, w *world) {
	value, err := (&caprv1.ControlPlaneLock{MachineRemediation: w.s.mr.Name, DesiredReplicas: 3}).Marshal()
	g.Expect(err).NotTo(HaveOccurred())
	a := w.s.cp.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[caprv1.ControlPlaneLockAnnotation] = value
	w.s.cp.SetAnnotations(a)
	g.Expect(w.client.Update(w.t.Context(), w.s.cp)).To(Succeed())
}

func TestYieldToMoreBroken(t *testing.T) {
	t.Run("a waiting Machine's member is down: undone and back to Pending", func(t *testing.T) {
		g := NewWithT(t)
		w := yieldWorld(t, g, member(nodeC, asDown()), caprv1.MachineRemediationPhasePending, false)
		yielded, err := w.r.yieldToMoreBroken(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(yielded).To(BeTrue())

		mr := w.s.mr
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
		g.Expect(mr.Status.Steps).To(BeEmpty())
		g.Expect(mr.Status.ControlPlane).To(BeNil())
		g.Expect(mr.OwnerReferences).To(ConsistOf(HaveField("Kind", "Machine")), "owned by its Machine again, like a request that never started")
		g.Expect(mr.Status.Conditions).To(ContainElement(And(
			HaveField("Reason", caprv1.MachineRemediationAnotherRemediationInProgressReason),
			HaveField("Message", ContainSubstring("m-c")))))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		g.Expect(w.controlPlaneAnnotations(g)).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
		g.Expect(w.machine(g, "m-d")).To(BeNil(), "a replacement without a Node is deleted: it could not join while a member is down, and a provider does not scale down while it provisions")
		for _, old := range []string{"m-a", "m-b", "m-c"} {
			g.Expect(w.machine(g, old).Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
		}
	})

	t.Run("a started replacement is marked for the provider's scale-down, not deleted", func(t *testing.T) {
		g := NewWithT(t)
		w := yieldWorld(t, g, member(nodeC, asDown()), caprv1.MachineRemediationPhasePending, true)
		yielded, err := w.r.yieldToMoreBroken(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(yielded).To(BeTrue())
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		m := w.machine(g, "m-d")
		g.Expect(m).NotTo(BeNil())
		g.Expect(m.Annotations).To(HaveKey(clusterv1.DeleteMachineAnnotation), "the provider removes the replacement, not an old Machine")
		g.Expect(m.DeletionTimestamp.IsZero()).To(BeTrue())
	})

	t.Run("KCP with another Machine unhealthy: a started replacement is deleted, KCP would never scale down", func(t *testing.T) {
		g := NewWithT(t)
		w := yieldWorld(t, g, member(nodeC, asDown()), caprv1.MachineRemediationPhasePending, true,
			withControlPlaneObject(kcpObject()), withSurgeOfTwo(),
			withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b", kcpHealthy()), cpMachine("m-c")),
			withReplacement(cpMachine("m-d", kcpHealthy())), withReplacement(cpMachine("m-e", withoutNode())), withReplicas(5))
		yielded, err := w.r.yieldToMoreBroken(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(yielded).To(BeTrue())
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		g.Expect(w.machine(g, "m-d")).To(BeNil(), "KCP refuses to scale down while m-c is unhealthy")
		g.Expect(w.machine(g, "m-e")).To(BeNil())
		g.Expect(w.machine(g, "m-c")).NotTo(BeNil())
		g.Expect(w.s.mr.Status.Conditions).To(ContainElement(HaveField("Message", ContainSubstring("KCP scales down only when"))))
	})

	keepsGoing := []struct {
		name   string
		member fakeMember
		phase  caprv1.RemediationPhase
		extra  []worldOption
	}{
		{name: "the waiting Machine's member is healthy", member: member(nodeC), phase: caprv1.MachineRemediationPhasePending},
		{name: "the other request already finished", member: member(nodeC, asDown()), phase: caprv1.MachineRemediationPhaseFailed},
		{name: "past the point of no return (victim's member removed)", member: member(nodeC, asDown()), phase: caprv1.MachineRemediationPhasePending,
			extra: []worldOption{withStep(caprv1.StepRemoveMember, caprv1.StepOutcomeSucceeded, ""),
				withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeC, asDown())))}},
	}
	for _, tt := range keepsGoing {
		t.Run(tt.name+": keeps going", func(t *testing.T) {
			g := NewWithT(t)
			w := yieldWorld(t, g, tt.member, tt.phase, false, tt.extra...)
			yielded, err := w.r.yieldToMoreBroken(t.Context(), w.s)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(yielded).To(BeFalse())
			g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
			g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
			g.Expect(w.controlPlaneAnnotations(g)).To(HaveKey(caprv1.ControlPlaneLockAnnotation))
			g.Expect(w.machine(g, "m-d").Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
		})
	}
}
