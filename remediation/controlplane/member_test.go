package controlplane

import (
	"fmt"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

func TestStepMoveLeader(t *testing.T) {
	withD := []worldOption{withReplacement(cpMachine("m-d")), withRecordedReplacement("m-d")}
	leaderWorld := func(etcd *fakeEtcd, extra ...worldOption) []worldOption {
		return append(append(append([]worldOption{}, withD...), withEtcd(etcd)), extra...)
	}
	runStepCases(t, caprv1.StepMoveLeader, []stepCase{
		{name: "victim leads: leadership moved to the replacement's member",
			world: leaderWorld(newFakeEtcd(member(nodeA), member(nodeB, asLeader()), member(nodeC), member(nodeD))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.etcd.moveLeaders).To(Equal([]moveLeaderCall{{leaderNode: nodeB, to: memberID(nodeD)}}))
				g.Expect(res.Message).To(HavePrefix(movingLeadership))
			}},
		{name: "victim leads, replacement's member is a learner: moved to another healthy voter, not a down one",
			world: leaderWorld(newFakeEtcd(member(nodeA, asDown()), member(nodeB, asLeader()), member(nodeC), member(nodeD, asLearner()))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.etcd.moveLeaders).To(Equal([]moveLeaderCall{{leaderNode: nodeB, to: memberID(nodeC)}}))
			}},
		{name: "victim does not lead: skipped, nothing sent",
			world: leaderWorld(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectSkipped(g, res, err)
				g.Expect(res.Message).To(ContainSubstring("the leader is " + nodeA))
				expectNoEtcdChange(g, w)
			}},
		{name: "victim's member is not in the member list: skipped, nothing sent",
			world: leaderWorld(newFakeEtcd(member(nodeA, asLeader()), member(nodeC), member(nodeD))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectSkipped(g, res, err)
				expectNoEtcdChange(g, w)
			}},
		{name: "victim leads but cannot be reached: skipped (removed from another member), nothing sent",
			world: leaderWorld(newFakeEtcd(member(nodeA), member(nodeB, asLeader(), asUnreachable()), member(nodeC), member(nodeD))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectSkipped(g, res, err)
				g.Expect(res.Message).To(ContainSubstring("cannot be reached"))
				expectNoEtcdChange(g, w)
			}},
		// KCP's hook would have to move leadership through the victim's node (CAPI #8465).
		{name: "victim leads but cannot be reached, its removal left to the provider's deletion: waits, nothing sent",
			world: []worldOption{withOrder(caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval),
				withEtcd(newFakeEtcd(member(nodeA), member(nodeB, asLeader(), asUnreachable()), member(nodeC)))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationEtcdUnreachableReason)
				g.Expect(res.Message).To(ContainSubstring("stopped answering"))
				expectNoEtcdChange(g, w)
			}},
		{name: "victim leads, no healthy voter to move to: wait, nothing sent",
			world: []worldOption{withEtcd(newFakeEtcd(member(nodeA, asDown()), member(nodeB, asLeader()), member(nodeC, asUnreachable())))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationNotQuorumSafeReason)
				expectNoEtcdChange(g, w)
			}},
		{name: "etcd refuses the move: error, retried",
			world: leaderWorld(&fakeEtcd{moveLeaderErr: errInjected, members: []fakeMember{member(nodeA), member(nodeB, asLeader()), member(nodeC), member(nodeD)}}),
			check: func(g Gomega, w *world, _ stepResult, err error) {
				g.Expect(err).To(MatchError(errInjected))
				g.Expect(w.etcd.moveLeaders).To(HaveLen(1))
			}},
		{name: "leadership already moved (crash after MoveLeader): done, not skipped, nothing sent",
			world: leaderWorld(newFakeEtcd(member(nodeA), member(nodeB), member(nodeC), member(nodeD, asLeader())),
				withStep(caprv1.StepMoveLeader, caprv1.StepOutcomeInProgress, movingLeadership+" from "+nodeB+" to "+nodeD)),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(res.Message).To(ContainSubstring("the leader is now " + nodeD))
				expectNoEtcdChange(g, w)
			}},
		{name: "etcd cannot be read: wait, nothing sent", world: leaderWorld(&fakeEtcd{inspectErr: errInjected}), check: func(g Gomega, w *world, res stepResult, err error) {
			expectWaiting(g, res, err, caprv1.MachineRemediationEtcdUnreachableReason)
			expectNoEtcdChange(g, w)
		}},
	})
}

