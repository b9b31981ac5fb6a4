package controlplane

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// kcpOneReplacement is a KubeadmControlPlane world whose remediation asks for one replacement with a
// surge of two (firstreplacement.go), its three Machines healthy in KCP's eyes.
func kcpOneReplacement(extra ...worldOption) []worldOption {
	return append([]worldOption{withControlPlaneObject(kcpObject()), withOneReplacement(),
		withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b", kcpHealthy()), cpMachine("m-c", kcpHealthy()))}, extra...)
}

// TestStepScaleUpOneReplacement: the victim is marked for the provider's scale-down before the
// replicas are raised by two, and KCP's remediation-in-progress is stamped a second before the start,
// so that KCP finds it stale once it created the replacement.
func TestStepScaleUpOneReplacement(t *testing.T) {
	runStepCases(t, caprv1.StepScaleUp, []stepCase{
		{name: "KCP with stacked etcd: victim marked, replicas raised to 5, annotation older than the start",
			world: kcpOneReplacement(),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(5))
				g.Expect(w.machine(g, "m-b").Annotations).To(HaveKeyWithValue(clusterv1.DeleteMachineAnnotation, capr))
				for _, other := range []string{"m-a", "m-c"} {
					g.Expect(w.machine(g, other).Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
				}
				data, err := kcpRemediationDataFromAnnotation(w.controlPlaneAnnotations(g)[controlplanev1.RemediationInProgressAnnotation])
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(data.Machine).To(Equal("m-b"))
				g.Expect(data.Timestamp.Time).To(BeTemporally("<", w.s.mr.Status.StartTime.Truncate(time.Second)),
					"a replacement created in the start's second must be newer than the stamp (KCP's stale check)")
			}},
		{name: "a Machine created after the stamp would be: the stamp is not older than it",
			world: kcpOneReplacement(),
			before: func(w *world) {
				for _, m := range w.s.machines {
					m.CreationTimestamp.Time = w.s.mr.Status.StartTime.Truncate(time.Second)
				}
			},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				data, err := kcpRemediationDataFromAnnotation(w.controlPlaneAnnotations(g)[controlplanev1.RemediationInProgressAnnotation])
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(data.Timestamp.Time).To(BeTemporally("==", w.s.mr.Status.StartTime.Truncate(time.Second)),
					"KCP would otherwise drop the annotation before it created the replacement")
			}},
		{name: "one replacement per replica (surge of one): the victim is not marked before its Delete step",
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
				g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
			}},
	})
}

// TestStepWaitForReplacementReturnsReplicas: once the first replacement exists, the replicas go from
// N+2 back to N (conditional on N+2), so that KCP never creates the second Machine; the step then
// waits for that one replacement only.
func TestStepWaitForReplacementReturnsReplicas(t *testing.T) {
	marked := withMachineAnnotation(clusterv1.DeleteMachineAnnotation, capr)
	victimMarked := withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b", kcpHealthy(), marked), cpMachine("m-c", kcpHealthy()))
	four := withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD)))
	runStepCases(t, caprv1.StepWaitForReplacement, []stepCase{
		{name: "first replacement created, no Node yet: replicas back to 3, waits for it",
			world: kcpOneReplacement(victimMarked, withReplicas(5), withReplacement(cpMachine("m-d", withoutNode()))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
				g.Expect(res.Message).To(ContainSubstring("replacement 1 of 1"))
				g.Expect(res.Message).To(ContainSubstring("replicas back from 5 to 3: m-d is the one replacement"))
				g.Expect(w.s.mr.Status.ControlPlane.Replacements).To(BeEquivalentTo(1))
				g.Expect(w.machine(g, "m-b").Annotations).To(HaveKeyWithValue(clusterv1.DeleteMachineAnnotation, capr))
			}},
		{name: "a crash between the victim's mark and the replicas (an older record): marked, replicas back",
			world: kcpOneReplacement(withReplicas(5), withReplacement(cpMachine("m-d", withoutNode()))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
				g.Expect(w.machine(g, "m-b").Annotations).To(HaveKeyWithValue(clusterv1.DeleteMachineAnnotation, capr))
			}},
		{name: "replicas already back, the replacement votes: done, no second Machine asked for",
			world: kcpOneReplacement(victimMarked, withReplacement(cpMachine("m-d")), four),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
				g.Expect(w.controlPlaneAnnotations(g)).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation), "not armed for a second Machine")
				g.Expect(w.s.mr.Status.ControlPlane.Replacement).To(Equal("m-d"))
			}},
		{name: "the replacement votes before the replicas returned (CAPR was not running): replicas back, done",
			world: kcpOneReplacement(victimMarked, withReplicas(5), withReplacement(cpMachine("m-d")), four),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
			}},
		{name: "the provider created two before the replicas could return: both waited for, as a surge of two",
			world: kcpOneReplacement(victimMarked, withReplicas(5), withReplacement(cpMachine("m-d")), withReplacement(cpMachine("m-e", withoutNode())), four),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.s.mr.Status.ControlPlane.Replacements).To(BeEquivalentTo(2))
				g.Expect(w.replicas(g)).To(BeEquivalentTo(5), "the second is the surge's: the Delete step returns the replicas and marks it")
				g.Expect(res.Message).To(ContainSubstring("replacement 2 of 2"))
				g.Expect(res.Message).To(ContainSubstring("created 2 replacements before the replicas could return"))
			}},
		{name: "replicas changed by someone else meanwhile: theirs, left",
			world: kcpOneReplacement(victimMarked, withReplicas(7), withReplacement(cpMachine("m-d", withoutNode()))),
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(7))
				g.Expect(res.Message).To(ContainSubstring(replicasChangedElsewhere))
			}},
		{name: "replicas changed between the read and the write: decided again from a live read, theirs left",
			world: kcpOneReplacement(victimMarked, withReplicas(5), withReplacement(cpMachine("m-d", withoutNode()))),
			before: func(w *world) {
				other := w.s.cp.DeepCopy()
				_ = SetReplicas(other, 7)
				if err := w.client.Update(w.t.Context(), other); err != nil {
					w.t.Fatal(err)
				}
			},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(7))
			}},
	})
}

