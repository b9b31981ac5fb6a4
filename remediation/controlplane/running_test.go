package controlplane

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// A remediation whose next membership change cannot be made quorum-safe any more (a second member
// went down after the start) gives way before its point of no return and before any member joined,
// instead of holding the control plane until its step timeout.

// surgedWorld is a scale-up-first remediation of m-b after its scale-up: replicas 4, replacement m-d
// without a Node, waiting in WaitForReplacement, with etcd as given.
func surgedWorld(t *testing.T, etcd *fakeEtcd, extra ...worldOption) *world {
	t.Helper()
	opts := append([]worldOption{
		withReplicas(4), withReplacement(cpMachine("m-d", withoutNode())),
		withStep(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded, ""),
		withStep(caprv1.StepWaitForReplacement, caprv1.StepOutcomeInProgress, ""),
		withEtcd(etcd),
	}, extra...)
	return newWorld(t, opts...)
}

// TestStepsAskToGiveWay: which waits ask to give way (whether the remediation does is mayUndoNotQuorumSafe's,
// TestGiveWayAfterWaitingForAQuorumSafeChange).
func TestStepsAskToGiveWay(t *testing.T) {
	cDown := func() *fakeEtcd {
		return newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC, asDown()))
	}
	cases := []struct {
		name          string
		world         func(t *testing.T) *world
		step          caprv1.StepName
		notQuorumSafe bool
		reason        string
	}{
		{name: "ScaleUp, another member down before the surge", step: caprv1.StepScaleUp, notQuorumSafe: true, reason: caprv1.MachineRemediationNotQuorumSafeReason,
			world: func(t *testing.T) *world { return newWorld(t, withEtcd(cDown())) }},
		{name: "RemoveMember, another member down", step: caprv1.StepRemoveMember, notQuorumSafe: true, reason: caprv1.MachineRemediationNotQuorumSafeReason,
			world: func(t *testing.T) *world {
				return newWorld(t, withOrder(caprv1.ControlPlaneOrderRemoveMemberFirst),
					withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB, asUnreachable()), member(nodeC, asDown()))))
			}},
		{name: "WaitForReplacement, replacement without a Node, another member down", step: caprv1.StepWaitForReplacement, notQuorumSafe: true, reason: caprv1.MachineRemediationNotQuorumSafeReason,
			world: func(t *testing.T) *world { return surgedWorld(t, cDown()) }},
		{name: "WaitForReplacement, no replacement Machine yet, another member down", step: caprv1.StepWaitForReplacement, notQuorumSafe: true, reason: caprv1.MachineRemediationNotQuorumSafeReason,
			world: func(t *testing.T) *world {
				return newWorld(t, withReplicas(4), withStep(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded, ""), withEtcd(cDown()))
			}},
		{name: "WaitForReplacement, every member healthy: waits for the Node as before", step: caprv1.StepWaitForReplacement,
			world: func(t *testing.T) *world {
				return surgedWorld(t, newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC)))
			}},
		{name: "WaitForReplacement, the replacement's learner joined: undoing would remove a member, waits", step: caprv1.StepWaitForReplacement,
			world: func(t *testing.T) *world {
				return surgedWorld(t, newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC, asDown()), member(nodeD, asLearner())),
					withMachines(cpMachine("m-a"), cpMachine("m-b"), cpMachine("m-c")), withReplacement(cpMachine("m-d")))
			}},
		{name: "WaitForReplacement, a member added and not started yet (no name): waits", step: caprv1.StepWaitForReplacement,
			world: func(t *testing.T) *world {
				return surgedWorld(t, newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC, asDown()), member("", withMemberID(42), asLearner(), asUnreachable())))
			}},
		{name: "WaitForReplacement, etcd cannot be read: no guess", step: caprv1.StepWaitForReplacement,
			world: func(t *testing.T) *world { return surgedWorld(t, &fakeEtcd{inspectErr: errInjected}) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			w := tc.world(t)
			res, err := w.run(tc.step)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(res.Done).To(BeFalse(), "message: %s", res.Message)
			g.Expect(res.notQuorumSafe).To(Equal(tc.notQuorumSafe), "message: %s", res.Message)
			if tc.reason != "" {
				g.Expect(res.WaitReason).To(Equal(tc.reason), "message: %s", res.Message)
			}
			if tc.notQuorumSafe {
				g.Expect(res.Message).To(Or(ContainSubstring("not quorum-safe"), ContainSubstring("no healthy voting member")))
			}
			expectNoEtcdChange(g, w)
		})
	}
}

