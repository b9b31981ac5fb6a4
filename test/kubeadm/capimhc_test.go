package kubeadm_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// These tests run CAPI's own MachineHealthCheck reconciler (v1.14.2, in the sandbox's core manager)
// with its remediation delegated to CAPR through spec.remediation.templateRef: CAPI creates a
// MachineRemediation named after the unhealthy Machine from CAPR's MachineRemediationTemplate, and
// deletes it when the Machine looks healthy again. There is no CAPR health check here.

// capiHealthCheckCluster creates a KCP cluster with CAPI's MachineHealthCheck on its control plane (a
// Node not Ready for 2 s) pointing at a CAPR template, and starts CAPR.
func capiHealthCheckCluster(t *testing.T, name string) (*sandbox.WorkloadCluster, []clusterv1.Machine) {
	t.Helper()
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, name)
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: 3})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	template := &caprv1.MachineRemediationTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "capr"},
		Spec: caprv1.MachineRemediationTemplateSpec{Template: caprv1.MachineRemediationTemplateResource{Spec: caprv1.MachineRemediationSpec{
			Fencing: &caprv1.FencingSpec{Policy: caprv1.FencingDisabled},
		}}},
	}
	g.Expect(sb.Client.Create(ctx, template)).To(Succeed())
	notReady := func(status corev1.ConditionStatus) clusterv1.UnhealthyNodeCondition {
		return clusterv1.UnhealthyNodeCondition{Type: corev1.NodeReady, Status: status, TimeoutSeconds: ptr.To(int32(2))}
	}
	mhc := &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cp"},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: wc.Name,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}},
			Checks: clusterv1.MachineHealthCheckChecks{
				UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{notReady(corev1.ConditionUnknown), notReady(corev1.ConditionFalse)},
			},
			Remediation: clusterv1.MachineHealthCheckRemediation{TemplateRef: clusterv1.MachineHealthCheckRemediationTemplateReference{
				APIVersion: caprv1.GroupVersion.String(), Kind: "MachineRemediationTemplate", Name: template.Name,
			}},
		},
	}
	g.Expect(sb.Client.Create(ctx, mhc)).To(Succeed())
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	return wc, machines
}

// expectKCPAtRest checks KCP is back at 3 replicas, 3 Machines, and neither CAPR's lock nor KCP's
// remediation-in-progress is left.
func expectKCPAtRest(g Gomega, wc *sandbox.WorkloadCluster) {
	g.Eventually(func(g Gomega) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: "wc-cp"}, kcp)).To(Succeed())
		g.Expect(ptr.Deref(kcp.Spec.Replicas, 0)).To(BeEquivalentTo(3))
		g.Expect(kcp.Annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
		g.Expect(kcp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	}, 3*time.Minute, time.Second).Should(Succeed())
	g.Expect(sb.WaitForControlPlane(ctx, wc, 3, 5*time.Minute)).To(Succeed())
}

// TestCAPIMachineHealthCheckDrivesCAPR: a control-plane Node stops reporting; CAPI's
// MachineHealthCheck creates the MachineRemediation from CAPR's template and CAPR replaces the
// Machine on KCP (surge by two), quorum never lost. `make test-kcp` runs it; `make test` leaves it out
// (hack/test-levels.sh; the claims resting on it: docs/developer/testing.md#ci).
func TestCAPIMachineHealthCheckDrivesCAPR(t *testing.T) {
	g := NewWithT(t)
	wc, machines := capiHealthCheckCluster(t, "capi-mhc")
	quorum := sb.WatchQuorum(ctx, wc)
	victim := machines[0]
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())

	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim.Name}, mr)).To(Succeed())
		if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
			StopTrying("remediation failed").Now()
		}
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
		g.Expect(mr.Status.ControlPlane.Surge).To(Equal(int32(2)))
	}, 10*time.Minute, time.Second).Should(Succeed())
	expectKCPAtRest(g, wc)
	_, lost := quorum.Stop()
	g.Expect(lost).To(BeEmpty())
	now, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(now).NotTo(ContainElement(HaveField("Name", victim.Name)))
}

// TestCAPIMachineHealthCheckRecoveryAbortsCAPR: the Node stops reporting, CAPR starts (its
// replacements cannot come up), then the Node reports again. CAPI's MachineHealthCheck deletes the
// request; CAPR, before its point of no return, undoes what it did (replacements deleted, KCP back at
// 3, lock and KCP's annotation cleared) and lets the request go: nothing is left behind.
func TestCAPIMachineHealthCheckRecoveryAbortsCAPR(t *testing.T) {
	g := NewWithT(t)
	wc, machines := capiHealthCheckCluster(t, "capi-mhc-abort")
	recoverDuringSurge(g, wc, machines[0])
	expectKCPAtRest(g, wc)
	now, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(now).To(ConsistOf(HaveField("Name", machines[0].Name), HaveField("Name", machines[1].Name), HaveField("Name", machines[2].Name)),
		"the original Machines, and only them")
}

// recoverDuringSurge stops the victim's heartbeat with provisioning held, waits until CAPR runs
// WaitForReplacement with a replacement created, lets the Node report again, waits until CAPI's
// MachineHealthCheck has deleted the request and CAPR let it go, and releases provisioning.
func recoverDuringSurge(g Gomega, wc *sandbox.WorkloadCluster, victim clusterv1.Machine) {
	sb.HoldProvisioning(wc, true)
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim.Name}, mr)).To(Succeed())
		g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.StepWaitForReplacement))
		now, err := sb.ControlPlaneMachines(ctx, wc)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(len(now)).To(BeNumerically(">", 3), "a replacement exists")
	}, 5*time.Minute, time.Second).Should(Succeed())

	g.Expect(sb.ResumeHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim.Name}, &caprv1.MachineRemediation{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the request is still there: %v", err)
	}, 3*time.Minute, time.Second).Should(Succeed())
	sb.HoldProvisioning(wc, false)
}
