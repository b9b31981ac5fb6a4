package controlplane

import (
	"testing"

	. "github.com/onsi/gomega"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

func withFenceHook() machineOption {
	return func(m *clusterv1.Machine) {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[caprv1.FenceBeforeDeleteHookAnnotation] = m.Name
	}
}

// TestFenceHook: the victim carries CAPI's pre-drain hook from the start of a running remediation
// until its Fence step finishes, and an undone remediation takes it off; so nobody's deletion of the
// victim (a KCP rollout, a person) drains or deletes it unfenced.
func TestFenceHook(t *testing.T) {
	hook := func(g Gomega, w *world) string {
		return w.machine(g, "m-b").Annotations[caprv1.FenceBeforeDeleteHookAnnotation]
	}
	t.Run("running, not fenced yet: the hook is added once", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withStep(caprv1.StepScaleUp, caprv1.StepOutcomeInProgress, ""))
		w.s.mr.Spec.Fencing = &caprv1.FencingSpec{Policy: caprv1.FencingRequired}
		g.Expect(w.r.ensureFenceHook(t.Context(), w.s)).To(Succeed())
		g.Expect(hook(g, w)).To(Equal("m-b"))
		g.Expect(w.r.ensureFenceHook(t.Context(), w.s)).To(Succeed(), "idempotent")
	})
	for name, spec := range map[string]*caprv1.FencingSpec{"no fencing spec": nil, "policy Disabled": {Policy: caprv1.FencingDisabled}} {
		t.Run(name+": no hook (nothing would be fenced)", func(t *testing.T) {
			g := NewWithT(t)
			w := newWorld(t, withStep(caprv1.StepScaleUp, caprv1.StepOutcomeInProgress, ""))
			w.s.mr.Spec.Fencing = spec
			g.Expect(w.r.ensureFenceHook(t.Context(), w.s)).To(Succeed())
			g.Expect(hook(g, w)).To(BeEmpty())
		})
	}
	t.Run("fenced: no hook is added", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))
		g.Expect(w.r.ensureFenceHook(t.Context(), w.s)).To(Succeed())
		g.Expect(hook(g, w)).To(BeEmpty())
	})
	for name, outcome := range map[string]fencing.Outcome{"Fenced": fencing.Fenced, "Skipped": fencing.Skipped, "GaveUp": fencing.GaveUp} {
		t.Run("Fence step "+name+": the hook is removed", func(t *testing.T) {
			g := NewWithT(t)
			w := newWorld(t, withMachines(cpMachine("m-a"), cpMachine("m-b", withFenceHook()), cpMachine("m-c")),
				withFence(fencing.Result{Outcome: outcome}, nil))
			res, err := w.run(caprv1.StepFence)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(res.Done).To(BeTrue())
			g.Expect(hook(g, w)).To(BeEmpty())
		})
	}
	t.Run("fencing still waiting: the hook stays", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withMachines(cpMachine("m-a"), cpMachine("m-b", withFenceHook()), cpMachine("m-c")),
			withFence(fencing.Result{Outcome: fencing.Waiting, Message: "waiting"}, nil))
		res, err := w.run(caprv1.StepFence)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Done).To(BeFalse())
		g.Expect(hook(g, w)).To(Equal("m-b"))
	})
	t.Run("Delete step on a fenced victim that carries the hook again (a crash before the Fence step's record): the hook is removed", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withReplicas(4), withReplacement(cpMachine("m-d")),
			withMachines(cpMachine("m-a"), cpMachine("m-b", withFenceHook(), withFinalizer()), cpMachine("m-c")),
			withStep(caprv1.StepFence, caprv1.StepOutcomeSucceeded, ""))
		_, err := w.run(caprv1.StepDelete)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.machine(g, "m-b").DeletionTimestamp.IsZero()).To(BeFalse(), "deleted")
		g.Expect(hook(g, w)).To(BeEmpty())
	})
	t.Run("undone: the hook is removed", func(t *testing.T) {
		g := NewWithT(t)
		w := newWorld(t, withReplicas(4), withMachines(cpMachine("m-a"), cpMachine("m-b", withFenceHook()), cpMachine("m-c")))
		_, err := w.r.undo(t.Context(), w.s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(hook(g, w)).To(BeEmpty())
	})
}
