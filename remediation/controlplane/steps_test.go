package controlplane

import (
	"fmt"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

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
	g.Expect(res.done).To(BeFalse(), "message: %s", res.message)
	g.Expect(res.waitReason).To(BeEmpty(), "message: %s", res.message)
}

// expectWaiting: the step cannot proceed, for reason.
func expectWaiting(g Gomega, res stepResult, err error, reason string) {
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.done).To(BeFalse(), "message: %s", res.message)
	g.Expect(res.waitReason).To(Equal(reason), "message: %s", res.message)
}

// expectDone: the step's effect is visible.
func expectDone(g Gomega, res stepResult, err error) {
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.done).To(BeTrue(), "message: %s", res.message)
	g.Expect(res.skipped).To(BeFalse(), "message: %s", res.message)
}

// expectSkipped: the step is not needed.
func expectSkipped(g Gomega, res stepResult, err error) {
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.done).To(BeTrue(), "message: %s", res.message)
	g.Expect(res.skipped).To(BeTrue(), "message: %s", res.message)
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

func TestStepScaleUp(t *testing.T) {
	runStepCases(t, caprv1.StepScaleUp, []stepCase{
		{name: "3 healthy voters: replicas raised to 4, etcd reached through the victim's node last", check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(res.message).To(ContainSubstring("raised replicas to 4"))
			g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
			g.Expect(w.etcd.inspected).To(HaveLen(1))
			g.Expect(w.etcd.inspected[0]).To(Equal([]string{nodeA, nodeC, nodeB}))
			expectNoEtcdChange(g, w)
		}},
		{name: "replicas already raised (crash after the patch): done, not raised again, etcd not read", world: []worldOption{withReplicas(4)}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectDone(g, res, err)
			g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
			g.Expect(w.etcd.inspected).To(BeEmpty())
		}},
		{name: "replacement already created: done, replicas untouched", world: []worldOption{withReplacement(cpMachine("m-d"))}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectDone(g, res, err)
			g.Expect(res.message).To(ContainSubstring("replacement Machine m-d"))
			g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		}},
		{name: "a replacement being deleted does not count: replicas raised", world: []worldOption{withReplacement(cpMachine("m-d", beingDeleted()))}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
		}},
		{name: "another member down: a new voter is not quorum-safe, replicas untouched",
			world: []worldOption{withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC, asDown())))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationNotQuorumSafeReason)
				g.Expect(res.message).To(ContainSubstring("2/3 healthy"))
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
			}},
		{name: "quorum lost: replicas untouched",
			world: []worldOption{withEtcd(newFakeEtcd(member(nodeA, asDown()), member(nodeB), member(nodeC, asUnreachable())))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationNotQuorumSafeReason)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
			}},
		{name: "remove first: once the victim's member is gone, 2 of 2 healthy may add a voter",
			world: []worldOption{withOrder(caprv1.ControlPlaneOrderRemoveMemberFirst), withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeC)))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
			}},
		{name: "etcd cannot be read: wait, replicas untouched", world: []worldOption{withEtcd(&fakeEtcd{inspectErr: errInjected})}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectWaiting(g, res, err, caprv1.MachineRemediationEtcdUnreachableReason)
			g.Expect(res.message).To(ContainSubstring(errInjected.Error()))
			g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		}},
		{name: "workload cluster cannot be reached: wait, replicas untouched", world: []worldOption{withEtcdProviderError(errInjected)}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectWaiting(g, res, err, caprv1.MachineRemediationEtcdUnreachableReason)
			g.Expect(w.provider.calls).To(Equal(1))
			g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		}},
		{name: "KCP would refuse (certificates not available): wait, replicas untouched",
			world: []worldOption{withControlPlaneObject(kcpObject(withoutCertificates()))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationNotQuorumSafeReason)
				g.Expect(res.message).To(ContainSubstring("CertificatesAvailable"))
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
				g.Expect(w.controlPlaneAnnotations(g)).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
			}},
		{name: "KCP: remediation-in-progress is written with the raised replicas",
			world: []worldOption{
				withControlPlaneObject(kcpObject()),
				withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b", kcpHealthy()), cpMachine("m-c", kcpHealthy())),
			},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
				g.Expect(w.controlPlaneAnnotations(g)).To(HaveKeyWithValue(controlplanev1.RemediationInProgressAnnotation, ContainSubstring(`"machine":"m-b"`)))
			}},
		{name: "KCP with stacked etcd (surge 2): replicas raised to 5, never to an even number",
			world: []worldOption{
				withControlPlaneObject(kcpObject()), withSurgeOfTwo(),
				withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b", kcpHealthy()), cpMachine("m-c", kcpHealthy())),
			},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(5))
			}},
	})
}