func TestStepRemoveMember(t *testing.T) {
	runStepCases(t, caprv1.StepRemoveMember, []stepCase{
		{name: "after the scale-up, 4 healthy voters: the victim is removed through the other healthy voters",
			world: []worldOption{withReplacement(cpMachine("m-d")), withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD)))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.etcd.removeMembers).To(Equal([]removeMemberCall{{id: memberID(nodeB), via: []string{nodeA, nodeC, nodeD}}}))
				g.Expect(w.s.mr.Status.ControlPlane.MemberID).To(Equal(fmt.Sprintf("%x", memberID(nodeB))))
				g.Expect(w.etcd.moveLeaders).To(BeEmpty())
			}},
		{name: "victim healthy, another member down: not quorum-safe, nothing sent",
			world: []worldOption{withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC, asDown())))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationNotQuorumSafeReason)
				g.Expect(res.Message).To(ContainSubstring("victim healthy"))
				expectNoEtcdChange(g, w)
			}},
		{name: "a learner is pending promotion: not quorum-safe, nothing sent",
			world: []worldOption{withReplacement(cpMachine("m-d")), withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD, asLearner())))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationNotQuorumSafeReason)
				expectNoEtcdChange(g, w)
			}},
		{name: "quorum lost: nothing sent",
			world: []worldOption{withEtcd(newFakeEtcd(member(nodeA, asDown()), member(nodeB, asDown()), member(nodeC, asLeader())))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationNotQuorumSafeReason)
				expectNoEtcdChange(g, w)
			}},
		{name: "dead victim of five (remove first): removed through healthy voters only",
			world: []worldOption{
				withOrder(caprv1.ControlPlaneOrderRemoveMemberFirst), withReplicas(5), withMachines(cpMachine("m-a"), cpMachine("m-b"), cpMachine("m-c"), cpMachine("m-e"), cpMachine("m-f")),
				withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB, asDown()), member(nodeC), member(nodeE, asUnreachable()), member(nodeF))),
			},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.etcd.removeMembers).To(Equal([]removeMemberCall{{id: memberID(nodeB), via: []string{nodeA, nodeC, nodeF}}}))
			}},
		{name: "member already gone: done, nothing sent",
			world: []worldOption{withRecordedMemberID(memberID(nodeB)), withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeC), member(nodeD)))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				expectNoEtcdChange(g, w)
			}},
		{name: "member without its name (not started) is found by the recorded ID and removed",
			world: []worldOption{withRecordedMemberID(0x42), withEtcd(newFakeEtcd(member(nodeA, asLeader()), member("", withMemberID(0x42), asDown()), member(nodeC), member(nodeD)))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.etcd.removeMembers).To(Equal([]removeMemberCall{{id: 0x42, via: []string{nodeA, nodeC, nodeD}}}))
			}},
		{name: "etcd refuses the removal: not done, no error, retried",
			world: []worldOption{withEtcd(&fakeEtcd{removeMemberErr: errInjected, members: []fakeMember{member(nodeA, asLeader()), member(nodeB, asDown()), member(nodeC)}})},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(res.Message).To(ContainSubstring("etcd refused the removal"))
				g.Expect(res.Requeue).To(BeNumerically("<=", time.Second), "asked again within a second")
				g.Expect(w.etcd.removeMembers).To(HaveLen(1))
			}},
		{name: "etcd cannot be read: wait, nothing sent", world: []worldOption{withEtcd(&fakeEtcd{inspectErr: errInjected})}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectWaiting(g, res, err, caprv1.MachineRemediationEtcdUnreachableReason)
			expectNoEtcdChange(g, w)
		}},
	})
}

