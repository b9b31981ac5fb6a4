package kubeadm_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/test/kubeadm"
	"github.com/capr-io/capr/test/sandbox"
)

// TestKCPNodeNotReadyMemberHealthySurgesByTwo: a control-plane Node stops renewing its Lease (the
// real node lifecycle controller marks it Ready=Unknown) while its etcd member stays healthy. KCP's
// admission refuses 4 replicas with stacked etcd, so CAPR surges 3 → 5: both replacements vote before
// the victim's member is removed, then KCP scales back to 3, deleting the victim first. The failure
// margin never drops below one.
func TestKCPNodeNotReadyMemberHealthySurgesByTwo(t *testing.T) {
	var victim string
	res := kubeadm.RunScenario(ctx, t, sb, "kcp-hb", kubeadm.Scenario{ControlPlane: 3,
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			victim = machines[1].Name
			return []string{victim}, sb.StopHeartbeat(ctx, wc, machines[1].Status.NodeRef.Name)
		}})
	g := NewWithT(t)
	g.Expect(res.MinMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	mr := res.Remediations[victim]
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst))
	g.Expect(mr.Status.ControlPlane.Surge).To(Equal(int32(2)))
	g.Expect(kubeadm.StepNames(mr)).To(Equal(controlplane.StepsFor(caprv1.ControlPlaneOrderScaleUpFirst)))
}

// TestKCPTwoOfFiveDeadNeverDeadlocks: two of five etcd members crash. KCP scales down only when
// every other control-plane Machine is healthy, so a surge would never be undone while the second
// victim is broken (the deadlock of a surge with KCP). CAPR removes the first victim's member,
// deletes it without a surge (DeleteFirst) and KCP replaces it under its relaxed preflight; then
// the second, the same way or with a surge once nothing else is unhealthy.
func TestKCPTwoOfFiveDeadNeverDeadlocks(t *testing.T) {
	var victims []string
	res := kubeadm.RunScenario(ctx, t, sb, "kcp-2of5", kubeadm.Scenario{ControlPlane: 5,
		Inject: func(_ context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			a, b := machines[0], machines[3]
			sb.KillEtcdMember(wc, a.Status.NodeRef.Name)
			sb.KillEtcdMember(wc, b.Status.NodeRef.Name)
			victims = []string{a.Name, b.Name}
			return victims, nil
		}})
	g := NewWithT(t)
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	first := 0
	if res.Remediations[victims[1]].Status.StartTime.Before(res.Remediations[victims[0]].Status.StartTime) {
		first = 1
	}
	g.Expect(res.Remediations[victims[first]].Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderDeleteFirst),
		res.Remediations[victims[first]].Status.ControlPlane.OrderReason)
}