// TestStepWaitForReplacementSurge: with a surge of two, the step re-arms the provider for the second
// Machine once the first votes (KCP removed its annotation when it created the first), stamped no
// earlier than the first's creation, and is done only when both vote.
// TestStepScaleUpDecidesAgainOnAConflict: the control-plane object written meanwhile (a provider's
// status, a GitOps tool stripping the lock every 100 ms in TestLostLockNeverAllowsTwoRunning) makes
// the replicas write conflict; it is decided again at once from a live read, not at the next pass
// (which the next write may conflict with again, for ever). Replicas someone else changed before the
// surge are not raised: the step waits and says so.
func TestStepScaleUpDecidesAgainOnAConflict(t *testing.T) {
	t.Run("written meanwhile, replicas unchanged: raised in the same pass", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t)
		other := w.s.cp.DeepCopy()
		other.SetLabels(map[string]string{"written-by": "provider"})
		g.Expect(w.client.Update(t.Context(), other)).To(Succeed())
		res, err := w.run(caprv1.StepScaleUp)
		expectIssued(g, res, err)
		g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
	})
	t.Run("replicas changed by someone else before the surge: not raised, waits", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t)
		other := w.s.cp.DeepCopy()
		g.Expect(SetReplicas(other, 2)).To(Succeed())
		g.Expect(w.client.Update(t.Context(), other)).To(Succeed())
		res, err := w.run(caprv1.StepScaleUp)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.waitReason).To(Equal(caprv1.MachineRemediationWaitingForPreconditionsReason))
		g.Expect(res.message).To(ContainSubstring("replicas are 2, changed by someone else"))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(2))
	})
}

func TestStepWaitForReplacementSurge(t *testing.T) {
	kcpWorld := func(extra ...worldOption) []worldOption {
		return append([]worldOption{withControlPlaneObject(kcpObject()), withSurgeOfTwo(), withReplicas(5),
			withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b"), cpMachine("m-c", kcpHealthy()))}, extra...)
	}
	four := withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD)))
	five := withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD), member(nodeE)))
	runStepCases(t, caprv1.StepWaitForReplacement, []stepCase{
		{name: "first replacement votes: remediation-in-progress set again, waits for the second",
			world: kcpWorld(withReplacement(cpMachine("m-d")), four),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(res.message).To(ContainSubstring("replacement 2 of 2"))
				g.Expect(w.controlPlaneAnnotations(g)).To(HaveKeyWithValue(controlplanev1.RemediationInProgressAnnotation, ContainSubstring(`"machine":"m-b"`)))
				g.Expect(w.replicas(g)).To(BeEquivalentTo(5))
			}},
		{name: "first replacement still a learner: not re-armed yet",
			world: kcpWorld(withReplacement(cpMachine("m-d")), withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD, asLearner())))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.controlPlaneAnnotations(g)).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
			}},
		{name: "two members down: adding the second is not quorum-safe, not re-armed",
			world: kcpWorld(withReplacement(cpMachine("m-d")), withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB, asDown()), member(nodeC, asDown()), member(nodeD)))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationNotQuorumSafeReason)
				g.Expect(w.controlPlaneAnnotations(g)).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
			}},
		{name: "both replacements vote: done",
			world: kcpWorld(withReplacement(cpMachine("m-d")), withReplacement(cpMachine("m-e")), five),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(w.s.mr.Status.ControlPlane.Replacement).To(Equal("m-d"))
			}},
	})
}

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