// Two of five members dead: once the running remediation's victim is out of etcd, the member of the
// other Machine whose request waits is down too and goes in the same pass (margin 0 → 1 a whole
// remediation earlier); what its own start would refuse, or a member that may still vote, stays.
func TestStepRemoveMemberRemovesWaitingDownMembers(t *testing.T) {
	five := []worldOption{withReplicas(5), withMachines(cpMachine("m-a"), cpMachine("m-b"), cpMachine("m-c"), cpMachine("m-e", markedBy(caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason)), cpMachine("m-f"))}
	fiveWith := func(etcd *fakeEtcd, extra ...worldOption) []worldOption {
		return append(append(slices.Clone(five), withEtcd(etcd)), extra...)
	}
	victimGone := func(opts ...memberOption) *fakeEtcd { // m-b's member removed, m-e's as opts say
		return newFakeEtcd(member(nodeA, asLeader()), member(nodeC), member(nodeE, opts...), member(nodeF))
	}
	runStepCases(t, caprv1.StepRemoveMember, []stepCase{
		{name: "waiting request's member unreachable: removed with the victim's, through the healthy voters",
			world: fiveWith(victimGone(asUnreachable()), withRequests(waitingRequest("m-e"))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(w.etcd.removeMembers).To(Equal([]removeMemberCall{{id: memberID(nodeE), via: []string{nodeA, nodeC, nodeF}}}))
				g.Expect(res.Message).To(ContainSubstring("removed the down members of waiting remediations too: " + nodeE))
			}},
		{name: "waiting request's member healthy: stays",
			world: fiveWith(victimGone(), withRequests(waitingRequest("m-e"))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				expectNoEtcdChange(g, w)
			}},
		{name: "no request for the Machine whose member is down: stays (the health check has not asked)",
			world: fiveWith(victimGone(asUnreachable())),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				expectNoEtcdChange(g, w)
			}},
		{name: "victim's own member still listed: only it is removed in this pass",
			world: fiveWith(newFakeEtcd(member(nodeA, asLeader()), member(nodeB, asUnreachable()), member(nodeC), member(nodeE, asUnreachable()), member(nodeF)),
				withRequests(waitingRequest("m-e"))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.etcd.removeMembers).To(Equal([]removeMemberCall{{id: memberID(nodeB), via: []string{nodeA, nodeC, nodeF}}}))
			}},
		{name: "etcd refuses the waiting member's removal: the step is done all the same, the member left to its request",
			world: fiveWith(&fakeEtcd{removeMemberErr: errInjected, members: []fakeMember{member(nodeA, asLeader()), member(nodeC), member(nodeE, asUnreachable()), member(nodeF)}},
				withRequests(waitingRequest("m-e"))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(w.etcd.removeMembers).To(HaveLen(1))
				g.Expect(res.Message).NotTo(ContainSubstring("removed the down members"))
			}},
	})
}

// A request marked after the running remediation removed its victim's member is found at the next
// pass that reads etcd: here WaitForReplacement's, the remove-first order's replacement joining.
func TestWaitingDownMemberRemovedWhileTheReplacementJoins(t *testing.T) {
	runStepCases(t, caprv1.StepWaitForReplacement, []stepCase{
		{name: "replacement voting, waiting request's member down: removed in the same pass",
			world: []worldOption{withOrder(caprv1.ControlPlaneOrderRemoveMemberFirst), withReplicas(6),
				withMachines(cpMachine("m-a"), cpMachine("m-b"), cpMachine("m-c"), cpMachine("m-e", markedBy(caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason)), cpMachine("m-f")), withReplacement(cpMachine("m-d")),
				withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeC), member(nodeD), member(nodeE, asUnreachable()), member(nodeF))),
				withRequests(waitingRequest("m-e"))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(w.etcd.removeMembers).To(Equal([]removeMemberCall{{id: memberID(nodeE), via: []string{nodeA, nodeC, nodeD, nodeF}}}))
				g.Expect(res.Message).To(ContainSubstring("removed the down members of waiting remediations too: " + nodeE))
			}},
		{name: "victim's member still listed (scale up first): nothing removed yet",
			world: []worldOption{withReplicas(6),
				withMachines(cpMachine("m-a"), cpMachine("m-b"), cpMachine("m-c"), cpMachine("m-e"), cpMachine("m-f")), withReplacement(cpMachine("m-d")),
				withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD), member(nodeE, asUnreachable()), member(nodeF))),
				withRequests(waitingRequest("m-e"))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				expectNoEtcdChange(g, w)
			}},
	})
}

