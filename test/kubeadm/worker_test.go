package kubeadm_test

import (
	"sort"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/remediation/worker"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/kubeadm"
	"github.com/capr-io/capr/test/sandbox"
)

// TestWorkersFencedThenReplacedByTheirMachineSet: two workers of a MachineDeployment lose their
// kubelets (the real node lifecycle controller sets Ready=Unknown). CAPR marks both and starts both
// remediations, which wait at Fence (Required; the test's gate backend stays closed). Each Machine
// carries CAPR's fence-before-delete hook, so when a person deletes the second one, CAPI's real
// Machine controller holds the deletion (WaitingForPreDrainHook). When the gate opens, the first is
// fenced and deleted by CAPR, the second's held deletion proceeds once fenced, and CAPI's real
// MachineSet replaces both.
func TestWorkersFencedThenReplacedByTheirMachineSet(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "kcp-workers")
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: 1, Workers: 2})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	t.Cleanup(func() { // runs before the cluster is destroyed
		if t.Failed() {
			t.Log(kubeadm.Describe(ctx, sb, wc))
		}
	})
	mhc := sandbox.WorkerHealthCheck(ns, "workers", wc.Name, 2)
	mhc.Spec.Remediation.Fencing = sandbox.ExternalFencing("power")
	g.Expect(sb.Client.Create(ctx, mhc)).To(Succeed())
	gate := &sandbox.GateBackend{}
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{Fencer: gate.Fencer()}})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)

	workers := workerMachines(g, ns)
	g.Expect(workers).To(HaveLen(2))
	a, b := workers[0], workers[1]
	deletions, err := sb.WatchMachineDeletions(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(deletions.Stop)
	start := time.Now()
	for _, m := range workers {
		g.Expect(sb.StopKubelet(ctx, wc, m.Status.NodeRef.Name)).To(Succeed())
	}

	// Both wait at Fence, their Machines held by the hook.
	g.Eventually(func(g Gomega) {
		for _, m := range workers {
			mr := &caprv1.MachineRemediation{}
			g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: m.Name}, mr)).To(Succeed())
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
			g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.StepFence))
			g.Expect(conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition)).To(Equal(caprv1.MachineRemediationWaitingForFencingReason))
			live := &clusterv1.Machine{}
			g.Expect(sb.Client.Get(ctx, client.ObjectKeyFromObject(&m), live)).To(Succeed())
			g.Expect(live.Annotations).To(HaveKeyWithValue(caprv1.FenceBeforeDeleteHookAnnotation, m.Name))
		}
	}, 2*time.Minute, time.Second).Should(Succeed())

	// A person deletes b: CAPI's Machine controller waits for the hook; the remediation says so.
	g.Expect(sb.Client.Delete(ctx, &b)).To(Succeed())
	g.Eventually(func(g Gomega) {
		live := &clusterv1.Machine{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKeyFromObject(&b), live)).To(Succeed())
		g.Expect(live.DeletionTimestamp.IsZero()).To(BeFalse())
		g.Expect(conditions.GetReason(live, clusterv1.MachineDeletingCondition)).To(Equal(clusterv1.MachineDeletingWaitingForPreDrainHookReason))
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: b.Name}, mr)).To(Succeed())
		g.Expect(conditions.GetMessage(mr, caprv1.MachineRemediationProgressingCondition)).To(ContainSubstring("its deletion is held until it is fenced"))
	}, time.Minute, time.Second).Should(Succeed())
	_, gone := sb.Log.Find(wc.LogKey(), start, "machine "+b.Name+" gone")
	g.Expect(gone).To(BeFalse(), "the Machine went before it was fenced")

	gate.Open()
	g.Eventually(func(g Gomega) {
		for _, m := range workers {
			mr := &caprv1.MachineRemediation{}
			g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: m.Name}, mr)).To(Succeed())
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "%s: %v", m.Name, mr.Status.Conditions)
		}
		// CAPI's MachineSet replaced both: two workers again, new ones, each with a Node.
		now := workerMachines(g, ns)
		g.Expect(now).To(HaveLen(2))
		for _, m := range now {
			g.Expect(m.Name).NotTo(BeElementOf(a.Name, b.Name))
			g.Expect(m.Status.NodeRef.IsDefined()).To(BeTrue(), "%s has no Node yet", m.Name)
		}
	}, 5*time.Minute, time.Second).Should(Succeed())

	fenced := gate.FencedAt()
	g.Expect(fenced.IsZero()).To(BeFalse())
	for _, m := range workers {
		at, ok := sb.Log.Find(wc.LogKey(), start, "machine "+m.Name+" gone")
		g.Expect(ok).To(BeTrue(), "the sandbox never saw %s go", m.Name)
		g.Expect(at).To(BeTemporally(">=", fenced), "%s went before it was fenced", m.Name)
	}
	// From the API server, against the backend's own confirmation time per Machine (ms; CAPR's
	// status.fencing has whole seconds): CAPR deleted a only after a's fence, and each deletion took
	// effect (deleting, no longer held by CAPR's hook) only after that Machine's fence.
	g.Expect(deletions.SeenAfter(a.Name, sandbox.MachineDeleting, gate.FencedAtFor(a.Name))).To(Succeed())
	for _, m := range workers {
		g.Expect(deletions.SeenAfter(m.Name, sandbox.MachineReleased, gate.FencedAtFor(m.Name))).To(Succeed())
	}
	mrA := &caprv1.MachineRemediation{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: a.Name}, mrA)).To(Succeed())
	g.Expect(mrA.Status.Step(caprv1.StepDelete)).NotTo(BeNil(), "CAPR deleted a itself")
	// b's deletion was the person's, released by CAPR once fenced.
	events := &eventsv1.EventList{}
	g.Expect(sb.Client.List(ctx, events, client.InNamespace(ns))).To(Succeed())
	var released []string
	for _, e := range events.Items {
		if e.Reason == worker.EventFencedDeletingMachine {
			released = append(released, e.Regarding.Name)
		}
	}
	g.Expect(released).To(ConsistOf(b.Name))
	mrB := &caprv1.MachineRemediation{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: b.Name}, mrB)).To(Succeed())
	g.Expect(mrB.Status.Step(caprv1.StepDelete)).To(BeNil(), "no step of CAPR's own after the person's deletion")
	g.Expect(conditions.GetMessage(mrB, caprv1.MachineRemediationSucceededCondition)).To(ContainSubstring("deleted outside this remediation"))
}

// workerMachines returns the namespace's Machines without the control-plane label, not deleting,
// sorted by name.
func workerMachines(g Gomega, ns string) []clusterv1.Machine {
	list := &clusterv1.MachineList{}
	g.Expect(sb.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var out []clusterv1.Machine
	for _, m := range list.Items {
		if _, cp := m.Labels[clusterv1.MachineControlPlaneLabel]; cp || !m.DeletionTimestamp.IsZero() {
			continue
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