// TestUndoWithdrawsTheVictimMark: undoing a remediation whose victim CAPR marked for the provider's
// scale-down deletes its replacement first and then removes the mark, so the provider never takes the
// victim for the undo's scale-down; a mark set by someone else stays.
func TestUndoWithdrawsTheVictimMark(t *testing.T) {
	run := func(t *testing.T, value string, extra ...worldOption) *world {
		t.Helper()
		g := NewWithT(t)
		opts := append(kcpOneReplacement(
			withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b", kcpHealthy(), withMachineAnnotation(clusterv1.DeleteMachineAnnotation, value)), cpMachine("m-c", kcpHealthy())),
			withReplacement(cpMachine("m-d", kcpHealthy())),
			withStep(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded, ""),
			withStep(caprv1.StepWaitForReplacement, caprv1.StepOutcomeInProgress, ""),
		), extra...)
		w := newWorld(t, opts...)
		setLock(g, w)
		undone, err := w.r.undo(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		t.Log(undone)
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		return w
	}
	t.Run("replicas already back: the replacement deleted, then the mark removed", func(t *testing.T) {
		g := NewWithT(t)
		w := run(t, capr)
		g.Expect(w.machine(g, "m-d")).To(BeNil())
		g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
	})
	t.Run("replicas still raised: the same, and the replicas back", func(t *testing.T) {
		g := NewWithT(t)
		w := run(t, capr, withReplicas(5))
		g.Expect(w.machine(g, "m-d")).To(BeNil())
		g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
	})
	t.Run("a mark someone else set is theirs", func(t *testing.T) {
		g := NewWithT(t)
		w := run(t, "someone")
		g.Expect(w.machine(g, "m-b").Annotations).To(HaveKeyWithValue(clusterv1.DeleteMachineAnnotation, "someone"))
	})
}

// TestVictimScaledDownByTheProvider: once the replicas may have returned at the first replacement,
// the provider's scale-down deleting the victim is what the remediation let it do: past the point of
// no return (no undo, no giving way, which would delete the replacement the cluster needs), and a
// victim gone does not fail the remediation, which goes on to its end.
func TestVictimScaledDownByTheProvider(t *testing.T) {
	world := func(t *testing.T, victim ...machineOption) *world {
		w := newWorld(t, kcpOneReplacement(
			withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b", append([]machineOption{kcpHealthy(), withMachineAnnotation(clusterv1.DeleteMachineAnnotation, capr)}, victim...)...), cpMachine("m-c", kcpHealthy())),
			withReplacement(cpMachine("m-d", kcpHealthy())),
			withEtcd(newFakeEtcd(member(nodeA, asLeader()), member(nodeB), member(nodeC), member(nodeD))),
			withStep(caprv1.StepScaleUp, caprv1.StepOutcomeSucceeded, ""),
			withStep(caprv1.StepWaitForReplacement, caprv1.StepOutcomeInProgress, ""),
		)...)
		setLock(NewWithT(t), w)
		return w
	}
	t.Run("being deleted: past the point of no return, said why", func(t *testing.T) {
		g := NewWithT(t)
		w := world(t, beingDeleted())
		g.Expect(w.r.pastPointOfNoReturn(t.Context(), w.s)).To(BeTrue())
		g.Expect(whyIrreversible(w.s)).To(ContainSubstring("provider's scale-down"))
	})
	t.Run("not being deleted: can still be undone", func(t *testing.T) {
		g := NewWithT(t)
		w := world(t)
		g.Expect(w.r.pastPointOfNoReturn(t.Context(), w.s)).To(BeFalse())
	})
	t.Run("gone: the remediation goes on, the replacement kept", func(t *testing.T) {
		g := NewWithT(t)
		w := world(t)
		w.deleteVictim(g)
		w.s.machineGone = true
		_, err := w.r.reconcileMachineGone(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.s.mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning), "%v", w.s.mr.Status.Conditions)
		g.Expect(w.machine(g, "m-d")).NotTo(BeNil())
		g.Expect(w.machine(g, "m-d").Annotations).NotTo(HaveKey(clusterv1.DeleteMachineAnnotation))
	})
}
