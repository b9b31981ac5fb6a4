package more_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/controlplane"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/kubeadm"
	"github.com/capr-io/capr/test/sandbox"
)

// TestKCPDeadMemberRemovesFirst: the victim's etcd process dies (its Node is fine). Removing a dead
// member first costs no failure margin (adding a voter first would need 3 healthy of 4), and a surge
// by two would create two Machines, so CAPR removes the member, deletes the victim and KCP creates
// the one replacement (DeleteFirst).
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
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderDeleteFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(res.Created).To(HaveLen(1), "Machines created")
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
}

// TestKCPLeaderKubeletDead: the kubelet of the etcd leader's Node dies; the leader runs but cannot be
// reached through the API server (KCP cannot move leadership off it: CAPI #8465, #12711). The other
// members follow it and a linearizable read passes through it, so CAPR counts it alive and surges
// first; KCP's relaxed scale-up preflight agrees (its EtcdMemberHealthy reports membership and
// alarms, which are fine). The old leader is then removed through another member (etcd steps it
// down) and KCP scales down: the failure margin never drops below 1.
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
	g.Expect(res.MinMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	mr := res.Remediations[victim]
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(mr.Status.Steps).To(ContainElement(And(
		HaveField("Name", caprv1.StepMoveLeader), HaveField("Outcome", caprv1.StepOutcomeSkipped))))
}

// TestKCPMemberDiesDuringSurge: a requested remediation of a healthy Machine has begun its surge of
// two when another Machine's etcd member dies. Removing the healthy member would no longer be
// quorum-safe and KCP would not scale down while a Machine is unhealthy, so the running remediation
// gives way before its point of no return: its replacements deleted (KCP never removes them itself
// now), KCP back at 3, Pending again. The Machine with the dead member is remediated first, then
// the requested one; never two at once, quorum never lost.
func TestKCPMemberDiesDuringSurge(t *testing.T) {
	var requested, dead string
	res := kubeadm.RunScenario(ctx, t, sb, "kcp-surge-dies", kubeadm.Scenario{ControlPlane: 3,
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			requested, dead = machines[0].Name, machines[1].Name
			mr := &caprv1.MachineRemediation{
				ObjectMeta: metav1.ObjectMeta{Namespace: wc.Namespace, Name: requested, Labels: map[string]string{clusterv1.ClusterNameLabel: wc.Name}},
				Spec:       caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceManual, Reason: "Test"},
			}
			if err := sb.Client.Create(ctx, mr); err != nil {
				return nil, err
			}
			// The surge has begun: KCP was asked for 5 and created at least one replacement.
			err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
				kcp := &controlplanev1.KubeadmControlPlane{}
				if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: "wc-cp"}, kcp); err != nil {
					return false, err
				}
				now, err := sb.ControlPlaneMachines(ctx, wc)
				return ptr.Deref(kcp.Spec.Replicas, 0) == 5 && len(now) > 3, err
			})
			if err != nil {
				return nil, fmt.Errorf("waiting for the surge: %w", err)
			}
			sb.KillEtcdMember(wc, machines[1].Status.NodeRef.Name)
			return []string{requested, dead}, nil
		}})
	g := NewWithT(t)
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	events := &eventsv1.EventList{}
	g.Expect(sb.Client.List(ctx, events, client.InNamespace(res.Remediations[requested].Namespace))).To(Succeed())
	g.Expect(events.Items).To(ContainElement(And(
		HaveField("Regarding.Name", requested), HaveField("Reason", controlplane.EventRemediationYielded))), "the requested remediation did not give way")
	// Status times are whole seconds: the second may start in the second the first finished.
	g.Expect(res.Remediations[requested].Status.StartTime.Time).To(BeTemporally(">=", res.Remediations[dead].Status.CompletionTime.Time),
		"the Machine with the dead member goes first")
}

