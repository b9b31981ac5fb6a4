package scenarios_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/builder"
)

// TestNodeNotReadyMemberHealthyScalesUpFirst: the Node stops reporting but its etcd member is
// healthy. CAPR adds the replacement first and removes the healthy member only once the replacement
// votes: the cluster never has fewer than three healthy voters.
func TestNodeNotReadyMemberHealthyScalesUpFirst(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	check := writeData(t, wc)
	machines := controlPlane(g, wc)
	victim := machines[1]
	startCAPR(t)
	watch := sb.WatchQuorum(ctx, wc)

	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	mr := waitRemediated(t, wc, victim.Name, 3)

	samples, lost := watch.Stop()
	g.Expect(samples).To(BeNumerically(">", 10))
	g.Expect(lost).To(BeEmpty(), "etcd lost quorum during the remediation")
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst))
	g.Expect(stepNames(mr)).To(Equal(builder.Steps[caprv1.ControlPlaneOrderScaleUpFirst]))
	g.Expect(mr.Status.ControlPlane.Replacement).NotTo(BeEmpty())
	g.Expect(memberNames(g, wc)).NotTo(ContainElement(victim.Status.NodeRef.Name))
	g.Expect(memberNames(g, wc)).To(ContainElement(mr.Status.ControlPlane.Replacement))
	check()
	// The lock is released and replicas are back to 3.
	cp := controlPlane(g, wc)
	g.Expect(cp).To(HaveLen(3))
	rep := getMachine(g, wc, mr.Status.ControlPlane.Replacement)
	g.Expect(rep.Annotations).To(HaveKey(caprv1.RemediationRecordAnnotation))
}

// TestDeadMemberRemovesFirst: the victim's etcd process is dead (its Node is fine). Adding a voter
// first would need 3 healthy of 4: CAPR removes the dead member first, then scales up.
func TestDeadMemberRemovesFirst(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	check := writeData(t, wc)
	victim := controlPlane(g, wc)[0]
	startCAPR(t)
	watch := sb.WatchQuorum(ctx, wc)

	sb.KillEtcdMember(wc, victim.Status.NodeRef.Name)
	mr := waitRemediated(t, wc, victim.Name, 3)

	_, lost := watch.Stop()
	g.Expect(lost).To(BeEmpty())
	g.Expect(mr.Spec.Reason).To(Equal(caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason))
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderRemoveMemberFirst))
	g.Expect(mr.Status.ControlPlane.OrderReason).To(ContainSubstring("not quorum-safe"))
	g.Expect(stepNames(mr)).To(Equal(builder.Steps[caprv1.ControlPlaneOrderRemoveMemberFirst]))
	g.Expect(stepOutcome(mr, caprv1.StepMoveLeader)).To(Equal(caprv1.StepOutcomeSkipped))
	check()
}

// TestLeaderWithUnreachableKubeletKeepsTheMargin: the etcd leader's kubelet is down, so its member
// (still running, still leading) cannot be reached through the API server and MoveLeader is
// impossible — the case that stalls KCP (CAPI #8465, #12711). The other members follow it and a
// linearizable read passes through it, so it counts as alive: CAPR adds the replacement first, then
// removes the old leader from another member (etcd elects a new one). The failure margin never
// drops below 1.
func TestLeaderWithUnreachableKubeletKeepsTheMargin(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	check := writeData(t, wc)
	state, err := sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	leaderNode := state.ByID(state.LeaderID).Name
	var victim string
	for _, m := range controlPlane(g, wc) {
		if m.Status.NodeRef.Name == leaderNode {
			victim = m.Name
		}
	}
	g.Expect(victim).NotTo(BeEmpty())
	startCAPR(t)
	watch := sb.WatchQuorum(ctx, wc)

	g.Expect(sb.StopKubelet(ctx, wc, leaderNode)).To(Succeed())
	mr := waitRemediated(t, wc, victim, 3)

	minMargin, at, _ := watch.Margin()
	_, lost := watch.Stop()
	g.Expect(lost).To(BeEmpty())
	g.Expect(minMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", minMargin, at)
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(stepOutcome(mr, caprv1.StepMoveLeader)).To(Equal(caprv1.StepOutcomeSkipped))
	for _, s := range mr.Status.Steps {
		if s.Name == caprv1.StepMoveLeader {
			g.Expect(s.Message).To(ContainSubstring("cannot be reached"))
		}
	}
	state, err = sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.ByName(leaderNode)).To(BeNil())
	g.Expect(state.LeaderID).NotTo(BeZero())
	check()
}

