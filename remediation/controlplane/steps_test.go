package controlplane

import (
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

// Table tests of the steps on fakes (fakes_test.go): a fake API server and a fake etcd, no
// kube-apiserver. Each case runs one attempt of a step and checks what it did to the world.

// stepCase is one attempt at a step in a world.
type stepCase struct {
	name  string
	world []worldOption
	// before, if set, edits the world before the attempt.
	before func(w *world)
	check  func(g Gomega, w *world, res stepResult, err error)
}

func runStepCases(t *testing.T, step caprv1.StepName, cases []stepCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			w := newWorld(t, tc.world...)
			if tc.before != nil {
				tc.before(w)
			}
			res, err := w.run(step)
			tc.check(g, w, res, err)
		})
	}
}

// expectIssued: the step acted (or waits on the world) and is not done yet.
func expectIssued(g Gomega, res stepResult, err error) {
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done).To(BeFalse(), "message: %s", res.Message)
	g.Expect(res.WaitReason).To(BeEmpty(), "message: %s", res.Message)
}

// expectWaiting: the step cannot proceed, for reason.
func expectWaiting(g Gomega, res stepResult, err error, reason string) {
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done).To(BeFalse(), "message: %s", res.Message)
	g.Expect(res.WaitReason).To(Equal(reason), "message: %s", res.Message)
}

// expectDone: the step's effect is visible.
func expectDone(g Gomega, res stepResult, err error) {
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done).To(BeTrue(), "message: %s", res.Message)
	g.Expect(res.Skipped).To(BeFalse(), "message: %s", res.Message)
}

// expectSkipped: the step is not needed.
func expectSkipped(g Gomega, res stepResult, err error) {
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Done).To(BeTrue(), "message: %s", res.Message)
	g.Expect(res.Skipped).To(BeTrue(), "message: %s", res.Message)
}

// expectNoEtcdChange: nothing was sent to etcd that changes it.
func expectNoEtcdChange(g Gomega, w *world) {
	g.Expect(w.etcd.moveLeaders).To(BeEmpty())
	g.Expect(w.etcd.removeMembers).To(BeEmpty())
}

var (
	nodeA, nodeB, nodeC, nodeD = nodeOf("m-a"), nodeOf("m-b"), nodeOf("m-c"), nodeOf("m-d")
	nodeE, nodeF               = nodeOf("m-e"), nodeOf("m-f")
)

// TestStepsDeleteFirst: without a surge the victim is deleted directly (replicas untouched) and the
// provider is armed to replace it.
func TestStepsDeleteFirst(t *testing.T) {
	runStepCases(t, caprv1.StepDelete, []stepCase{
		{name: "fenced: the Machine is deleted, replicas untouched",
			world: []worldOption{withOrder(caprv1.ControlPlaneOrderDeleteFirst), withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, "")},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.machine(g, "m-b")).To(BeNil())
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
			}},
	})
	t.Run("victim gone, no replacement yet: KCP armed with remediation-in-progress", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withOrder(caprv1.ControlPlaneOrderDeleteFirst), withControlPlaneObject(kcpObject()),
			withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b"), cpMachine("m-c", kcpHealthy())),
			withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeC))))
		w.deleteVictim(g)
		w.s.machines = slices.DeleteFunc(w.s.machines, func(m *clusterv1.Machine) bool { return m.Name == "m-b" })
		res, err := w.run(caprv1.StepWaitForReplacement)
		expectIssued(g, res, err)
		g.Expect(w.controlPlaneAnnotations(g)).To(HaveKeyWithValue(controlplanev1.RemediationInProgressAnnotation, ContainSubstring(`"machine":"m-b"`)))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
	})
}

// TestStepsDeleteBeforeMemberRemoval: the victim is fenced and deleted while its member still votes
// (the provider's deletion removes the member at its pre-terminate point: KCP's kcp-cleanup hook);
// RemoveMember follows the Delete step and finds the member gone, or removes it should it still be
// listed (e.g. the provider's hook was taken off by hand).
func TestStepsDeleteBeforeMemberRemoval(t *testing.T) {
	order := caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval
	steps := StepsFor(order)
	NewWithT(t).Expect(slices.Index(steps, caprv1.StepDelete)).To(BeNumerically("<", slices.Index(steps, caprv1.StepRemoveMember)))
	fenced := withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, "")
	runStepCases(t, caprv1.StepDelete, []stepCase{
		{name: "fenced: the Machine is deleted, its member left voting, replicas untouched",
			world: []worldOption{withOrder(order), fenced},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.machine(g, "m-b")).To(BeNil())
				expectNoEtcdChange(g, w)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
			}},
	})
	deleted := withStep(caprv1.StepDelete, caprv1.StepOutcomeSucceeded, "")
	// The victim's member ID, recorded at the start, is how RemoveMember finds it after the Delete.
	recorded := withRecordedMemberID(memberID(nodeB))
	runStepCases(t, caprv1.StepRemoveMember, []stepCase{
		{name: "victim gone, its member removed by the provider's deletion: done",
			world:  []worldOption{withOrder(order), fenced, deleted, recorded, withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeC)))},
			before: func(w *world) { w.deleteVictim(NewWithT(w.t)) },
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(res.Message).To(ContainSubstring("not in the member list"))
				expectNoEtcdChange(g, w)
			}},
		{name: "victim gone, its member still listed: removed",
			world:  []worldOption{withOrder(order), fenced, deleted, recorded, withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB, asDown()), member(nodeC)))},
			before: func(w *world) { w.deleteVictim(NewWithT(w.t)) },
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.etcd.removeMembers).To(HaveLen(1))
				g.Expect(w.etcd.removeMembers[0].id).To(Equal(memberID(nodeB)))
			}},
	})
}

