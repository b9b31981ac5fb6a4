package controlplane

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

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
			g.Expect(res.Message).To(Equal("gave up"))
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
				g.Expect(res.Message).To(ContainSubstring("not confirmed within 1m0s"))
			}},
		{name: "fencer error: error, retried", world: []worldOption{withFence(fencing.Result{}, errInjected)}, check: func(g Gomega, _ *world, res stepResult, err error) {
			g.Expect(err).To(MatchError(errInjected))
			g.Expect(res.Done).To(BeFalse())
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
				g.Expect(m.Annotations).NotTo(HaveKey(caprv1.ReplicasBackHookAnnotation), "released once the replicas are back")
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
		// The controller died between its delete and the replicas' write: the hook held the victim.
		{name: "Machine being deleted, held by the replicas-back hook: replicas back, then the hook released",
			world: []worldOption{withReplicas(4), withMachines(cpMachine("m-a"), cpMachine("m-b", beingDeleted(), withMachineAnnotation(caprv1.ReplicasBackHookAnnotation, "m-b")), cpMachine("m-c")),
				withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, "")},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
				g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(caprv1.ReplicasBackHookAnnotation))
			}},
		// Deleted by someone else (a rollout, a person) while the surge is still there: the surge must
		// go too, or the provider would replace the victim and stay at 4.
		{name: "Machine being deleted: replicas back, waits",
			world: []worldOption{withReplicas(4), withMachines(cpMachine("m-a"), cpMachine("m-b", beingDeleted()), cpMachine("m-c")), withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, "")},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(res.Message).To(ContainSubstring("is being deleted"))
				g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
			}},
	})

	// The victim's member is gone, so its API server cannot serve; with its kubelet silent nothing
	// restarts it, and a drain CAPI sends on a connection held to it never finishes (seen on kind).
	drainSkippedAnnotations := []string{clusterv1.ExcludeNodeDrainingAnnotation, clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation}
	expectDrain := func(g Gomega, m *clusterv1.Machine, skipped bool) {
		for _, a := range drainSkippedAnnotations {
			if skipped {
				g.Expect(m.Annotations).To(HaveKey(a))
			} else {
				g.Expect(m.Annotations).NotTo(HaveKey(a))
			}
		}
	}
	memberRemoved := withStep(caprv1.StepRemoveMember, caprv1.StepOutcomeSucceeded, "")
	fenced := withStep(caprv1.StepFence, caprv1.StepOutcomeSkipped, "")
	for _, tc := range []struct {
		name    string
		victim  *clusterv1.Machine
		steps   []worldOption
		skipped bool
	}{
		{name: "Node unreachable, member removed: CAPI is told not to drain it", victim: cpMachine("m-b", withFinalizer(), nodeUnreachable()),
			steps: []worldOption{memberRemoved, fenced}, skipped: true},
		{name: "Node unreachable, member found gone: the same", victim: cpMachine("m-b", withFinalizer(), nodeUnreachable()),
			steps: []worldOption{withStep(caprv1.StepRemoveMember, caprv1.StepOutcomeSkipped, ""), fenced}, skipped: true},
		{name: "deleting already, its drain stuck: the same from then on", victim: cpMachine("m-b", beingDeleted(), nodeUnreachable()),
			steps: []worldOption{memberRemoved, fenced}, skipped: true},
		{name: "Node reachable, member removed: drained", victim: cpMachine("m-b", withFinalizer()),
			steps: []worldOption{memberRemoved, fenced}},
		{name: "Node unreachable, member still there (left to the provider's hook): drained", victim: cpMachine("m-b", withFinalizer(), nodeUnreachable()),
			steps: []worldOption{withOrder(caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval), fenced}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			w := newWorld(t, append([]worldOption{withMachines(cpMachine("m-a"), tc.victim, cpMachine("m-c")), withReplicas(4),
				withReplacement(cpMachine("m-d"))}, tc.steps...)...)
			recorder := events.NewFakeRecorder(10)
			w.r.recorder = recorder
			res, err := w.run(caprv1.StepDelete)
			expectIssued(g, res, err)
			m := w.machine(g, "m-b")
			g.Expect(m.DeletionTimestamp.IsZero()).To(BeFalse(), "the victim is being deleted")
			expectDrain(g, m, tc.skipped)
			for _, other := range []string{"m-a", "m-c", "m-d"} {
				expectDrain(g, w.machine(g, other), false)
			}
			if tc.skipped {
				g.Expect(recorder.Events).To(Receive(SatisfyAll(HavePrefix("Normal DrainSkipped"), ContainSubstring("its Node is unreachable"))))
			}
		})
	}

	// What the hook is for: the replicas' write fails (as if the controller died after the delete),
	// and the victim stays, being deleted, instead of going while the replicas still ask for 4.
	t.Run("the replicas' write fails after the delete: the victim is held, deleting, until a later pass", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withMachines(cpMachine("m-a"), cpMachine("m-b", withFinalizer()), cpMachine("m-c")), withReplicas(4),
			withReplacement(cpMachine("m-d")), withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))
		healthy := w.r.Client
		w.r.Client = interceptor.NewClient(w.client.(client.WithWatch), interceptor.Funcs{
			Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				if _, machine := obj.(*clusterv1.Machine); !machine {
					return errors.New("the controller is gone")
				}
				return c.Patch(ctx, obj, patch, opts...)
			},
		})
		_, err := w.run(caprv1.StepDelete)
		g.Expect(err).To(HaveOccurred())
		m := w.machine(g, "m-b")
		g.Expect(m.DeletionTimestamp.IsZero()).To(BeFalse(), "the victim is being deleted")
		g.Expect(m.Annotations).To(HaveKeyWithValue(caprv1.ReplicasBackHookAnnotation, "m-b"))
		g.Expect(w.replicas(g)).To(BeEquivalentTo(4))

		// The next reconcile (a new controller) starts from what the API holds.
		w.r.Client = healthy
		w.s.machine = m
		g.Expect(w.client.Get(t.Context(), client.ObjectKeyFromObject(w.s.cp), w.s.cp)).To(Succeed())
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(w.replicas(g)).To(BeEquivalentTo(3))
		g.Expect(w.machine(g, "m-b").Annotations).NotTo(HaveKey(caprv1.ReplicasBackHookAnnotation))
	})

	t.Run("Machine gone after a surge of two, the provider still at 4: waits for the second scale-down", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withSurgeOfTwo(), withReplicas(3), withReplacement(cpMachine("m-d")), withReplacement(cpMachine("m-e")),
			withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))
		w.deleteVictim(g)
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(res.Message).To(ContainSubstring("scale to 3 Machines (4, 0 deleting)"))
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
		g.Expect(res.Message).To(ContainSubstring("surplus replacement m-e marked"))
		g.Expect(w.machine(g, "m-e").Annotations).To(HaveKey(clusterv1.DeleteMachineAnnotation), "KCP's own choice first")
		w.s.machines = slices.DeleteFunc(w.s.machines, func(m *clusterv1.Machine) bool { return m.Name == "m-e" })
		w.s.machines = append(w.s.machines, w.machine(g, "m-e"))
		res, err = w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(res.Message).To(ContainSubstring("deleted the surplus replacement m-e"))
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
		g.Expect(res.Message).To(ContainSubstring("scale to 3 Machines (4, 0 deleting)"))
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

	// The replicas are someone else's once they changed them (a person, GitOps, an
	// autoscaler on the scale subresource); CAPR neither overwrites nor undoes that.
	t.Run("replicas changed by someone else during the remediation: left as they are, said", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withReplicas(7), withReplacement(cpMachine("m-d")), withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))
		res, err := w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(w.machine(g, "m-b")).To(BeNil(), "the victim is deleted")
		g.Expect(w.replicas(g)).To(BeEquivalentTo(7))
		g.Expect(res.Message).To(ContainSubstring("replicas are 7, changed by someone else during the remediation (it set 4, from 3)"))
		res, err = w.run(caprv1.StepDelete)
		expectIssued(g, res, err)
		g.Expect(w.replicas(g)).To(BeEquivalentTo(7))
		g.Expect(res.Message).To(ContainSubstring("scale to 7 Machines"), "the provider scales to their replicas")
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
		g.Expect(res.Message).To(ContainSubstring("replicas are 5, changed by someone else"))
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
