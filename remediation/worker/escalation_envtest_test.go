//go:build envtest

package worker_test

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/worker"
)

const (
	escalationGroupVersion = "escalation.test.capr.io/v1"
	// victim is the Machine of the escalation tests (each in its own namespace).
	victim = "w1"
)

// step is an escalation step of the test kinds (escalationGroupVersion), from the template "t".
func step(templateKind string) caprv1.EscalationStep {
	return caprv1.EscalationStep{TemplateRef: caprv1.TemplateReference{APIVersion: escalationGroupVersion, Kind: templateKind, Name: "t"}, TimeoutSeconds: 60}
}

// markedWorker creates a worker Machine of the MachineSet carrying a health mark, the two templates
// of the chain (Reboot, then PowerCycle) and the request with that chain.
func markedWorker(t *testing.T, g *WithT) *fixture {
	t.Helper()
	return escalatingWorker(t, g, nil, step("RebootTemplate"), step("PowerCycleTemplate"))
}

// escalatingWorker creates a worker Machine of the MachineSet carrying a health mark, the templates
// "t" of the test kinds (RebootTemplate, PowerCycleTemplate, ResetTemplate), then runs before (when
// set), then creates the request with the chain.
func escalatingWorker(t *testing.T, g *WithT, before func(*fixture), chain ...caprv1.EscalationStep) *fixture {
	t.Helper()
	f := newFixture(t, g, nil)
	m := f.workerOfMachineSet(g, victim, func(m *clusterv1.Machine) {
		m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: `{"reason":"UnhealthyNode","checker":"test"}`}
	})
	for kind, spec := range map[string]map[string]any{
		"RebootTemplate":     {"mode": "soft"},
		"PowerCycleTemplate": {"force": true},
		"ResetTemplate":      {"wipe": false},
	} {
		tmpl := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": escalationGroupVersion, "kind": kind,
			"metadata": map[string]any{"namespace": f.ns, "name": "t"},
			"spec":     map[string]any{"template": map[string]any{"spec": spec}},
		}}
		g.Expect(k8sClient.Create(ctx, tmpl)).To(Succeed())
	}
	if before != nil {
		before(f)
	}
	f.request(g, m, nil, caprv1.MachineRemediationSourceHealthCheck, func(mr *caprv1.MachineRemediation) {
		mr.Spec.Escalation = chain
	})
	return f
}

// escalationObject returns the object of kind named after the victim Machine, nil when there is none.
func escalationObject(g Gomega, ns, kind string) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion(escalationGroupVersion)
	obj.SetKind(kind)
	err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim}, obj)
	if apierrors.IsNotFound(err) {
		return nil
	}
	g.Expect(err).NotTo(HaveOccurred())
	return obj
}

// TestEscalationFirstStepRecovers: the first step's object is created from its template; the
// Machine's mark going away ends the remediation: nothing deleted, the object cleaned up.
func TestEscalationFirstStepRecovers(t *testing.T) {
	g := NewWithT(t)
	f := markedWorker(t, g)

	var reboot *unstructured.Unstructured
	g.Eventually(func(g Gomega) *unstructured.Unstructured {
		reboot = escalationObject(g, f.ns, "Reboot")
		return reboot
	}, eventually, poll).ShouldNot(BeNil())
	g.Expect(reboot.Object["spec"]).To(Equal(map[string]any{"mode": "soft"}))
	g.Expect(reboot.GetAnnotations()).To(HaveKeyWithValue(worker.MachineAnnotation, victim))
	g.Expect(reboot.GetOwnerReferences()).To(HaveLen(1))
	g.Expect(reboot.GetOwnerReferences()[0].Kind).To(Equal("MachineRemediation"))
	g.Expect(reboot.GetOwnerReferences()[0].UID).To(Equal(getRemediation(g, f.ns, victim).UID))
	g.Expect(getMachine(g, f.ns, victim).Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation), "fencing Disabled: no deletion is worth holding")

	// The Machine recovers: its mark is removed (what the health checker does).
	patchMachine(g, f.ns, victim, func(m *clusterv1.Machine) { delete(m.Annotations, caprv1.UnhealthyAnnotation) })

	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, victim) }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	mr := getRemediation(g, f.ns, victim)
	g.Expect(mr.Status.Steps).To(HaveLen(1))
	g.Expect(mr.Status.Steps[0].Name).To(Equal(caprv1.EscalationStepName(0)))
	g.Expect(mr.Status.Steps[0].Outcome).To(Equal(caprv1.StepOutcomeSucceeded))
	g.Expect(mr.Status.Steps[0].Message).To(ContainSubstring("nothing deleted"))
	g.Expect(machineExists(g, f.ns, victim)).To(BeTrue())
	g.Expect(getMachine(g, f.ns, victim).Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation), "a recovered Machine is let go of")
	g.Expect(escalationObject(g, f.ns, "Reboot")).To(BeNil())
	g.Expect(escalationObject(g, f.ns, "PowerCycle")).To(BeNil())
}