// downMembersOfWaiting decides which waiting requests' members the running remediation removes:
// each exclusion is a check the request's own start makes first, or a member that may still vote.
func TestDownMembersOfWaiting(t *testing.T) {
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	recent, err := (&caprv1.RemediationRecord{Machine: "old", Timestamp: metav1.NewTime(now.Add(-time.Minute)), RetryCount: 1}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	deleting := func(mr *caprv1.MachineRemediation) {
		mr.DeletionTimestamp, mr.Finalizers = ptr.To(metav1.NewTime(now)), []string{caprv1.MachineRemediationFinalizer}
	}
	phase := func(p caprv1.RemediationPhase) func(*caprv1.MachineRemediation) {
		return func(mr *caprv1.MachineRemediation) { mr.Status.Phase = p }
	}
	paused := func(mr *caprv1.MachineRemediation) {
		mr.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	}
	retryPeriod := func(mr *caprv1.MachineRemediation) {
		mr.Spec.ControlPlane = &caprv1.ControlPlaneRemediationSpec{RetryPeriodSeconds: ptr.To[int32](600)}
	}
	maxRetry := func(mr *caprv1.MachineRemediation) {
		mr.Spec.ControlPlane = &caprv1.ControlPlaneRemediationSpec{MaxRetry: ptr.To[int32](1)}
	}
	// Five Machines; m-b's member is already out (the holder's victim); m-e's and m-f's members as
	// each case says.
	machines := func(e, f *clusterv1.Machine) []*clusterv1.Machine {
		return []*clusterv1.Machine{cpMachine("m-a"), cpMachine("m-b"), cpMachine("m-c"), e, f}
	}
	etcd := func(e, f []memberOption, extra ...fakeMember) []fakeMember {
		return append([]fakeMember{member(nodeA, asLeader()), member(nodeC), member(nodeE, e...), member(nodeF, f...)}, extra...)
	}
	down := []memberOption{asUnreachable()}
	reason := func(source caprv1.RemediationSource, reason string) func(*caprv1.MachineRemediation) {
		return func(mr *caprv1.MachineRemediation) { mr.Spec.Source, mr.Spec.Reason = source, reason }
	}
	cases := []struct {
		name     string
		members  []fakeMember
		machines []*clusterv1.Machine
		requests []*caprv1.MachineRemediation
		// mark is the reason of CAPR's health check's mark on every Machine; UnhealthyEtcdMember
		// when empty, none when "-".
		mark string
		want []string // requests whose member is removed, in order
	}{
		// The removal cannot be undone: it rests on CAPR's own mark, not on what a request says.
		{name: "request saying UnhealthyEtcdMember, its Machine not marked (a reason written by hand or by a template)", members: etcd(down, nil),
			machines: machines(cpMachine("m-e"), cpMachine("m-f")), requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}, mark: "-"},
		{name: "request saying UnhealthyEtcdMember, its Machine marked for its Node only", members: etcd(down, nil),
			machines: machines(cpMachine("m-e"), cpMachine("m-f")), requests: []*caprv1.MachineRemediation{waitingRequest("m-e")},
			mark: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason},
		{name: "unreachable member of a Pending request", members: etcd(down, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}, want: []string{"m-e"}},
		{name: "reachable member that is down (no leader) of a request not yet given a phase", members: etcd([]memberOption{asDown()}, nil),
			machines: machines(cpMachine("m-e"), cpMachine("m-f")), requests: []*caprv1.MachineRemediation{waitingRequest("m-e", phase(""))}, want: []string{"m-e"}},
		{name: "six Machines, the holder's member gone, two waiting ones down: both go, by name (5 → 3 voters, 3 healthy)", members: etcd(down, down, member(nodeD)),
			machines: append(machines(cpMachine("m-e"), cpMachine("m-f")), cpMachine("m-d")), requests: []*caprv1.MachineRemediation{waitingRequest("m-f"), waitingRequest("m-e")}, want: []string{"m-e", "m-f"}},
		{name: "the holder itself is never a waiting request", members: etcd(down, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-b"), waitingRequest("m-e")}, want: []string{"m-e"}},
		{name: "request from Node conditions (its Node may recover and the request be withdrawn)", members: etcd(down, nil),
			machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e", reason(caprv1.MachineRemediationSourceHealthCheck, caprv1.MachineCAPRHealthCheckUnhealthyNodeReason))}},
		{name: "request of CAPI's MachineHealthCheck", members: etcd(down, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e", reason(caprv1.MachineRemediationSourceCAPIMachineHealthCheck, ""))}},
		{name: "request made by hand", members: etcd(down, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e", reason(caprv1.MachineRemediationSourceManual, caprv1.MachineCAPRHealthCheckManualRequestReason))}},
		{name: "healthy member", members: etcd(nil, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "learner", members: etcd([]memberOption{asLearner(), asUnreachable()}, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "the leader, though unreachable", members: []fakeMember{member(nodeA), member(nodeC), member(nodeE, asLeader(), asUnreachable()), member(nodeF)},
			machines: machines(cpMachine("m-e"), cpMachine("m-f")), requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "member not in the list", members: []fakeMember{member(nodeA, asLeader()), member(nodeC), member(nodeF)},
			machines: machines(cpMachine("m-e"), cpMachine("m-f")), requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "request Running (it removes its own)", members: etcd(down, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e", phase(caprv1.MachineRemediationPhaseRunning))}},
		{name: "request finished", members: etcd(down, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e", phase(caprv1.MachineRemediationPhaseFailed))}},
		{name: "request being deleted", members: etcd(down, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e", deleting)}},
		{name: "request paused", members: etcd(down, nil), machines: machines(cpMachine("m-e"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e", paused)}},
		{name: "Machine paused", members: etcd(down, nil), machines: machines(cpMachine("m-e", withMachineAnnotation(clusterv1.PausedAnnotation, "")), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "Machine skips remediation", members: etcd(down, nil),
			machines: machines(cpMachine("m-e", withMachineAnnotation(clusterv1.MachineSkipRemediationAnnotation, "")), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "Machine being deleted", members: etcd(down, nil), machines: machines(cpMachine("m-e", beingDeleted()), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "Machine without a Node", members: etcd(down, nil), machines: machines(cpMachine("m-e", withoutNode()), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "request of a Machine of another cluster (not among the Machines)", members: etcd(down, nil), machines: machines(cpMachine("m-x"), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "request waiting for its retry period", members: etcd(down, nil),
			machines: machines(cpMachine("m-e", withMachineAnnotation(caprv1.RemediationRecordAnnotation, recent)), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e", retryPeriod)}},
		{name: "request that would give up (maxRetry reached)", members: etcd(down, nil),
			machines: machines(cpMachine("m-e", withMachineAnnotation(caprv1.RemediationRecordAnnotation, recent)), cpMachine("m-f")),
			requests: []*caprv1.MachineRemediation{waitingRequest("m-e", maxRetry)}},
		{name: "a learner pending promotion: no membership change", members: etcd(down, nil, member(nodeD, asLearner())),
			machines: machines(cpMachine("m-e"), cpMachine("m-f")), requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
		{name: "quorum lost (2 of 4 healthy): no membership change",
			members:  []fakeMember{member(nodeA, asLeader()), member(nodeC, asUnreachable()), member(nodeE, asUnreachable()), member(nodeF)},
			machines: machines(cpMachine("m-e"), cpMachine("m-f")), requests: []*caprv1.MachineRemediation{waitingRequest("m-e")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			state, err := newFakeEtcd(tc.members...).Inspect(t.Context(), nil)
			g.Expect(err).NotTo(HaveOccurred())
			requests := make([]caprv1.MachineRemediation, 0, len(tc.requests))
			for _, r := range tc.requests {
				requests = append(requests, *r)
			}
			markAll(tc.mark, tc.machines)
			var got []string
			for _, w := range downMembersOfWaiting(state, "m-b", requests, tc.machines, now) {
				g.Expect(w.member.Name).To(Equal(nodeOf(w.request.Name)))
				got = append(got, w.request.Name)
			}
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// reusedNameWorld is a DeleteBeforeMemberRemoval remediation of m-b after its Delete step, with CAPR
// down meanwhile: the provider deleted m-b (its deletion removed m-b's member, or not, as etcd says)
// and created the replacement m-d on the same host, whose Node, and so its etcd member, is named
// after m-b's (bare metal keeps host names). m-b's member ID was recorded at the start.
func reusedNameWorld(t *testing.T, g Gomega, etcd *fakeEtcd) *world {
	t.Helper()
	w := newWorld(t, withOrder(caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval), withRecordedMemberID(memberID(nodeB)),
		withReplacement(cpMachine("m-d", func(m *clusterv1.Machine) { m.Status.NodeRef.Name = nodeB })),
		withStep(caprv1.StepMoveLeader, caprv1.StepOutcomeSkipped, ""),
		withStep(caprv1.StepFence, caprv1.StepOutcomeSkipped, ""),
		withStep(caprv1.StepDelete, caprv1.StepOutcomeSucceeded, ""),
		withEtcd(etcd))
	setLock(g, w)
	w.deleteVictim(g)
	w.s.machineGone = true
	w.s.machines = slices.DeleteFunc(w.s.machines, func(m *clusterv1.Machine) bool { return m.Name == "m-b" })
	return w
}

// TestRemoveMemberAfterTheDeleteIgnoresAReusedNodeName: after the point of no return the victim's
// member is the one whose ID was recorded at the start, never the one that carries its name now: a
// replacement that reused the victim's Node name keeps its member, and the recorded ID stays.
func TestRemoveMemberAfterTheDeleteIgnoresAReusedNodeName(t *testing.T) {
	const replacementID = 0xbeef
	t.Run("the provider removed the victim's member: nothing is removed", func(t *testing.T) {
		g := NewWithT(t)
		w := reusedNameWorld(t, g, newFakeEtcd(member(nodeA, asLeader()), member(nodeC), member(nodeB, withMemberID(replacementID))))
		_, err := w.r.runSteps(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.etcd.removeMembers).To(BeEmpty(), "the replacement's member was removed")
		g.Expect(w.s.mr.Status.ControlPlane.MemberID).To(Equal(fmt.Sprintf("%x", memberID(nodeB))), "the recorded member ID was overwritten")
		g.Expect(findStep(w.s.mr, caprv1.StepRemoveMember)).To(And(
			HaveField("Outcome", caprv1.StepOutcomeSucceeded), HaveField("Message", ContainSubstring("not in the member list"))))
	})
	t.Run("the victim's member is still listed beside the replacement's: only it is removed", func(t *testing.T) {
		g := NewWithT(t)
		w := reusedNameWorld(t, g, newFakeEtcd(member(nodeA, asLeader()), member(nodeB, withMemberID(replacementID)), member(nodeC),
			member(nodeB, asUnreachable())))
		_, err := w.r.runSteps(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.etcd.removeMembers).To(Equal([]removeMemberCall{{id: memberID(nodeB), via: []string{nodeA, nodeB, nodeC}}}))
		g.Expect(w.s.mr.Status.ControlPlane.MemberID).To(Equal(fmt.Sprintf("%x", memberID(nodeB))))
	})
	t.Run("no member ID was recorded: nothing is chosen by name once the victim's deletion began", func(t *testing.T) {
		g := NewWithT(t)
		w := reusedNameWorld(t, g, newFakeEtcd(member(nodeA, asLeader()), member(nodeC), member(nodeB, withMemberID(replacementID))))
		w.s.mr.Status.ControlPlane.MemberID = ""
		_, err := w.r.runSteps(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.etcd.removeMembers).To(BeEmpty(), "the replacement's member was removed")
		g.Expect(w.s.mr.Status.ControlPlane.MemberID).To(BeEmpty())
	})
}

// TestDownMarkedMembers: the members a DeleteBeforeMemberRemoval removes so that the provider may
// remove its victim's rest on CAPR's own mark, with or without a request, and on etcd: down voters
// only, never the leader or a learner, never the victim's, each while quorum-safe.
func TestDownMarkedMembers(t *testing.T) {
	down := []memberOption{asUnreachable()}
	machines := func(e *clusterv1.Machine) []*clusterv1.Machine {
		return []*clusterv1.Machine{cpMachine("m-a"), cpMachine("m-b"), cpMachine("m-c"), e, cpMachine("m-f")}
	}
	cases := []struct {
		name     string
		members  []fakeMember
		machines []*clusterv1.Machine
		mark     string // CAPR's mark on every Machine: UnhealthyEtcdMember when empty, none when "-"
		want     []string
	}{
		{name: "down member of a marked Machine without a request",
			members:  []fakeMember{member(nodeA, asLeader()), member(nodeB), member(nodeE, down...)},
			machines: machines(cpMachine("m-e")), want: []string{"m-e"}},
		{name: "not marked", members: []fakeMember{member(nodeA, asLeader()), member(nodeB), member(nodeE, down...)},
			machines: machines(cpMachine("m-e")), mark: "-"},
		{name: "marked for its Node only", members: []fakeMember{member(nodeA, asLeader()), member(nodeB), member(nodeE, down...)},
			machines: machines(cpMachine("m-e")), mark: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason},
		{name: "the victim's own", members: []fakeMember{member(nodeA, asLeader()), member(nodeB, down...), member(nodeE)},
			machines: machines(cpMachine("m-e"))},
		{name: "healthy", members: []fakeMember{member(nodeA, asLeader()), member(nodeB), member(nodeE)}, machines: machines(cpMachine("m-e"))},
		{name: "the leader, though unreachable", members: []fakeMember{member(nodeA), member(nodeB), member(nodeE, asLeader(), asUnreachable())},
			machines: machines(cpMachine("m-e"))},
		{name: "Machine being deleted", members: []fakeMember{member(nodeA, asLeader()), member(nodeB), member(nodeE, down...)},
			machines: machines(cpMachine("m-e", beingDeleted()))},
		{name: "Machine skips remediation", members: []fakeMember{member(nodeA, asLeader()), member(nodeB), member(nodeE, down...)},
			machines: machines(cpMachine("m-e", withMachineAnnotation(clusterv1.MachineSkipRemediationAnnotation, "")))},
		{name: "a learner pending promotion: no membership change",
			members:  []fakeMember{member(nodeA, asLeader()), member(nodeB), member(nodeE, down...), member(nodeD, asLearner())},
			machines: machines(cpMachine("m-e"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			state, err := newFakeEtcd(tc.members...).Inspect(t.Context(), nil)
			g.Expect(err).NotTo(HaveOccurred())
			markAll(tc.mark, tc.machines)
			var got []string
			for _, w := range downMarkedMembers(state, "m-b", tc.machines) {
				g.Expect(w.request).To(BeNil())
				g.Expect(w.member.Name).To(Equal(nodeOf(w.machine.Name)))
				got = append(got, w.machine.Name)
			}
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// markAll gives every Machine CAPR's health check's mark with reason mark: UnhealthyEtcdMember when
// empty, none when "-".
func markAll(mark string, machines []*clusterv1.Machine) {
	if mark == "" {
		mark = caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason
	}
	if mark == "-" {
		return
	}
	for _, m := range machines {
		markedBy(mark)(m)
	}
}