func TestStepWaitForReplacement(t *testing.T) {
	fourMembers := func(d ...memberOption) worldOption {
		return withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD, d...)))
	}
	olderRecord, err := (&caprv1.RemediationRecord{Machine: "older", RetryCount: 2}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	runStepCases(t, caprv1.StepWaitForReplacement, []stepCase{
		{name: "no replacement yet: waits for the provider", world: []worldOption{withReplicas(4)}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(res.message).To(ContainSubstring("to create the replacement"))
			g.Expect(w.s.mr.Status.ControlPlane.Replacement).To(BeEmpty())
		}},
		{name: "a Machine being deleted is not the replacement", world: []worldOption{withReplacement(cpMachine("m-d", beingDeleted()))}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(w.s.mr.Status.ControlPlane.Replacement).To(BeEmpty())
		}},
		{name: "replacement without a Node: recorded and annotated with the remediation record, etcd only read",
			world: []worldOption{withReplacement(cpMachine("m-d", withoutNode()))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(res.message).To(ContainSubstring("m-d to get a Node"))
				g.Expect(w.s.mr.Status.ControlPlane.Replacement).To(Equal("m-d"))
				rec, err := caprv1.RemediationRecordFromAnnotation(w.machine(g, "m-d").Annotations[caprv1.RemediationRecordAnnotation])
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(rec.Machine).To(Equal("m-b"))
				g.Expect(w.etcd.inspected).To(HaveLen(1), "read once, to see whether the replacement can still join (joinBlocked)")
				expectNoEtcdChange(g, w)
			}},
		{name: "an existing remediation record on the replacement is kept",
			world: []worldOption{withReplacement(cpMachine("m-d", withoutNode(), withMachineAnnotation(caprv1.RemediationRecordAnnotation, olderRecord)))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.machine(g, "m-d").Annotations).To(HaveKeyWithValue(caprv1.RemediationRecordAnnotation, olderRecord))
			}},
		{name: "replacement's member has not joined", world: []worldOption{withReplacement(cpMachine("m-d"))}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(res.message).To(ContainSubstring("to join"))
		}},
		{name: "replacement's member is a learner: waits for its promotion", world: []worldOption{withReplacement(cpMachine("m-d")), fourMembers(asLearner())}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(res.message).To(ContainSubstring("learner"))
		}},
		{name: "replacement's member is unhealthy", world: []worldOption{withReplacement(cpMachine("m-d")), fourMembers(asDown())}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(res.message).To(ContainSubstring("unhealthy"))
		}},
		{name: "replacement has a healthy voting member: done", world: []worldOption{withReplacement(cpMachine("m-d")), fourMembers()}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectDone(g, res, err)
			g.Expect(w.s.mr.Status.ControlPlane.Replacement).To(Equal("m-d"))
			expectNoEtcdChange(g, w)
		}},
		{name: "etcd cannot be read: wait", world: []worldOption{withReplacement(cpMachine("m-d")), withEtcd(&fakeEtcd{inspectErr: errInjected})}, check: func(g Gomega, _ *world, res stepResult, err error) {
			expectWaiting(g, res, err, caprv1.MachineRemediationEtcdUnreachableReason)
		}},
	})
}

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
				g.Expect(res.message).To(HavePrefix(movingLeadership))
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
				g.Expect(res.message).To(ContainSubstring("the leader is " + nodeA))
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
				g.Expect(res.message).To(ContainSubstring("cannot be reached"))
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
				g.Expect(res.message).To(ContainSubstring("the leader is now " + nodeD))
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
				g.Expect(res.message).To(ContainSubstring("victim healthy"))
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
				g.Expect(res.message).To(ContainSubstring("etcd refused the removal"))
				g.Expect(w.etcd.removeMembers).To(HaveLen(1))
			}},
		{name: "etcd cannot be read: wait, nothing sent", world: []worldOption{withEtcd(&fakeEtcd{inspectErr: errInjected})}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectWaiting(g, res, err, caprv1.MachineRemediationEtcdUnreachableReason)
			expectNoEtcdChange(g, w)
		}},
	})
}

