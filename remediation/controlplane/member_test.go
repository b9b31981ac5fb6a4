package controlplane

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"

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
				g.Expect(w.etcd.removeMembers).To(HaveLen(1))
			}},
		{name: "etcd cannot be read: wait, nothing sent", world: []worldOption{withEtcd(&fakeEtcd{inspectErr: errInjected})}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectWaiting(g, res, err, caprv1.MachineRemediationEtcdUnreachableReason)
			expectNoEtcdChange(g, w)
		}},
	})
}
