package kubeadm_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/controlplane"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// remediationTimeout bounds the remediations of one scenario on KCP: KCP creates and deletes one
// Machine at a time with its own fixed requeues (15-30 s), and a surge of two adds and removes two.
const remediationTimeout = 10 * time.Minute

// kcpScenario is a fault on a KCP cluster and what CAPR must do about it.
type kcpScenario struct {
	controlPlane int32
	// inject breaks the cluster and returns the Machines that must be remediated.
	inject func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error)
}

// kcpResult is what a scenario left behind.
type kcpResult struct {
	remediations map[string]*caprv1.MachineRemediation
	minMargin    int
	minMarginAt  string
}

// runKCPScenario creates a KCP cluster with a CAPR health check, injects the fault, waits until
// every victim's remediation succeeded and the control plane is whole again, and checks what must
// hold on every KCP scenario: no quorum loss, the data still there, KCP back at its replicas with no
// annotation of CAPR's or of KCP's remediation left, no victim left.
func runKCPScenario(t *testing.T, name string, sc kcpScenario) kcpResult {
	t.Helper()
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, name)
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: sc.controlPlane})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	g.Expect(sb.Client.Create(ctx, sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2))).To(Succeed())
	check, err := sandbox.WriteData(ctx, wc, 50)
	g.Expect(err).NotTo(HaveOccurred())
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	quorum := sb.WatchQuorum(ctx, wc)
	running := sb.WatchRunning(ctx, wc)

	victims, err := sc.inject(ctx, wc, machines)
	g.Expect(err).NotTo(HaveOccurred())
	res := kcpResult{remediations: map[string]*caprv1.MachineRemediation{}}
	g.Eventually(func(g Gomega) {
		for _, v := range victims {
			mr := &caprv1.MachineRemediation{}
			g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: v}, mr)).To(Succeed())
			if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
				StopTrying(fmt.Sprintf("remediation of %s failed: %v", v, mr.Status.Conditions)).Now()
			}
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "%s: step %s: %v", v, mr.Status.CurrentStep, mr.Status.Conditions)
			res.remediations[v] = mr
		}
	}, remediationTimeout, time.Second).Should(Succeed())
	g.Expect(sb.WaitForControlPlane(ctx, wc, int(sc.controlPlane), 3*time.Minute)).To(Succeed())

	_, lost := quorum.Stop()
	g.Expect(lost).To(BeEmpty())
	g.Expect(running.Stop()).To(BeEmpty(), "two control-plane remediations ran at once")
	res.minMargin, res.minMarginAt, _ = quorum.Margin()
	g.Expect(check()).To(Succeed())

	kcp := &controlplanev1.KubeadmControlPlane{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "wc-cp"}, kcp)).To(Succeed())
	g.Expect(*kcp.Spec.Replicas).To(Equal(sc.controlPlane))
	g.Expect(kcp.Annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
	g.Expect(kcp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	machines, err = sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	for _, m := range machines {
		g.Expect(victims).NotTo(ContainElement(m.Name))
	}
	return res
}

// TestKCPNodeNotReadyMemberHealthySurgesByTwo: a control-plane Node stops renewing its Lease (the
// real node lifecycle controller marks it Ready=Unknown) while its etcd member stays healthy. KCP's
// admission refuses 4 replicas with stacked etcd, so CAPR surges 3 → 5: both replacements vote before
// the victim's member is removed, then KCP scales back to 3, deleting the victim first. The failure
// margin never drops below one.
func TestKCPNodeNotReadyMemberHealthySurgesByTwo(t *testing.T) {
	var victim string
	res := runKCPScenario(t, "kcp-hb", kcpScenario{controlPlane: 3,
		inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			victim = machines[1].Name
			return []string{victim}, sb.StopHeartbeat(ctx, wc, machines[1].Status.NodeRef.Name)
		}})
	g := NewWithT(t)
	g.Expect(res.minMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", res.minMargin, res.minMarginAt)
	mr := res.remediations[victim]
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst))
	g.Expect(mr.Status.ControlPlane.Surge).To(Equal(int32(2)))
	g.Expect(stepNames(mr)).To(Equal(controlplane.StepsFor(caprv1.ControlPlaneOrderScaleUpFirst)))
}

// TestKCPTwoOfFiveDeadNeverDeadlocks: two of five etcd members crash. KCP scales down only when
// every other control-plane Machine is healthy, so a surge would never be undone while the second
// victim is broken (the deadlock of a surge with KCP). CAPR removes the first victim's member,
// deletes it without a surge (DeleteFirst) and KCP replaces it under its relaxed preflight; then
// the second, the same way or with a surge once nothing else is unhealthy.
func TestKCPTwoOfFiveDeadNeverDeadlocks(t *testing.T) {
	var victims []string
	res := runKCPScenario(t, "kcp-2of5", kcpScenario{controlPlane: 5,
		inject: func(_ context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			a, b := machines[0], machines[3]
			sb.KillEtcdMember(wc, a.Status.NodeRef.Name)
			sb.KillEtcdMember(wc, b.Status.NodeRef.Name)
			victims = []string{a.Name, b.Name}
			return victims, nil
		}})
	g := NewWithT(t)
	g.Expect(res.minMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.minMargin, res.minMarginAt)
	first := 0
	if res.remediations[victims[1]].Status.StartTime.Before(res.remediations[victims[0]].Status.StartTime) {
		first = 1
	}
	g.Expect(res.remediations[victims[first]].Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderDeleteFirst),
		res.remediations[victims[first]].Status.ControlPlane.OrderReason)
}

// TestKCPDeadMemberRemovesFirst: the victim's etcd process dies (its Node is fine). Adding a voter
// first would need 3 healthy of 4, so CAPR removes the dead member first, then surges by two.
func TestKCPDeadMemberRemovesFirst(t *testing.T) {
	var victim string
	res := runKCPScenario(t, "kcp-dead", kcpScenario{controlPlane: 3,
		inject: func(_ context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			victim = machines[0].Name
			sb.KillEtcdMember(wc, machines[0].Status.NodeRef.Name)
			return []string{victim}, nil
		}})
	g := NewWithT(t)
	mr := res.remediations[victim]
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderRemoveMemberFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(mr.Status.ControlPlane.Surge).To(Equal(int32(2)))
	g.Expect(res.minMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.minMargin, res.minMarginAt)
}

// TestKCPLeaderKubeletDead: the kubelet of the etcd leader's Node dies; the leader runs but cannot be
// reached through the API server (KCP cannot move leadership off it: CAPI #8465, #12711). CAPR adds
// the replacements first, removes the leader's member through another member (etcd steps the leader
// down), and KCP deletes the victim.
func TestKCPLeaderKubeletDead(t *testing.T) {
	var victim string
	res := runKCPScenario(t, "kcp-leader", kcpScenario{controlPlane: 3,
		inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
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
	g.Expect(res.minMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", res.minMargin, res.minMarginAt)
	g.Expect(res.remediations[victim].Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst))
}

func stepNames(mr *caprv1.MachineRemediation) []caprv1.StepName {
	out := make([]caprv1.StepName, 0, len(mr.Status.Steps))
	for _, s := range mr.Status.Steps {
		out = append(out, s.Name)
	}
	return out
}