// TestEscalationTimesOutThenReplaces: each step that times out has its object deleted before the
// next one's is created; after the last, the Machine is fenced (Disabled: skipped) and deleted.
func TestEscalationTimesOutThenReplaces(t *testing.T) {
	g := NewWithT(t)
	f := markedWorker(t, g)

	g.Eventually(func(g Gomega) *unstructured.Unstructured { return escalationObject(g, f.ns, "Reboot") }, eventually, poll).
		ShouldNot(BeNil())
	g.Eventually(func(g Gomega) *unstructured.Unstructured { return escalationObject(g, f.ns, "PowerCycle") }, eventually, poll).
		ShouldNot(BeNil())
	g.Expect(escalationObject(g, f.ns, "Reboot")).To(BeNil(), "the first step's object is gone before the second's exists")
	g.Expect(machineExists(g, f.ns, victim)).To(BeTrue())

	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, victim) }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(machineExists(g, f.ns, victim)).To(BeFalse())
	g.Expect(escalationObject(g, f.ns, "PowerCycle")).To(BeNil())
	mr := getRemediation(g, f.ns, victim)
	g.Expect(stepOutcomes(mr)).To(Equal([]string{"Escalate1=Failed", "Escalate2=Failed", "Fence=Skipped", "Delete=Succeeded"}))
	g.Expect(eventReasons(g, f.ns, victim)).To(ContainElement(worker.EventEscalationCreated))
}

// TestEscalationMissingTemplateIsReportedUntilItsTimeout: a step whose template does not exist says
// so in the condition, and after its timeout the chain goes on (here: fence and delete).
func TestEscalationMissingTemplateIsReportedUntilItsTimeout(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	m := f.workerOfMachineSet(g, victim, func(m *clusterv1.Machine) {
		m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: `{"reason":"UnhealthyNode","checker":"test"}`}
	})
	f.request(g, m, nil, caprv1.MachineRemediationSourceHealthCheck, func(mr *caprv1.MachineRemediation) {
		mr.Spec.Escalation = []caprv1.EscalationStep{
			{TemplateRef: caprv1.TemplateReference{APIVersion: escalationGroupVersion, Kind: "RebootTemplate", Name: "missing"}, TimeoutSeconds: 60},
		}
	})

	g.Eventually(func(g Gomega) {
		reason, msg := progressing(g, f.ns, victim)
		g.Expect(reason).To(Equal(caprv1.MachineRemediationWaitingForPreconditionsReason))
		g.Expect(msg).To(ContainSubstring("template RebootTemplate missing not found"))
	}, eventually, poll).Should(Succeed())
	g.Expect(machineExists(g, f.ns, victim)).To(BeTrue())

	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, victim) }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(getRemediation(g, f.ns, victim).Status.Step(caprv1.EscalationStepName(0)).Outcome).To(Equal(caprv1.StepOutcomeFailed))
	g.Expect(machineExists(g, f.ns, victim)).To(BeFalse())
}

