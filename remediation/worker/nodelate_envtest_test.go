//go:build envtest

package worker_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/builder"
	capienv "github.com/capr-io/capr/test/envtest"
)

// Under Required, a Machine that names no Node when its request is recorded is fenced on the Node it
// gets later, never deleted unfenced: an empty Node is "cannot confirm" unless the Machine provably
// never had one.

// nodelessWorker creates a worker Machine of the fixture's MachineSet without a nodeRef, with the
// given providerID and CAPR's health mark.
func (f *fixture) nodelessWorker(g *WithT, name, providerID string) *clusterv1.Machine {
	m := builder.Machine(f.ns, f.cluster.Name, name).WithLabels(pool).
		WithAnnotations(map[string]string{caprv1.UnhealthyAnnotation: `{"reason":"NodeStartupTimeout","checker":"test"}`}).Build()
	m.OwnerReferences = ownedBy("MachineSet", f.ms.Name, f.ms.UID)
	m.Spec.ProviderID = providerID
	g.Expect(k8sClient.Create(ctx, m)).To(Succeed())
	return m
}

// TestRequiredFenceWaitsForANodeThatRegisteredWithoutNodeRef: a Node with the Machine's providerID
// exists in the workload cluster but CAPI has not set the nodeRef yet. The Fence step cannot confirm
// and waits, saying why in the condition and an event; once the nodeRef is set, that Node is fenced
// and only then is the Machine deleted. (Before the fix the Fence step was Skipped and the Machine
// deleted at once.)
func TestRequiredFenceWaitsForANodeThatRegisteredWithoutNodeRef(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	providerID := "sandbox://" + f.ns + "/late"
	node := f.node("late")
	n := capienv.NewNode(node, corev1.ConditionFalse, time.Now())
	n.Spec.ProviderID = providerID
	g.Expect(capienv.CreateNode(ctx, k8sClient, n)).To(Succeed())
	m := f.nodelessWorker(g, "late", providerID)
	f.request(g, m, required(), caprv1.MachineRemediationSourceHealthCheck)

	g.Eventually(func(g Gomega) string {
		reason, msg := progressing(g, f.ns, m.Name)
		g.Expect(reason).To(Equal(caprv1.MachineRemediationWaitingForFencingReason))
		return msg
	}, eventually, poll).Should(And(ContainSubstring("cannot be confirmed"), ContainSubstring("Node "+node+" has the Machine's providerID")))
	g.Eventually(func(g Gomega) []string { return eventReasons(g, f.ns, m.Name) }, eventually, poll).Should(ContainElement("RemediationWaiting"))
	g.Expect(getMachine(g, f.ns, m.Name).Annotations).To(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation),
		"a deletion by someone else is held until the Machine is fenced")
	g.Consistently(func(g Gomega) bool { return machineExists(g, f.ns, m.Name) }, quiet, poll).Should(BeTrue())

	// CAPI links the Node: the remediation fences it, and deletes only once the fence is confirmed.
	g.Expect(capienv.SetMachineNode(ctx, k8sClient, m, node)).To(Succeed())
	g.Eventually(func() bool { return backend.wasAsked(node) }, eventually, poll).Should(BeTrue())
	mr := getRemediation(g, f.ns, m.Name)
	g.Expect(mr.Status.Worker.NodeName).To(Equal(node), "the Node is recorded")
	g.Expect(mr.Status.Fencing).NotTo(BeNil())
	g.Expect(mr.Status.Fencing.NodeName).To(Equal(node), "the fence is recorded, so it is undone later")
	g.Consistently(func(g Gomega) bool { return machineExists(g, f.ns, m.Name) }, quiet, poll).Should(BeTrue())

	backend.confirm(node)
	g.Eventually(func(g Gomega) bool { return machineExists(g, f.ns, m.Name) }, eventually, poll).Should(BeFalse())
	g.Expect(getRemediation(g, f.ns, m.Name).Status.Step(caprv1.StepFence).Outcome).To(Equal(caprv1.StepOutcomeSucceeded))
}

// TestRequiredFenceOfANodeThatRegistersDuringEscalation: the Machine has no Node when its request
// starts (no Node has its providerID yet); its Node registers during the escalation step (a reboot
// brought it up). The Fence step fences that Node before the delete. (Before the fix the Node name
// recorded while Pending was used: empty, the Fence step was Skipped and the Machine deleted unfenced.)
func TestRequiredFenceOfANodeThatRegistersDuringEscalation(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	tmpl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": escalationGroupVersion, "kind": "RebootTemplate",
		"metadata": map[string]any{"namespace": f.ns, "name": "t"},
		"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{"mode": "soft"}}},
	}}
	g.Expect(k8sClient.Create(ctx, tmpl)).To(Succeed())
	m := f.nodelessWorker(g, victim, "sandbox://"+f.ns+"/"+victim)
	f.request(g, m, required(), caprv1.MachineRemediationSourceHealthCheck, func(mr *caprv1.MachineRemediation) {
		mr.Spec.Escalation = []caprv1.EscalationStep{
			{TemplateRef: caprv1.TemplateReference{APIVersion: escalationGroupVersion, Kind: "RebootTemplate", Name: "t"}, TimeoutSeconds: 60},
		}
	})
	g.Eventually(func(g Gomega) *unstructured.Unstructured { return escalationObject(g, f.ns, "Reboot") }, eventually, poll).
		ShouldNot(BeNil())
	g.Expect(getRemediation(g, f.ns, m.Name).Status.Worker.NodeName).To(BeEmpty(), "no Node when the request started")

	// The reboot brings the Node up; the Machine stays unhealthy, so the step times out.
	node := f.node(victim)
	g.Expect(capienv.SetMachineNode(ctx, k8sClient, m, node)).To(Succeed())
	g.Eventually(func() bool { return backend.wasAsked(node) }, eventually, poll).Should(BeTrue())
	g.Consistently(func(g Gomega) bool { return machineExists(g, f.ns, m.Name) }, quiet, poll).Should(BeTrue(),
		"not deleted before the fence of its Node is confirmed")
	reason, msg := progressing(g, f.ns, m.Name)
	g.Expect(reason).To(Equal(caprv1.MachineRemediationWaitingForFencingReason))
	g.Expect(msg).To(ContainSubstring(node))

	backend.confirm(node)
	g.Eventually(func(g Gomega) bool { return machineExists(g, f.ns, m.Name) }, eventually, poll).Should(BeFalse())
	mr := getRemediation(g, f.ns, m.Name)
	g.Expect(mr.Status.Step(caprv1.StepFence).Outcome).To(Equal(caprv1.StepOutcomeSucceeded))
	g.Expect(mr.Status.Fencing.NodeName).To(Equal(node))
}

// TestRequiredFenceSkippedForAMachineThatNeverHadANode: no nodeRef and no Node with its providerID:
// nothing can write through the Machine, so Required does not hold its deletion forever.
func TestRequiredFenceSkippedForAMachineThatNeverHadANode(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	m := f.nodelessWorker(g, "never", "sandbox://"+f.ns+"/never")
	f.request(g, m, required(), caprv1.MachineRemediationSourceHealthCheck)

	g.Eventually(func(g Gomega) bool { return machineExists(g, f.ns, m.Name) }, eventually, poll).Should(BeFalse())
	rec := getRemediation(g, f.ns, m.Name).Status.Step(caprv1.StepFence)
	g.Expect(rec.Outcome).To(Equal(caprv1.StepOutcomeSkipped))
	g.Expect(rec.Message).To(ContainSubstring("never had a Node"))
}
