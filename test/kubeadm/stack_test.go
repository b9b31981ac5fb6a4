package kubeadm_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// TestKubeadmControlPlaneComesUp creates a cluster of one control-plane Machine on the real
// KubeadmControlPlane: CABPK writes its bootstrap data, the sandbox plays kubeadm init on real etcd,
// CAPI's Machine controller links the Machine to its Node, and KCP's own health checks (static pods,
// the etcd member through the port-forward) report it healthy. KCP's admission refuses an even
// replica count with stacked etcd. (Joins, KCP creating Machines one at a time, are in every scenario
// of three or five Machines; one Machine keeps this check short.)
func TestKubeadmControlPlaneComesUp(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "up")
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "up", ControlPlane: 1})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })

	g.Eventually(func(g Gomega) {
		machines, err := sb.ControlPlaneMachines(ctx, wc)
		g.Expect(err).NotTo(HaveOccurred())
		for i := range machines {
			for _, c := range []string{
				controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition,
				controlplanev1.KubeadmControlPlaneMachineControllerManagerPodHealthyCondition,
				controlplanev1.KubeadmControlPlaneMachineSchedulerPodHealthyCondition,
				controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition,
				controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition,
			} {
				g.Expect(conditions.IsTrue(&machines[i], c)).To(BeTrue(), "%s of %s", c, machines[i].Name)
			}
		}
	}, time.Minute, time.Second).Should(Succeed())

	kcp := &controlplanev1.KubeadmControlPlane{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "up-cp"}, kcp)).To(Succeed())
	base := kcp.DeepCopy()
	kcp.Spec.Replicas = new(int32(2))
	err = sb.Client.Patch(ctx, kcp, client.MergeFrom(base))
	g.Expect(err).To(MatchError(ContainSubstring("cannot be an even number when etcd is stacked")))

	cluster := &clusterv1.Cluster{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "up"}, cluster)).To(Succeed())
	g.Expect(conditions.IsTrue(cluster, clusterv1.ClusterControlPlaneInitializedCondition)).To(BeTrue())
}