// TestEscalationSkippedWithoutAMark: a request whose Machine carries no health mark (written by hand)
// cannot see a recovery: the chain is recorded Skipped and the Machine is fenced and deleted.
func TestEscalationSkippedWithoutAMark(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	m := f.workerOfMachineSet(g, victim)
	f.request(g, m, nil, caprv1.MachineRemediationSourceManual, func(mr *caprv1.MachineRemediation) {
		mr.Spec.Escalation = []caprv1.EscalationStep{
			{TemplateRef: caprv1.TemplateReference{APIVersion: escalationGroupVersion, Kind: "RebootTemplate", Name: "t"}, TimeoutSeconds: 60},
			{TemplateRef: caprv1.TemplateReference{APIVersion: escalationGroupVersion, Kind: "PowerCycleTemplate", Name: "t"}, TimeoutSeconds: 60},
		}
	})

	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, victim) }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	mr := getRemediation(g, f.ns, victim)
	g.Expect(stepOutcomes(mr)).To(Equal([]string{"Escalate1=Skipped", "Escalate2=Skipped", "Fence=Skipped", "Delete=Succeeded"}))
	g.Expect(machineExists(g, f.ns, victim)).To(BeFalse())
}

// TestEscalationLeavesAnObjectCAPRDidNotCreate: a Reboot named after the Machine exists before the
// remediation, made by someone else (no owner). It is not the step's object: the step says so and
// waits for its timeout without creating or deleting anything, the chain goes on (PowerCycle) and the
// Machine is replaced; the Reboot is still there, the same object, unchanged.
func TestEscalationLeavesAnObjectCAPRDidNotCreate(t *testing.T) {
	g := NewWithT(t)
	foreign := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"mode": "hard"}}}
	f := escalatingWorker(t, g, func(f *fixture) {
		foreign.SetAPIVersion(escalationGroupVersion)
		foreign.SetKind("Reboot")
		foreign.SetNamespace(f.ns)
		foreign.SetName(victim)
		g.Expect(k8sClient.Create(ctx, foreign)).To(Succeed())
	}, step("RebootTemplate"), step("PowerCycleTemplate"))

	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, victim) }, nextLook, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(machineExists(g, f.ns, victim)).To(BeFalse())
	reboot := escalationObject(g, f.ns, "Reboot")
	g.Expect(reboot).NotTo(BeNil(), "the Reboot CAPR did not create was deleted")
	g.Expect(reboot.GetUID()).To(Equal(foreign.GetUID()))
	g.Expect(reboot.Object["spec"]).To(Equal(map[string]any{"mode": "hard"}))
	g.Expect(escalationObject(g, f.ns, "PowerCycle")).To(BeNil(), "CAPR's own object of the next step is deleted as before")

	mr := getRemediation(g, f.ns, victim)
	g.Expect(stepOutcomes(mr)).To(Equal([]string{"Escalate1=Failed", "Escalate2=Failed", "Fence=Skipped", "Delete=Succeeded"}))
	g.Expect(mr.Status.Step(caprv1.EscalationStepName(0)).Message).To(ContainSubstring(
		"Reboot w1 is not the object CAPR created for this remediation (it has no controller; CAPR's is owned by MachineRemediation w1, UID " + string(mr.UID) + "): left alone, not deleted"))
	// While the step ran, the condition said so (the remediator's Warning event keeps what it said).
	g.Expect(eventNotes(g, f.ns, remediation.EventRemediationWaiting)).To(ContainSubstring(
		"step Escalate1: Reboot w1 exists but is not the object CAPR created for this remediation"))
	g.Expect(eventNotes(g, f.ns, worker.EventEscalationObjectLeft)).To(ContainSubstring("Reboot w1 is not the object CAPR created"))
	g.Expect(eventNotes(g, f.ns, worker.EventEscalationCreated)).NotTo(ContainSubstring("Created Reboot"))
}