// TestKCPQuorumLostDoesNothing: two of three members die. The health check requests nothing (quorum
// lost), and a request made by hand waits saying quorum is lost: KCP is never asked for a replica and
// no Machine is deleted.
func TestKCPQuorumLostDoesNothing(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "kcp-quorum")
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: 3})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	g.Expect(sb.Client.Create(ctx, sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2))).To(Succeed())
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)

	sb.KillEtcdMember(wc, machines[0].Status.NodeRef.Name)
	sb.KillEtcdMember(wc, machines[1].Status.NodeRef.Name)
	g.Eventually(func(g Gomega) {
		mhc := &caprv1.MachineHealthCheck{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cp"}, mhc)).To(Succeed())
		g.Expect(conditions.GetReason(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)).To(Equal(caprv1.MachineHealthCheckEtcdQuorumLostReason))
	}, 2*time.Minute, 200*time.Millisecond).Should(Succeed())

	manual := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: machines[0].Name},
		Spec: caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceManual, Reason: caprv1.MachineCAPRHealthCheckManualRequestReason}}
	g.Expect(sb.Client.Create(ctx, manual)).To(Succeed())
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKeyFromObject(manual), mr)).To(Succeed())
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhasePending))
		g.Expect(conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition)).To(Equal(caprv1.MachineRemediationQuorumLostReason))
		g.Expect(conditions.GetMessage(mr, caprv1.MachineRemediationProgressingCondition)).To(ContainSubstring(machines[1].Status.NodeRef.Name))
	}, 2*time.Minute, 200*time.Millisecond).Should(Succeed())
	g.Consistently(func(g Gomega) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "wc-cp"}, kcp)).To(Succeed())
		g.Expect(ptr.Deref(kcp.Spec.Replicas, 0)).To(BeEquivalentTo(3))
		g.Expect(kcp.Annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
		now, err := sb.ControlPlaneMachines(ctx, wc)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(now).To(HaveLen(3))
		for _, m := range now {
			g.Expect(m.DeletionTimestamp.IsZero()).To(BeTrue(), "Machine %s deleted", m.Name)
		}
	}, 10*time.Second, 500*time.Millisecond).Should(Succeed())
}

// TestKCPSecondFailureAfterPointOfNoReturn: a remediation (kubelet stopped, member healthy: surge of
// two) has removed its victim's etcd member, and waits for its fence, when a second Machine's member
// dies; then the fence is confirmed. KCP (which checks etcd afresh at every reconcile) will not scale
// down from 4 to 3 while a Machine is unhealthy, so CAPR deletes the surplus replacement itself (the failure
// margin is the same with one healthy member fewer), KCP is at 3 again, and the second Machine's
// remediation runs next: no deadlock, never two at once, quorum never lost.
func TestKCPSecondFailureAfterPointOfNoReturn(t *testing.T) {
	var first, second string
	gate := &sandbox.GateBackend{}
	res := kubeadm.RunScenario(ctx, t, sb, "kcp-second", kubeadm.Scenario{ControlPlane: 3,
		Fencing: sandbox.ExternalFencing("gate"), Fencer: gate.Fencer(),
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			// The second is the youngest of the old Machines: KCP's own scale-down choice (the oldest)
			// is then a healthy Machine, and KCP refuses it. (Were the unhealthy one the oldest, KCP
			// would delete it while scaling down, which is fine but not this test.)
			sort.Slice(machines, func(i, j int) bool { return machines[i].CreationTimestamp.Before(&machines[j].CreationTimestamp) })
			first, second = machines[0].Name, machines[2].Name
			if err := sb.StopKubelet(ctx, wc, machines[0].Status.NodeRef.Name); err != nil {
				return nil, err
			}
			err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
				mr := &caprv1.MachineRemediation{}
				if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: first}, mr); err != nil {
					return false, client.IgnoreNotFound(err)
				}
				return mr.Status.Step(caprv1.StepFence) != nil, nil
			})
			if err != nil {
				return nil, fmt.Errorf("waiting for the first remediation's Fence step: %w", err)
			}
			sb.KillEtcdMember(wc, machines[2].Status.NodeRef.Name)
			gate.Open()
			return []string{first, second}, nil
		}})
	g := NewWithT(t)
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	g.Expect(res.Remediations[second].Status.StartTime.Time).To(BeTemporally(">=", res.Remediations[first].Status.CompletionTime.Time),
		"the first remediation finishes before the second starts (status times are whole seconds)")
	events := &eventsv1.EventList{}
	g.Expect(sb.Client.List(ctx, events, client.InNamespace(res.Remediations[first].Namespace))).To(Succeed())
	g.Expect(events.Items).To(ContainElement(And(
		HaveField("Regarding.Name", first), HaveField("Reason", controlplane.EventSurplusReplacementDeleted))), "KCP was left above its replicas")
}
