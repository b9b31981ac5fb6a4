package kubeadm_test

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/controlplane"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// remediationTimeout bounds one control-plane remediation on KCP: KCP creates and deletes one Machine
// at a time with its own fixed requeues (15-30 s), and a surge of two adds and removes two.
const remediationTimeout = 8 * time.Minute

// TestKCPNodeNotReadyMemberHealthySurgesByTwo: a control-plane Node stops renewing its Lease (the
// real node lifecycle controller marks it Ready=Unknown) while its etcd member stays healthy. KCP's
// admission refuses 4 replicas with stacked etcd, so CAPR surges 3 → 5: both replacements vote before
// the victim's member is removed, then KCP scales back to 3, deleting the victim first. The failure
// margin never drops below one.
func TestKCPNodeNotReadyMemberHealthySurgesByTwo(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "kcp-hb")
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: 3})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sb.Client.Create(ctx, sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2))).To(Succeed())
	check, err := sandbox.WriteData(ctx, wc, 50)
	g.Expect(err).NotTo(HaveOccurred())
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	victim := machines[1]
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	quorum := sb.WatchQuorum(ctx, wc)

	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	mr := &caprv1.MachineRemediation{}
	g.Eventually(func(g Gomega) {
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim.Name}, mr)).To(Succeed())
		if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
			StopTrying(fmt.Sprintf("remediation failed: %v", mr.Status.Conditions)).Now()
		}
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
	}, remediationTimeout, time.Second).Should(Succeed())
	g.Expect(sb.WaitForControlPlane(ctx, wc, 3, 2*time.Minute)).To(Succeed())

	_, lost := quorum.Stop()
	g.Expect(lost).To(BeEmpty())
	minMargin, when, _ := quorum.Margin()
	g.Expect(minMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", minMargin, when)
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst))
	g.Expect(mr.Status.ControlPlane.Surge).To(Equal(int32(2)))
	g.Expect(stepNames(mr)).To(Equal(controlplane.StepsFor(caprv1.ControlPlaneOrderScaleUpFirst)))
	g.Expect(check()).To(Succeed())

	kcp := &controlplanev1.KubeadmControlPlane{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "wc-cp"}, kcp)).To(Succeed())
	g.Expect(*kcp.Spec.Replicas).To(Equal(int32(3)))
	g.Expect(kcp.Annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
	g.Expect(kcp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	machines, err = sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	for _, m := range machines {
		g.Expect(m.Name).NotTo(Equal(victim.Name))
	}
}

func stepNames(mr *caprv1.MachineRemediation) []caprv1.StepName {
	out := make([]caprv1.StepName, 0, len(mr.Status.Steps))
	for _, s := range mr.Status.Steps {
		out = append(out, s.Name)
	}
	return out
}