// TestFollowerWithUnreachableKubeletKeepsTheMargin: a follower's kubelet is down, so its member
// (still running, still voting) cannot be reached through the API server, the commonest real "node
// not Ready". The leader's metrics, read through its own port-forward, show it still receiving the
// member's raft messages, so it counts as alive: CAPR adds the replacement first and removes the
// old member after, from another member. The failure margin never drops below 1; before, the member
// counted as down and was removed first (margin 0 until the replacement voted).
func TestFollowerWithUnreachableKubeletKeepsTheMargin(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	check := writeData(t, wc)
	state, err := sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	var victim, victimNode string
	for _, m := range controlPlane(g, wc) {
		if m.Status.NodeRef.Name != state.ByID(state.LeaderID).Name {
			victim, victimNode = m.Name, m.Status.NodeRef.Name
		}
	}
	g.Expect(victim).NotTo(BeEmpty())
	startCAPR(t)
	watch := sb.WatchQuorum(ctx, wc)

	g.Expect(sb.StopKubelet(ctx, wc, victimNode)).To(Succeed())
	mr := waitRemediated(t, wc, victim, 3)

	minMargin, at, _ := watch.Margin()
	_, lost := watch.Stop()
	g.Expect(lost).To(BeEmpty())
	g.Expect(minMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", minMargin, at)
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(mr.Status.ControlPlane.OrderReason).To(ContainSubstring("is healthy"))
	state, err = sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(state.ByName(victimNode)).To(BeNil())
	check()
}

// TestFiveMembersTwoDeadAreRemediatedOneAtATime: two of five members die. Both Machines are marked
// (the quorum-safe limit for 5 is 2) and remediated one after the other; the second waits, and its
// dead member is removed by the first with the first's own (remediation/controlplane
// removeWaitingDownMembers).
func TestFiveMembersTwoDeadAreRemediatedOneAtATime(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withControlPlane(5))
	check := writeData(t, wc)
	machines := controlPlane(g, wc)
	a, b := machines[0], machines[3]
	startCAPR(t)
	watch := sb.WatchQuorum(ctx, wc)
	running := sb.WatchRunning(ctx, wc) // from the API server, not CAPR's timestamps

	sb.KillEtcdMember(wc, a.Status.NodeRef.Name)
	sb.KillEtcdMember(wc, b.Status.NodeRef.Name)

	// While one runs, the other says it waits for it; and once the running one's member is out of
	// etcd, the waiting one's dead member is out too (removed by the running one, margin 0 → 1),
	// before the waiting one starts.
	g.Eventually(func(g Gomega) {
		ma, mb := getRemediation(g, wc, a.Name), getRemediation(g, wc, b.Name)
		running, waiting := ma, mb
		if mb.Status.Phase == caprv1.MachineRemediationPhaseRunning {
			running, waiting = mb, ma
		}
		g.Expect(running.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
		g.Expect(conditions.GetReason(waiting, caprv1.MachineRemediationProgressingCondition)).To(Equal(caprv1.MachineRemediationAnotherRemediationInProgressReason))
		members := memberNames(g, wc)
		g.Expect(members).NotTo(ContainElement(a.Status.NodeRef.Name))
		g.Expect(members).NotTo(ContainElement(b.Status.NodeRef.Name))
		g.Expect(getRemediation(g, wc, waiting.Name).Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending), "the waiting request started first")
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())

	ma := waitRemediated(t, wc, a.Name, 5)
	mb := waitRemediated(t, wc, b.Name, 5)
	_, lost := watch.Stop()
	g.Expect(lost).To(BeEmpty())
	g.Expect(running.Stop()).To(BeEmpty(), "two control-plane remediations Running at once")
	first, second := ma, mb
	if mb.Status.StartTime.Before(ma.Status.StartTime) {
		first, second = mb, ma
	}
	g.Expect(first.Status.CompletionTime.Time).NotTo(BeTemporally(">", second.Status.StartTime.Time), "remediations overlapped")
	check()
}

// TestQuorumLostDoesNothing: two of three members are dead. The health check does not request
// remediation (2 > the quorum-safe limit of 1), and a request made by hand waits with a condition
// that says quorum is lost and which members are down; nothing is scaled, removed or deleted.
func TestQuorumLostDoesNothing(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	machines := controlPlane(g, wc)
	startCAPR(t)

	sb.KillEtcdMember(wc, machines[0].Status.NodeRef.Name)
	sb.KillEtcdMember(wc, machines[1].Status.NodeRef.Name)
	g.Eventually(func(g Gomega) {
		mhc := &caprv1.MachineHealthCheck{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: "cp"}, mhc)).To(Succeed())
		g.Expect(conditions.GetReason(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)).To(Equal(caprv1.MachineHealthCheckEtcdQuorumLostReason))
	}, time.Minute, 200*time.Millisecond).Should(Succeed())

	manual := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: wc.Namespace, Name: machines[0].Name},
		Spec: caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceManual, Reason: caprv1.MachineCAPRHealthCheckManualRequestReason}}
	g.Expect(sb.Client.Create(ctx, manual)).To(Succeed())
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, manual.Name)
		c := conditions.Get(mr, caprv1.MachineRemediationProgressingCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(caprv1.MachineRemediationQuorumLostReason))
		g.Expect(c.Message).To(ContainSubstring("lost quorum"))
		g.Expect(c.Message).To(ContainSubstring(machines[1].Status.NodeRef.Name))
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
	}, time.Minute, 200*time.Millisecond).Should(Succeed())
	// Longer than the remediator's requeue while it waits (waitLong, 15 s): its next look must not
	// act either (a 5 s window ended before that look).
	g.Consistently(func(g Gomega) {
		g.Expect(controlPlane(g, wc)).To(HaveLen(3))
		g.Expect(memberNames(g, wc)).To(HaveLen(3))
	}, 17*time.Second, 500*time.Millisecond).Should(Succeed())
}
