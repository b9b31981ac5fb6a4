//go:build envtest

package worker_test

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	capienv "github.com/capr-io/capr/test/envtest"
)

// TestHealthCheckMarksWorkerWithinTriggerIfAndItIsReplaced: CAPR's own health checker and the worker
// remediator together. With two of three workers unhealthy and triggerIf allowing one, both are marked
// and nothing is requested or deleted; when one recovers, the other is requested, fenced and deleted.
func TestHealthCheckMarksWorkerWithinTriggerIfAndItIsReplaced(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	f.workerWithNode(g, "w1", corev1.ConditionFalse)
	f.workerWithNode(g, "w2", corev1.ConditionFalse)
	f.workerWithNode(g, "w3", corev1.ConditionTrue)
	f.caprHealthCheck(g, &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromInt32(1))})

	g.Eventually(func(g Gomega) {
		for _, name := range []string{"w1", "w2"} {
			g.Expect(conditions.IsFalse(getMachine(g, f.ns, name), caprv1.MachineCAPRHealthCheckSucceededCondition)).To(BeTrue())
		}
	}, eventually, poll).Should(Succeed())
	g.Consistently(func(g Gomega) {
		for _, name := range []string{"w1", "w2", "w3"} {
			g.Expect(remediationExists(g, f.ns, name)).To(BeFalse())
			g.Expect(machineExists(g, f.ns, name)).To(BeTrue())
		}
	}, quiet, poll).Should(Succeed())

	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.node("w2"), corev1.ConditionTrue)).To(Succeed())
	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, "w1") }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(machineExists(g, f.ns, "w1")).To(BeFalse())
	g.Expect(getRemediation(g, f.ns, "w1").Spec.Source).To(Equal(caprv1.MachineRemediationSourceHealthCheck))
	for _, name := range []string{"w2", "w3"} {
		g.Expect(machineExists(g, f.ns, name)).To(BeTrue())
		g.Expect(remediationExists(g, f.ns, name)).To(BeFalse())
	}
}

// TestAMarkIsOneMachineWrite: the health checker marks a Machine with one write, its condition in
// the status (as CAPI's MachineHealthCheck does), and no annotation. triggerIf allows no
// remediation, so that nothing else in the manager writes the Machine.
func TestAMarkIsOneMachineWrite(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	f.workerWithNode(g, "w", corev1.ConditionTrue)
	f.caprHealthCheck(g, &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromInt32(0))})
	path := fmt.Sprintf("/apis/%s/namespaces/%s/machines/w", clusterv1.GroupVersion.String(), f.ns)
	writes := func() int { return requests.WritesTo(path) }
	g.Eventually(func(g Gomega) {
		g.Expect(conditions.IsTrue(getMachine(g, f.ns, "w"), caprv1.MachineCAPRHealthCheckSucceededCondition)).To(BeTrue())
	}, eventually, poll).Should(Succeed())
	// A write is counted when its response has come back, which may be after the test saw its effect.
	g.Eventually(writes, eventually, poll).Should(Equal(1), "reporting the Machine healthy is one write")
	g.Consistently(writes, quiet, poll).Should(Equal(1), "reporting the Machine healthy is one write")

	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.node("w"), corev1.ConditionFalse)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(conditions.IsFalse(getMachine(g, f.ns, "w"), caprv1.MachineCAPRHealthCheckSucceededCondition)).To(BeTrue())
	}, eventually, poll).Should(Succeed())
	g.Eventually(writes, eventually, poll).Should(Equal(2), "the mark is one more write")
	g.Consistently(writes, quiet, poll).Should(Equal(2), "the mark is one more write")
	g.Expect(getMachine(g, f.ns, "w").Annotations).NotTo(HaveKey(caprv1.UnhealthyAnnotation))
}

// caprHealthCheck creates CAPR's MachineHealthCheck over the pool (Node not Ready for 1 s).
func (f *fixture) caprHealthCheck(g *WithT, triggerIf *caprv1.MachineHealthCheckRemediationTriggerIf) {
	mhc := capienv.NewHealthCheck(f.ns, f.cluster.Name, "a", 1)
	mhc.Spec.Remediation.TriggerIf = triggerIf
	g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())
}

// TestRemediateMachineAnnotationRemediatesAWorker: CAPI's cluster.x-k8s.io/remediate-machine on a
// healthy worker (a health check's target) starts a Manual remediation: it is fenced and deleted.
func TestRemediateMachineAnnotationRemediatesAWorker(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	f.workerWithNode(g, "asked", corev1.ConditionTrue)
	f.workerWithNode(g, "other", corev1.ConditionTrue)
	f.caprHealthCheck(g, nil)
	// Both evaluated healthy first: a request made wrongly would follow in the next round.
	g.Eventually(func(g Gomega) {
		for _, n := range []string{"asked", "other"} {
			g.Expect(conditions.IsTrue(getMachine(g, f.ns, n), caprv1.MachineCAPRHealthCheckSucceededCondition)).To(BeTrue(), n)
		}
	}, eventually, poll).Should(Succeed())
	g.Consistently(func(g Gomega) bool { return remediationExists(g, f.ns, "asked") }, quiet, poll).Should(BeFalse())

	patchMachine(g, f.ns, "asked", func(m *clusterv1.Machine) {
		m.Annotations = map[string]string{clusterv1.RemediateMachineAnnotation: ""}
	})
	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, "asked") }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(getRemediation(g, f.ns, "asked").Spec.Source).To(Equal(caprv1.MachineRemediationSourceManual))
	g.Expect(machineExists(g, f.ns, "asked")).To(BeFalse())
	g.Expect(machineExists(g, f.ns, "other")).To(BeTrue())
	g.Expect(remediationExists(g, f.ns, "other")).To(BeFalse())
}
