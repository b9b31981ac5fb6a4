//go:build envtest

package worker_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	capienv "github.com/capr-io/capr/test/envtest"
)

// capiHealthCheck creates a MachineRemediationTemplate with spec and a cluster.x-k8s.io/v1beta2
// MachineHealthCheck (CAPI's own, run by CAPI's reconciler) over the pool, pointing at it.
func (f *fixture) capiHealthCheck(g *WithT, spec caprv1.MachineRemediationSpec) {
	tmpl := &caprv1.MachineRemediationTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "worker"},
		Spec:       caprv1.MachineRemediationTemplateSpec{Template: caprv1.MachineRemediationTemplateResource{Spec: spec}},
	}
	g.Expect(k8sClient.Create(ctx, tmpl)).To(Succeed())
	mhc := &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "capi"},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: f.cluster.Name,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}},
			Checks: clusterv1.MachineHealthCheckChecks{
				NodeStartupTimeoutSeconds: ptr.To[int32](600),
				UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{
					{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To[int32](1)},
				},
			},
			Remediation: clusterv1.MachineHealthCheckRemediation{TemplateRef: clusterv1.MachineHealthCheckRemediationTemplateReference{
				APIVersion: caprv1.GroupVersion.String(), Kind: "MachineRemediationTemplate", Name: "worker",
			}},
		},
	}
	g.Expect(k8sClient.Create(ctx, mhc)).To(Succeed())
}

// workerWithNode creates a worker Machine of the MachineSet and its Node in the workload cluster
// (the envtest API server), Ready as given since an hour ago.
func (f *fixture) workerWithNode(g *WithT, name string, ready corev1.ConditionStatus) {
	f.workerOfMachineSet(g, name)
	g.Expect(capienv.CreateNode(ctx, k8sClient, capienv.NewNode(f.node(name), ready, time.Now().Add(-time.Hour)))).To(Succeed())
}

// TestCAPIMachineHealthCheckDrivesWorkerRemediation: CAPI's own MachineHealthCheck, pointing at a
// MachineRemediationTemplate, creates the request for an unhealthy worker; CAPR fences (Disabled) and
// deletes it; the healthy worker gets no request.
func TestCAPIMachineHealthCheckDrivesWorkerRemediation(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	f.workerWithNode(g, "sick", corev1.ConditionFalse)
	f.workerWithNode(g, "healthy", corev1.ConditionTrue)
	f.capiHealthCheck(g, caprv1.MachineRemediationSpec{})

	g.Eventually(func(g Gomega) caprv1.RemediationPhase { return phase(g, f.ns, "sick") }, eventually, poll).
		Should(Equal(caprv1.MachineRemediationPhaseSucceeded))
	g.Expect(machineExists(g, f.ns, "sick")).To(BeFalse())
	mr := getRemediation(g, f.ns, "sick")
	g.Expect(mr.Annotations).To(HaveKey(clusterv1.TemplateClonedFromNameAnnotation), "created by CAPI from the template")
	g.Expect(mr.Status.Step(caprv1.StepDelete)).NotTo(BeNil())
	g.Consistently(func(g Gomega) bool { return remediationExists(g, f.ns, "healthy") }, quiet, poll).Should(BeFalse())
	g.Expect(machineExists(g, f.ns, "healthy")).To(BeTrue())
}

// TestCAPIMachineHealthCheckDeletesTheRequestOnRecovery: while CAPR waits for Required fencing, the
// Node reports Ready again; CAPI's MachineHealthCheck deletes the request and CAPR stops cleanly: the
// Machine is kept, the unfence hook called, the request gone.
func TestCAPIMachineHealthCheckDeletesTheRequestOnRecovery(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, g, nil)
	f.workerWithNode(g, "sick", corev1.ConditionFalse)
	f.capiHealthCheck(g, caprv1.MachineRemediationSpec{Fencing: required()})

	g.Eventually(func(g Gomega) string {
		reason, _ := progressing(g, f.ns, "sick")
		return reason
	}, eventually, poll).Should(Equal(caprv1.MachineRemediationWaitingForFencingReason))
	g.Expect(capienv.SetNodeReady(ctx, k8sClient, f.node("sick"), corev1.ConditionTrue)).To(Succeed())

	g.Eventually(func(g Gomega) bool { return remediationExists(g, f.ns, "sick") }, eventually, poll).Should(BeFalse())
	g.Expect(backend.wasUnfenced(f.node("sick"))).To(BeTrue())
	g.Consistently(func(g Gomega) {
		g.Expect(machineExists(g, f.ns, "sick")).To(BeTrue())
		g.Expect(getMachine(g, f.ns, "sick").DeletionTimestamp.IsZero()).To(BeTrue())
	}, quiet, poll).Should(Succeed())
}