// waitingFor sets the Progressing condition as a step that has waited for reason since ago.
func waitingFor(w *world, reason string, ago time.Duration) {
	conditions.Set(w.s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse,
		Reason: reason, Message: "waiting", LastTransitionTime: metav1.NewTime(time.Now().Add(-ago))})
}

func TestGiveWayAfterWaitingForAQuorumSafeChange(t *testing.T) {
	cDown := func() *fakeEtcd {
		return newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC, asDown()))
	}

	t.Run("a replacement that cannot join: undone and Pending again after notQuorumSafeUndoAfter", func(t *testing.T) {
		g := NewWithT(t)
		w := surgedWorld(t, cDown())
		setLock(g, w)
		waitingFor(w, caprv1.MachineRemediationNotQuorumSafeReason, notQuorumSafeUndoAfter+time.Second)

		_, err := w.r.runSteps(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		mr := w.s.mr
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
		g.Expect(mr.Status.Steps).To(BeEmpty())
		g.Expect(mr.Status.ControlPlane).To(BeNil())
		g.Expect(mr.OwnerReferences).To(ConsistOf(HaveField("Kind", "Machine")))
		g.Expect(conditions.Get(mr, caprv1.MachineRemediationProgressingCondition)).To(And(
			HaveField("Reason", caprv1.MachineRemediationNotQuorumSafeReason),
			HaveField("Message", ContainSubstring("gave way")),
			HaveField("Message", ContainSubstring("replicas back from 4 to 3"))))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		g.Expect(w.controlPlaneAnnotations(g)).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
		g.Expect(w.machine(g, "m-d")).To(BeNil(), "the replacement that could not join goes")
		expectNoEtcdChange(g, w)
	})

	t.Run("a scale-up that cannot be issued: lock released, Pending again", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withEtcd(cDown()), withStep(caprv1.StepScaleUp, caprv1.StepOutcomeInProgress, ""))
		setLock(g, w)
		waitingFor(w, caprv1.MachineRemediationNotQuorumSafeReason, notQuorumSafeUndoAfter+time.Second)

		_, err := w.r.runSteps(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		g.Expect(w.controlPlaneAnnotations(g)).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	})

	t.Run("remove first, the victim's member not removed yet, another member down: Pending again, nothing to undo but the lock", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withOrder(caprv1.ControlPlaneOrderRemoveMemberFirst),
			withStep(caprv1.StepMoveLeader, caprv1.StepOutcomeSkipped, ""), withStep(caprv1.StepRemoveMember, caprv1.StepOutcomeInProgress, ""),
			withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB, asUnreachable()), member(nodeC, asDown()))))
		setLock(g, w)
		waitingFor(w, caprv1.MachineRemediationNotQuorumSafeReason, notQuorumSafeUndoAfter+time.Second)

		_, err := w.r.runSteps(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		g.Expect(w.controlPlaneAnnotations(g)).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
		expectNoEtcdChange(g, w)
	})

	keepsWaiting := []struct {
		name   string
		reason string
		ago    time.Duration
		world  func(t *testing.T) *world
		says   string
	}{
		{name: "waiting for less than notQuorumSafeUndoAfter", reason: caprv1.MachineRemediationNotQuorumSafeReason, ago: notQuorumSafeUndoAfter - 5*time.Second},
		{name: "the step waited for something else until now", reason: caprv1.MachineRemediationEtcdUnreachableReason, ago: time.Hour},
		{name: "the replacement joined (undoing would remove a healthy member)", reason: caprv1.MachineRemediationNotQuorumSafeReason, ago: time.Hour,
			says: "removing the member now is not quorum-safe",
			world: func(t *testing.T) *world {
				return newWorld(t, withReplicas(4), withReplacement(cpMachine("m-d")),
					withStep(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded, ""), withStep(caprv1.StepWaitForReplacement, caprv1.StepOutcomeSucceeded, ""),
					withStep(caprv1.StepMoveLeader, caprv1.StepOutcomeSucceeded, ""), withStep(caprv1.StepRemoveMember, caprv1.StepOutcomeInProgress, ""),
					withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC, asDown()), member(nodeD, asDown()))))
			}},
		{name: "past the point of no return (remove first, the victim's member removed)", reason: caprv1.MachineRemediationNotQuorumSafeReason, ago: time.Hour,
			says: "adding a member is not quorum-safe",
			world: func(t *testing.T) *world {
				return newWorld(t, withOrder(caprv1.ControlPlaneOrderRemoveMemberFirst), withStep(caprv1.StepMoveLeader, caprv1.StepOutcomeSkipped, ""),
					withStep(caprv1.StepRemoveMember, caprv1.StepOutcomeSucceeded, ""), withStep(caprv1.StepScaleUp, caprv1.StepOutcomeInProgress, ""),
					withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeC, asDown()))))
			}},
	}
	for _, tc := range keepsWaiting {
		t.Run(tc.name+": keeps the control plane and says why", func(t *testing.T) {
			g := NewWithT(t)
			w, says := surgedWorld(t, cDown()), "the replacement cannot join"
			if tc.world != nil {
				w, says = tc.world(t), tc.says
			}
			replicas := w.replicas(g)
			setLock(g, w)
			waitingFor(w, tc.reason, tc.ago)

			_, err := w.r.runSteps(t.Context(), w.s)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
			g.Expect(conditions.Get(w.s.mr, caprv1.MachineRemediationProgressingCondition)).To(And(
				HaveField("Reason", caprv1.MachineRemediationNotQuorumSafeReason),
				HaveField("Message", ContainSubstring(says))))
			g.Expect(w.replicas(g)).To(Equal(replicas))
			g.Expect(w.controlPlaneAnnotations(g)).To(HaveKey(caprv1.ControlPlaneLockAnnotation))
		})
	}
}

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
		yielded, _, err := w.r.yieldToMoreBroken(t.Context(), w.s)
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
		yielded, _, err := w.r.yieldToMoreBroken(t.Context(), w.s)
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
		yielded, _, err := w.r.yieldToMoreBroken(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(yielded).To(BeTrue())
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		g.Expect(w.machine(g, "m-d")).To(BeNil(), "KCP refuses to scale down while m-c is unhealthy")
		g.Expect(w.machine(g, "m-e")).To(BeNil())
		g.Expect(w.machine(g, "m-c")).NotTo(BeNil())
		g.Expect(w.s.mr.Status.Conditions).To(ContainElement(HaveField("Message", ContainSubstring("KCP scales down only when"))))
	})

	t.Run("the replacement's member already votes: keeps going, the replacement kept", func(t *testing.T) {
		// Undoing now would delete a healthy voting member and keep the broken victim: no safer than
		// going on, and a whole extra remediation at margin 0 (mayGiveWay).
		g := NewWithT(t)
		w := yieldWorld(t, g, member(nodeC, asDown()), caprv1.MachineRemediationPhasePending, true,
			withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC, asDown()), member(nodeD))))
		yielded, _, err := w.r.yieldToMoreBroken(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(yielded).To(BeFalse(), "gave way after the replacement's member joined")
		g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
		g.Expect(w.controlPlaneAnnotations(g)).To(HaveKey(caprv1.ControlPlaneLockAnnotation))
		m := w.machine(g, "m-d")
		g.Expect(m).NotTo(BeNil())
		g.Expect(m.Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
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
			yielded, _, err := w.r.yieldToMoreBroken(t.Context(), w.s)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(yielded).To(BeFalse())
			g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
			g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
			g.Expect(w.controlPlaneAnnotations(g)).To(HaveKey(caprv1.ControlPlaneLockAnnotation))
			g.Expect(w.machine(g, "m-d").Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
		})
	}
}
