package worker_test

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

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
	mhc := &caprv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "hc"},
		Spec: caprv1.MachineHealthCheckSpec{
			ClusterName: f.cluster.Name,
			Selector:    caprv1.MachineSelector{MatchLabels: map[string]string{"pool": "a"}},
			Checks: caprv1.MachineHealthCheckChecks{
				NodeStartupTimeoutSeconds: ptr.To[int32](0),
				UnhealthyNodeConditions: []caprv1.UnhealthyNodeCondition{
					{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To[int32](1)},
				},
			},
			Remediation: caprv1.MachineHealthCheckRemediation{
				TriggerIf: &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromInt32(1))},
			},
		},
	}
	g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())

	g.Eventually(func(g Gomega) {
		for _, name := range []string{"w1", "w2"} {
			g.Expect(getMachine(g, f.ns, name).Annotations).To(HaveKey(caprv1.UnhealthyAnnotation))
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