// TestEscalationStepOfAKindCAPRMayNotDelete: a step from a KubeadmControlPlaneTemplate, a kind CAPR's
// role lets it neither read nor create, whose objects (KubeadmControlPlanes) it may read but not
// delete. The template cannot be read: reported until the step's timeout; then there is nothing
// under the name (CAPR created nothing) and the chain goes on: the Machine is replaced. Before, the
// step's end deleted a KubeadmControlPlane by the Machine's name, which the API server refused, and
// the request failed every reconcile from then on with no condition saying why.
func TestEscalationStepOfAKindCAPRMayNotDelete(t *testing.T) {
	g := NewWithT(t)
	f := escalatingWorker(t, g, nil, caprv1.EscalationStep{TemplateRef: caprv1.TemplateReference{
		APIVersion: "controlplane.cluster.x-k8s.io/v1beta2", Kind: "KubeadmControlPlaneTemplate", Name: "t",
	}, TimeoutSeconds: 60})

	g.Eventually(func(g Gomega) {
		reason, msg := progressing(g, f.ns, victim)
		g.Expect(reason).To(Equal(caprv1.MachineRemediationWaitingForPreconditionsReason))
		g.Expect(msg).To(ContainSubstring("cannot create KubeadmControlPlane w1"))
		g.Expect(msg).To(ContainSubstring("forbidden"))
	}, eventually, poll).Should(Succeed())
	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, victim) }, nextLook, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded), func() string { return getRemediation(g, f.ns, victim).Status.LastError })
	g.Expect(machineExists(g, f.ns, victim)).To(BeFalse())
	g.Expect(stepOutcomes(getRemediation(g, f.ns, victim))).To(Equal([]string{"Escalate1=Failed", "Fence=Skipped", "Delete=Succeeded"}))
}

// TestEscalationObjectCAPRMayNotDelete: CAPR's role lets it create Resets but not delete them
// (testdata/escalation_role.yaml). When the step times out, its Reset cannot be deleted: the step
// says so (EscalationObjectNotDeleted, naming the verb and the ClusterRole label) and retries for one
// more timeout, the Machine kept; then the remediation goes on without it (the Machine is replaced)
// and the Reset is left, owned by the request, with a Warning event.
func TestEscalationObjectCAPRMayNotDelete(t *testing.T) {
	g := NewWithT(t)
	f := escalatingWorker(t, g, nil, step("ResetTemplate"))

	g.Eventually(func(g Gomega) {
		reason, msg := progressing(g, f.ns, victim)
		g.Expect(reason).To(Equal(caprv1.MachineRemediationEscalationObjectNotDeletedReason), msg)
		g.Expect(msg).To(ContainSubstring("Reset w1, which CAPR created for this remediation, cannot be deleted"))
		g.Expect(msg).To(ContainSubstring("remediation.cluster.x-k8s.io/aggregate-to-manager"))
		g.Expect(machineExists(g, f.ns, victim)).To(BeTrue(), "replaced while its Reset may still act")
	}, nextLook, poll).Should(Succeed())
	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, victim) }, nextLook, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(machineExists(g, f.ns, victim)).To(BeFalse())
	mr := getRemediation(g, f.ns, victim)
	g.Expect(stepOutcomes(mr)).To(Equal([]string{"Escalate1=Failed", "Fence=Skipped", "Delete=Succeeded"}))
	g.Expect(mr.Status.Step(caprv1.EscalationStepName(0)).Message).To(ContainSubstring("cannot be deleted"))
	reset := escalationObject(g, f.ns, "Reset")
	g.Expect(reset).NotTo(BeNil())
	g.Expect(reset.GetOwnerReferences()).To(ConsistOf(HaveField("UID", mr.UID)), "the garbage collector deletes it with the request")
	g.Expect(eventNotes(g, f.ns, worker.EventEscalationObjectLeft)).To(ContainSubstring("Reset w1, which CAPR created for this remediation, cannot be deleted"))
}

// eventNotes returns the notes of the events with reason recorded on the victim's MachineRemediation,
// one a line.
func eventNotes(g Gomega, ns, reason string) string {
	list := &eventsv1.EventList{}
	g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == "MachineRemediation" && e.Regarding.Name == victim && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return strings.Join(out, "\n")
}

// stepOutcomes lists the recorded steps as name=outcome.
func stepOutcomes(mr *caprv1.MachineRemediation) []string {
	out := make([]string, 0, len(mr.Status.Steps))
	for _, s := range mr.Status.Steps {
		out = append(out, string(s.Name)+"="+string(s.Outcome))
	}
	return out
}