// memberRemovedWorld is a RemoveMemberFirst remediation holding the lock whose victim's member is
// removed and whose replacement is asked for (no Node yet): Fence is next.
func memberRemovedWorld(t *testing.T, g Gomega, opts ...worldOption) *world {
	t.Helper()
	w := newWorld(t, append([]worldOption{withOrder(caprv1.ControlPlaneOrderRemoveMemberFirst), withReplicas(4),
		withReplacement(cpMachine("m-d", withoutNode())),
		withStep(caprv1.StepMoveLeader, caprv1.StepOutcomeSkipped, ""),
		withStep(caprv1.StepRemoveMember, caprv1.StepOutcomeSucceeded, ""),
		withStep(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded, ""),
		withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeC)))}, opts...)...)
	setLock(g, w)
	return w
}

// TestAFailedStepReturnsItsError: a step that fails is recorded (the request's lastError and the
// step's message) and its error returned, so that controller-runtime counts it and retries the step
// with its backoff, as the worker remediator's steps do. It was recorded and swallowed, with a fixed
// requeue that no metric or log of controller-runtime saw.
func TestAFailedStepReturnsItsError(t *testing.T) {
	g := NewWithT(t)
	w := memberRemovedWorld(t, g, withFence(fencing.Result{}, errInjected))
	_, err := w.r.runSteps(t.Context(), w.s)
	g.Expect(err).To(MatchError(errInjected))
	g.Expect(err).To(MatchError(ContainSubstring("step Fence")))
	g.Expect(w.s.mr.Status.LastError).To(ContainSubstring(errInjected.Error()))
	g.Expect(findStep(w.s.mr, caprv1.StepFence)).To(And(
		HaveField("Outcome", caprv1.StepOutcomeInProgress), HaveField("Message", ContainSubstring(errInjected.Error()))))
	g.Expect(w.machine(g, "m-b")).NotTo(BeNil(), "nothing after the failed step ran")
}

// TestSkippedStepIsFollowedInTheSameReconcile: a step that issues nothing (MoveLeader for a dead
// victim that does not lead) is followed at once by the next, on the etcd state just read: one
// inspection for both, where a new reconcile would read etcd again, which with a dead member costs
// its dial timeout each time. The skipped step's outcome is recorded with the next step's start,
// before that step issues anything (persisted: crash-safe).
func TestSkippedStepIsFollowedInTheSameReconcile(t *testing.T) {
	g := NewWithT(t)
	w := newWorld(t, withOrder(caprv1.ControlPlaneOrderRemoveMemberFirst),
		withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB, asDown()), member(nodeC))))
	setLock(g, w)
	_, err := w.r.runSteps(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.etcd.inspected).To(HaveLen(1), "one inspection for both steps")
	g.Expect(w.etcd.removeMembers).To(HaveLen(1), "RemoveMember issued in the same reconcile")
	stored := &caprv1.MachineRemediation{}
	g.Expect(w.client.Get(t.Context(), client.ObjectKeyFromObject(w.s.mr), stored)).To(Succeed())
	g.Expect(stored.Status.Steps).To(HaveLen(2))
	g.Expect(stored.Status.Steps[0]).To(And(HaveField("Name", caprv1.StepMoveLeader), HaveField("Outcome", caprv1.StepOutcomeSkipped)))
	g.Expect(stored.Status.Steps[1]).To(And(HaveField("Name", caprv1.StepRemoveMember), HaveField("Outcome", caprv1.StepOutcomeInProgress)))
}

// TestRemoveMemberFirstDeletesBeforeTheReplacementVotes: once the victim's member is removed its
// Machine serves nothing, so it is fenced and deleted while the replacement is provisioned (the
// replacement has no Node yet here), and only then does the remediation wait for the replacement.
func TestRemoveMemberFirstDeletesBeforeTheReplacementVotes(t *testing.T) {
	g := NewWithT(t)
	w := memberRemovedWorld(t, g)
	for range 3 {
		_, err := w.r.runSteps(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(w.machine(g, "m-b")).To(BeNil(), "the victim is deleted before its replacement has a Node")
	g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
	g.Expect(findStep(w.s.mr, caprv1.StepFence)).To(HaveField("Outcome", caprv1.StepOutcomeSucceeded))
	g.Expect(currentStep(w.s.mr)).To(BeElementOf(caprv1.StepDelete, caprv1.StepWaitForReplacement))
}

// TestStartIsFollowedByTheFirstStep: a remediation that starts goes on to its first step in the same
// reconcile, on the etcd state its order was chosen on: with the victim's member dead, one inspection
// for the start, MoveLeader (skipped) and RemoveMember (issued).
func TestStartIsFollowedByTheFirstStep(t *testing.T) {
	g := NewWithT(t)
	w := newWorld(t, withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB, asDown()), member(nodeC))))
	w.s.cluster.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	w.s.mr.Status = caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhasePending}
	g.Expect(w.client.Status().Update(t.Context(), w.s.mr)).To(Succeed())
	w.s.base = w.s.mr.DeepCopy()
	_, err := w.r.reconcilePending(t.Context(), w.s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning), "%v", w.s.mr.Status.Conditions)
	g.Expect(w.s.mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderRemoveMemberFirst))
	g.Expect(w.etcd.inspected).To(HaveLen(1), "one inspection for the start and the first steps")
	g.Expect(w.etcd.removeMembers).To(HaveLen(1), "RemoveMember issued in the reconcile that started the remediation")
}
