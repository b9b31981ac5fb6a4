package more_test

import (
	"context"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/test/kubeadm"
	"github.com/capr-io/capr/test/sandbox"
)

// TestKCPDeadMemberRemovesFirst: the victim's etcd process dies (its Node is fine). Adding a voter
// first would need 3 healthy of 4, so CAPR removes the dead member first, then surges by two.
func TestKCPDeadMemberRemovesFirst(t *testing.T) {
	var victim string
	res := kubeadm.RunScenario(ctx, t, sb, "kcp-dead", kubeadm.Scenario{ControlPlane: 3,
		Inject: func(_ context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			victim = machines[0].Name
			sb.KillEtcdMember(wc, machines[0].Status.NodeRef.Name)
			return []string{victim}, nil
		}})
	g := NewWithT(t)
	mr := res.Remediations[victim]
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderRemoveMemberFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(mr.Status.ControlPlane.Surge).To(Equal(int32(2)))
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
}

// TestKCPLeaderKubeletDead: the kubelet of the etcd leader's Node dies; the leader runs but cannot be
// reached through the API server (KCP cannot move leadership off it: CAPI #8465, #12711). An
// unreachable member counts as unhealthy, so adding a voter first is not quorum-safe (and KCP's own
// scale-up preflight, which cannot reach that member either, would refuse it too): CAPR removes the
// member first (through another member: etcd steps the leader down), then surges, and
// KCP deletes the victim. The margin goes to 0 while two members remain, as with KCP's own remediation.
func TestKCPLeaderKubeletDead(t *testing.T) {
	var victim string
	res := kubeadm.RunScenario(ctx, t, sb, "kcp-leader", kubeadm.Scenario{ControlPlane: 3,
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			state, err := sb.EtcdState(ctx, wc)
			if err != nil {
				return nil, err
			}
			leader := state.ByID(state.LeaderID)
			if leader == nil {
				return nil, errors.New("no etcd leader")
			}
			for _, m := range machines {
				if m.Status.NodeRef.Name == leader.Name {
					victim = m.Name
					return []string{victim}, sb.StopKubelet(ctx, wc, leader.Name)
				}
			}
			return nil, errors.New("no Machine for the leader")
		}})
	g := NewWithT(t)
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	mr := res.Remediations[victim]
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderRemoveMemberFirst), mr.Status.ControlPlane.OrderReason)
}