func TestStepFence(t *testing.T) {
	runStepCases(t, caprv1.StepFence, []stepCase{
		{name: "fenced: done, the request names the victim's Node and the step's start",
			world: []worldOption{withStep(caprv1.StepFence, caprv1.StepOutcomeInProgress, "")},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(w.fencer.requests).To(HaveLen(1))
				req := w.fencer.requests[0]
				g.Expect(req.Node).To(Equal(nodeB))
				g.Expect(req.Machine.Name).To(Equal("m-b"))
				g.Expect(req.Started).To(Equal(findStep(w.s.mr, caprv1.StepFence).StartTime.Time))
			}},
		{name: "fencing not configured: skipped", world: []worldOption{withFence(fencing.Result{Outcome: fencing.Skipped}, nil)}, check: func(g Gomega, _ *world, res stepResult, err error) {
			expectSkipped(g, res, err)
		}},
		{name: "the policy gave up: done (not skipped), as the policy allows", world: []worldOption{withFence(fencing.Result{Outcome: fencing.GaveUp, Message: "gave up"}, nil)}, check: func(g Gomega, _ *world, res stepResult, err error) {
			expectDone(g, res, err)
			g.Expect(res.message).To(Equal("gave up"))
		}},
		{name: "fencing in progress: wait", world: []worldOption{withFence(fencing.Result{Outcome: fencing.Waiting, Message: "waiting for the backend"}, nil)}, check: func(g Gomega, _ *world, res stepResult, err error) {
			expectWaiting(g, res, err, caprv1.MachineRemediationWaitingForFencingReason)
		}},
		{name: "Required, not confirmed past the fencing timeout: waits, saying it timed out", world: []worldOption{withFence(fencing.Result{Outcome: fencing.Waiting, Message: "not confirmed"}, nil)},
			before: func(w *world) {
				w.s.mr.Spec.Fencing = &caprv1.FencingSpec{Policy: caprv1.FencingRequired, TimeoutSeconds: ptr.To[int32](60)}
				w.s.mr.Status.Steps = append(w.s.mr.Status.Steps, caprv1.RemediationStep{Name: caprv1.StepFence, Outcome: caprv1.StepOutcomeInProgress,
					StartTime: ptr.To(metav1.NewTime(time.Now().Add(-2 * time.Minute)))})
			},
			check: func(g Gomega, _ *world, res stepResult, err error) {
				expectWaiting(g, res, err, caprv1.MachineRemediationStepTimedOutReason)
				g.Expect(res.message).To(ContainSubstring("not confirmed within 1m0s"))
			}},
		{name: "fencer error: error, retried", world: []worldOption{withFence(fencing.Result{}, errInjected)}, check: func(g Gomega, _ *world, res stepResult, err error) {
			g.Expect(err).To(MatchError(errInjected))
			g.Expect(res.done).To(BeFalse())
		}},
	})
}

