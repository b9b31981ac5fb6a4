package controlplane

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

func TestStepScaleUp(t *testing.T) {
	runStepCases(t, caprv1.StepScaleUp, []stepCase{
		{name: "3 healthy voters: replicas raised to 4, etcd reached through the victim's node last", check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(res.Message).To(ContainSubstring("raised replicas to 4"))
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
			g.Expect(res.Message).To(ContainSubstring("replacement Machine m-d"))
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
				g.Expect(res.Message).To(ContainSubstring("2/3 healthy"))
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
			g.Expect(res.Message).To(ContainSubstring(errInjected.Error()))
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
				g.Expect(res.Message).To(ContainSubstring("CertificatesAvailable"))
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
		g.Expect(res.WaitReason).To(Equal(caprv1.MachineRemediationWaitingForPreconditionsReason))
		g.Expect(res.Message).To(ContainSubstring("replicas are 2, changed by someone else"))
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
				g.Expect(res.Message).To(ContainSubstring("replacement 2 of 2"))
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
			g.Expect(res.Message).To(ContainSubstring("to create the replacement"))
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
				g.Expect(res.Message).To(ContainSubstring("m-d to get a Node"))
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
			g.Expect(res.Message).To(ContainSubstring("to join"))
		}},
		{name: "replacement's member is a learner: waits for its promotion", world: []worldOption{withReplacement(cpMachine("m-d")), fourMembers(asLearner())}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(res.Message).To(ContainSubstring("learner"))
			g.Expect(res.Requeue).To(BeNumerically("<=", time.Second), "etcd is polled: no watch reports the promotion")
		}},
		{name: "replacement's member is unhealthy", world: []worldOption{withReplacement(cpMachine("m-d")), fourMembers(asDown())}, check: func(g Gomega, w *world, res stepResult, err error) {
			expectIssued(g, res, err)
			g.Expect(res.Message).To(ContainSubstring("unhealthy"))
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