func TestStepDelete(t *testing.T) {
	// After a scale-up-first remediation: replicas 4, the replacement exists.
	scaledUp := []worldOption{withReplicas(4), withReplacement(cpMachine("m-d"))}
	with := func(extra ...worldOption) []worldOption {
		return append(append([]worldOption{}, scaledUp...), extra...)
	}
	expectUntouched := func(g Gomega, w *world) {
		m := w.machine(g, "m-b")
		g.Expect(m).NotTo(BeNil())
		g.Expect(m.DeletionTimestamp.IsZero()).To(BeTrue())
		g.Expect(m.Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
	}
	runStepCases(t, caprv1.StepDelete, []stepCase{
		{name: "Fence not recorded: refused, Machine untouched", world: with(), check: func(g Gomega, w *world, _ stepResult, err error) {
			g.Expect(err).To(MatchError(ContainSubstring("the Fence step has not finished")))
			expectUntouched(g, w)
		}},
		{name: "Fence in progress: refused, Machine untouched", world: with(withStep(caprv1.StepFence, caprv1.StepOutcomeInProgress, "")), check: func(g Gomega, w *world, _ stepResult, err error) {
			g.Expect(err).To(MatchError(ContainSubstring("refusing to delete")))
			expectUntouched(g, w)
		}},
		{name: "Fence failed: refused, Machine untouched", world: with(withStep(caprv1.StepFence, caprv1.StepOutcomeFailed, "")), check: func(g Gomega, w *world, _ stepResult, err error) {
			g.Expect(err).To(MatchError(ContainSubstring("refusing to delete")))
			expectUntouched(g, w)
		}},
		// Deleted directly, not left to the provider's scale-down, which picks from its caches and may
		// not see the annotation yet when it sees the new replicas.
		{name: "fenced: the victim is deleted and replicas back to 3; nothing else is touched",
			world: []worldOption{withMachines(cpMachine("m-a"), cpMachine("m-b", withFinalizer()), cpMachine("m-c")), withReplicas(4),
				withReplacement(cpMachine("m-d")), withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, "")},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				m := w.machine(g, "m-b")
				g.Expect(m.DeletionTimestamp.IsZero()).To(BeFalse(), "the victim is being deleted")
				g.Expect(m.Annotations).To(HaveKey(clusterv1.DeleteMachineAnnotation), "the provider's first choice, should it scale down first")
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
				for _, other := range []string{"m-a", "m-c", "m-d"} {
					o := w.machine(g, other)
					g.Expect(o.DeletionTimestamp.IsZero()).To(BeTrue(), other)
					g.Expect(o.Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation), other)
				}
			}},
		{name: "fencing skipped: proceeds the same way",
			world: with(withStep(caprv1.StepFence, caprv1.StepOutcomeSkipped, "")),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.machine(g, "m-b")).To(BeNil())
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
			}},
		{name: "not initialized (replace): the Machine is deleted, replicas untouched",
			world: []worldOption{withOrder(caprv1.ControlPlaneOrderReplace), withStep(caprv1.StepFence, caprv1.StepOutcomeSkipped, "")},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.machine(g, "m-b")).To(BeNil())
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
			}},
		// Deleted by someone else (a rollout, a person) while the surge is still there: the surge must
		// go too, or the provider would replace the victim and stay at 4.
		{name: "Machine being deleted: replicas back, waits",
			world: []worldOption{withReplicas(4), withMachines(cpMachine("m-a"), cpMachine("m-b", beingDeleted()), cpMachine("m-c")), withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, "")},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(res.message).To(ContainSubstring("is being deleted"))
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
			}},
	})

	t.Run("Machine gone after a surge of two, the provider still at 4: waits for the second scale-down", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withSurgeOfTwo(), withReplicas(3), withReplacement(cpMachine("m-d")), withReplacement(cpMachine("m-e")),
			withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))
		w.deleteVictim(g)
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(res.message).To(ContainSubstring("scale to 3 Machines (4, 0 deleting)"))
	})

	// A second Machine failed after the point of no return: KCP will not scale down to 3 while it is
	// unhealthy, and the next remediation starts only once KCP is back at its replicas.
	t.Run("surge of two: the surplus replacement is marked for the provider's second scale-down, not an old Machine", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withSurgeOfTwo(), withReplicas(5),
			withMachines(cpMachine("m-a"), cpMachine("m-b", withFinalizer()), cpMachine("m-c")),
			withReplacement(cpMachine("m-d")), withReplacement(cpMachine("m-e")),
			withRecordedReplacement("m-d"), withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(w.machine(g, "m-b").DeletionTimestamp.IsZero()).To(BeFalse(), "the victim is being deleted")
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		g.Expect(w.machine(g, "m-e").Annotations).To(HaveKey(clusterv1.DeleteMachineAnnotation))
		for _, kept := range []string{"m-a", "m-c", "m-d"} {
			g.Expect(w.machine(g, kept).Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation), kept)
		}
	})

	// After a surge of two on KCP, the victim m-b gone; m-c healthy or not.
	surgedKCPVictimGone := func(t *testing.T, g Gomega, mc *clusterv1.Machine) *world {
		w := newWorld(t, withControlPlaneObject(kcpObject()), withSurgeOfTwo(), withReplicas(3),
			withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b"), mc),
			withReplacement(cpMachine("m-d", kcpHealthy())), withReplacement(cpMachine("m-e", kcpHealthy())),
			withRecordedReplacement("m-d"), withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))
		w.deleteVictim(g)
		w.s.machines = slices.DeleteFunc(w.s.machines, func(m *clusterv1.Machine) bool { return m.Name == "m-b" })
		return w
	}
	t.Run("Machine gone after a surge of two, KCP refuses to scale down: the surplus replacement is deleted", func(t *testing.T) {
		g := NewWithT(t)
		w := surgedKCPVictimGone(t, g, cpMachine("m-c"))
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(res.message).To(ContainSubstring("surplus replacement m-e marked"))
		g.Expect(w.machine(g, "m-e").Annotations).To(HaveKey(clusterv1.DeleteMachineAnnotation), "KCP's own choice first")
		w.s.machines = slices.DeleteFunc(w.s.machines, func(m *clusterv1.Machine) bool { return m.Name == "m-e" })
		w.s.machines = append(w.s.machines, w.machine(g, "m-e"))
		res, err = w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(res.message).To(ContainSubstring("deleted the surplus replacement m-e"))
		g.Expect(w.machine(g, "m-e")).To(BeNil())
		for _, kept := range []string{"m-a", "m-c", "m-d"} {
			g.Expect(w.machine(g, kept)).NotTo(BeNil(), kept)
		}
	})

	t.Run("Machine gone after a surge of two, KCP would scale down: left to KCP", func(t *testing.T) {
		g := NewWithT(t)
		w := surgedKCPVictimGone(t, g, cpMachine("m-c", kcpHealthy()))
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(res.message).To(ContainSubstring("scale to 3 Machines (4, 0 deleting)"))
		g.Expect(w.machine(g, "m-e")).NotTo(BeNil())
	})

	t.Run("Machine gone (deleted by someone else) with the provider still at 4: replicas back to 3", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, with(withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))...)
		w.deleteVictim(g)
		_, err := w.run(caprv1.StepDelete)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
	})

	// Issue 30: the replicas are someone else's once they changed them (a person, GitOps, an
	// autoscaler on the scale subresource); CAPR neither overwrites nor undoes that.
	t.Run("replicas changed by someone else during the remediation: left as they are, said", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withReplicas(7), withReplacement(cpMachine("m-d")), withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(w.machine(g, "m-b")).To(BeNil(), "the victim is deleted")
		g.Expect(w.replicas(g)).To(BeEquivalentTo(7))
		g.Expect(res.message).To(ContainSubstring("replicas are 7, changed by someone else during the remediation (it set 4, from 3)"))
		res, err = w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(w.replicas(g)).To(BeEquivalentTo(7))
		g.Expect(res.message).To(ContainSubstring("scale to 7 Machines"), "the provider scales to their replicas")
	})

	t.Run("replicas changed after the decision was read: the write conflicts, theirs stays", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, with(withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))...)
		theirs := w.s.cp.DeepCopy()
		g.Expect(SetReplicas(theirs, 5)).To(Succeed())
		g.Expect(w.client.Update(t.Context(), theirs)).To(Succeed()) // w.s.cp is now older than the API's
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(w.replicas(g)).To(BeEquivalentTo(5))
		g.Expect(res.message).To(ContainSubstring("replicas are 5, changed by someone else"))
	})

	// The provider writing the object meanwhile (its status) must not delay the replicas going back:
	// with the victim gone and the surge still asked for, it would create a Machine too many (the
	// crash-safety scenario saw two new Machines and an old one scaled down).
	t.Run("the object written meanwhile, replicas untouched: back to 3 in the same pass", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, with(withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))...)
		other := w.s.cp.DeepCopy()
		other.SetLabels(map[string]string{"written-by": "provider"})
		g.Expect(w.client.Update(t.Context(), other)).To(Succeed())
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
	})

	t.Run("Machine gone: done", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, with(withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))...)
		w.deleteVictim(g)
		res, err := w.run(caprv1.StepDelete)
		expectDone(g, res, err)
	})
}

// TestReleaseLockClearsOurProviderAnnotation: releasing the lock also removes KCP's
// remediation-in-progress when it names this remediation's victim (e.g. re-armed for a Machine KCP had
// already created), never when it names another Machine.
func TestReleaseLockClearsOurProviderAnnotation(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		kept        bool
	}{
		{"ours", `{"machine":"m-b","timestamp":"2026-01-02T03:04:05Z","retryCount":0}`, false},
		{"KCP's for another Machine", `{"machine":"m-a","timestamp":"2026-01-02T03:04:05Z","retryCount":0}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cp := kcpObject()
			cp.SetAnnotations(map[string]string{controlplanev1.RemediationInProgressAnnotation: tc.value})
			w := newWorld(t, withControlPlaneObject(cp))
			g.Expect(w.r.takeLock(t.Context(), w.s, 3)).To(Succeed())
			g.Expect(w.controlPlaneAnnotations(g)).To(HaveKey(caprv1.ControlPlaneLockAnnotation))
			g.Expect(w.r.releaseLock(t.Context(), w.s)).To(Succeed())
			annotations := w.controlPlaneAnnotations(g)
			g.Expect(annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
			if tc.kept {
				g.Expect(annotations).To(HaveKeyWithValue(controlplanev1.RemediationInProgressAnnotation, tc.value))
			} else {
				g.Expect(annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
			}
		})
	}
}
