package more_test

import (
	"context"
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

// TestKCPDeadMemberDeletesFirst: the victim's etcd process dies (its Node is fine). Removing a dead
// member first costs no failure margin (adding a voter first would need 3 healthy of 4). KCP creates
// no Machine while another is deleting (preflight.go: HasDeletingMachine), so a surge would be
// provisioned only after the victim is gone: CAPR removes the member, deletes the victim without a
// surge (DeleteFirst) and KCP creates the one replacement at the replicas it has.
func TestKCPDeadMemberDeletesFirst(t *testing.T) {
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
	g.Expect(mr.Status.ControlPlane.Replacements).To(BeZero(), "no surge: %s", mr.Status.ControlPlane.SurgeReason)
	g.Expect(res.Created).To(HaveLen(1), "control-plane Machines created")
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
			m, err := sb.EtcdMachine(ctx, wc, machines, true)
			if err != nil {
				return nil, err
			}
			victim = m.Name
			return []string{victim}, sb.StopKubelet(ctx, wc, m.Status.NodeRef.Name)
		}})
	g := NewWithT(t)
	g.Expect(res.MinMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	mr := res.Remediations[victim]
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(mr.Status.Steps).To(ContainElement(And(
		HaveField("Name", caprv1.StepMoveLeader), HaveField("Outcome", caprv1.StepOutcomeSkipped))))
}

// TestKCPRequestedHealthyMachineCreatesOneMachine: a person requests the remediation of a Machine
// that is healthy in KCP's eyes. KCP's strict scale-up preflight then passes as soon as the first
// replacement is healthy, so with the replicas still at 5 it would create a second Machine without
// being asked again. CAPR is stopped right after KCP created the first replacement, and started again
// only once that replacement has been healthy in KCP's eyes for 30 s (KCP reconciles at least every
// 15-30 s): CAPR had returned the replicas to 3 as soon as the first existed, and the API server's
// watch sees exactly one control-plane Machine created (with the replicas left at 5, KCP creates the
// second during the outage). Meanwhile KCP scales the victim down itself (it is marked
// cluster.x-k8s.io/delete-machine), and the restarted CAPR goes on to the end instead of failing:
// the failure margin never below 1.
func TestKCPRequestedHealthyMachineCreatesOneMachine(t *testing.T) {
	var requested string
	initial := map[string]bool{}
	var created, healthy time.Time
	res := kubeadm.RunScenario(ctx, t, sb, "kcp-requested", kubeadm.Scenario{ControlPlane: 3,
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			for _, m := range machines {
				initial[m.Name] = true
			}
			requested = machines[1].Name
			mr := &caprv1.MachineRemediation{
				ObjectMeta: metav1.ObjectMeta{Namespace: wc.Namespace, Name: requested, Labels: map[string]string{clusterv1.ClusterNameLabel: wc.Name}},
				Spec:       caprv1.MachineRemediationSpec{Source: caprv1.MachineRemediationSourceManual, Reason: "Test"},
			}
			return []string{requested}, sb.Client.Create(ctx, mr)
		},
		Outage: &kubeadm.Outage{
			// A replacement exists, and CAPR had 5 s to see it.
			Stop: func(ctx context.Context, wc *sandbox.WorkloadCluster) (bool, error) {
				now, err := sb.ControlPlaneMachines(ctx, wc)
				if err != nil || len(now) <= 3 {
					return false, err
				}
				if created.IsZero() {
					created = time.Now()
				}
				return time.Since(created) > 5*time.Second, nil
			},
			// The replacement has been healthy in KCP's eyes for 30 s.
			Resume: func(ctx context.Context, wc *sandbox.WorkloadCluster) (bool, error) {
				now, err := sb.ControlPlaneMachines(ctx, wc)
				if err != nil {
					return false, err
				}
				for _, m := range now {
					if !initial[m.Name] && kcpHealthy(&m) && healthy.IsZero() {
						healthy = time.Now()
					}
				}
				return !healthy.IsZero() && time.Since(healthy) > 30*time.Second, nil
			},
		}})
	g := NewWithT(t)
	cps := res.Remediations[requested].Status.ControlPlane
	g.Expect(cps.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), cps.OrderReason)
	g.Expect(cps.Surge).To(Equal(int32(2)))
	g.Expect(cps.Replacements).To(Equal(int32(1)), cps.SurgeReason)
	g.Expect(res.Created).To(ConsistOf(cps.Replacement), "control-plane Machines created")
	g.Expect(res.MinMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
}

// kcpHealthy reports whether KCP's health conditions on m are all True (what its strict preflight
// requires of every Machine).
func kcpHealthy(m *clusterv1.Machine) bool {
	for _, c := range []string{controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineControllerManagerPodHealthyCondition,
		controlplanev1.KubeadmControlPlaneMachineSchedulerPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition,
		controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition} {
		if !conditions.IsTrue(m, c) {
			return false
		}
	}
	return m.Status.NodeRef.IsDefined()
}

// TestKCPMemberDiesDuringSurge: a requested remediation of a healthy Machine has had KCP create its
// replacement (replicas 3 → 5, and back to 3 at once, the victim marked for KCP's scale-down) when
// another Machine's etcd member dies. Removing the healthy member would no longer be quorum-safe and
// KCP would not scale down while a Machine is unhealthy, so the running remediation gives way before
// its point of no return: its replacement deleted, then the victim's mark removed, KCP at 3,
// Pending again. The Machine with the dead member is remediated first, then the requested one;
// never two at once, quorum never lost.
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
			// The surge has begun: KCP created the replacement.
			err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
				now, err := sb.ControlPlaneMachines(ctx, wc)
				return len(now) > 3, err
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
	// Longer than the remediator's requeue while it waits (waitLong, 15 s): its next look must not
	// act either.
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
	}, 17*time.Second, 500*time.Millisecond).Should(Succeed())
}

// TestKCPSecondFailureAfterPointOfNoReturn: a remediation (kubelet stopped, member healthy) has
// removed its victim's etcd member, and waits for its fence, when a second Machine's member dies;
// then the fence is confirmed. KCP will not scale down while a Machine is unhealthy, and it need not:
// the remediation created one replacement and returned the replicas to 3 at once, so it deletes the
// victim itself and leaves KCP nothing to scale down (before one replacement per remediation, a
// surge of two left a surplus that CAPR had to delete itself). The second Machine's remediation runs
// next, delete-first: no deadlock, one Machine per remediation, never two at once, quorum never lost.
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
	g.Expect(res.Created).To(HaveLen(2), "control-plane Machines created: one per remediation")
	// The first surged (its member was healthy); the second's member is dead, so it is deleted first
	// and KCP creates its replacement (TestKCPDeadMemberDeletesFirst).
	cps := res.Remediations[first].Status.ControlPlane
	g.Expect(cps.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), cps.OrderReason)
	g.Expect(cps.Replacements).To(Equal(int32(1)), cps.SurgeReason)
	cps = res.Remediations[second].Status.ControlPlane
	g.Expect(cps.Order).To(Equal(caprv1.ControlPlaneOrderDeleteFirst), cps.OrderReason)
	g.Expect(cps.Replacements).To(BeZero(), cps.SurgeReason)
}

// TestKCPSecondFailureWhileTheProviderHoldsTheMember: etcd raises NOSPACE for a follower's member, so
// CAPR deletes that Machine while its member still votes, and KCP's kcp-cleanup pre-terminate hook is
// to remove the member (DeleteBeforeMemberRemoval). While the deletion is under way (held by another
// pre-terminate hook, as a drain held by a PodDisruptionBudget would hold it), a second Machine's etcd
// process dies. KCP judges the removal from its Machine conditions, which show that member healthy
// for minutes: it asks etcd to remove the victim's member, and etcd refuses (one healthy voter of two
// would be left) on every retry. Left to KCP, the deletion would never end, and the second Machine,
// whose request the health check's quorum-safe limit holds back, would never be remediated. CAPR's
// own hook holds the deletion until removing the member keeps quorum on its reading of etcd: it
// removes the dead member first (it does not vote: the margin stays), then lets KCP go on, and the
// second Machine is remediated next. One Machine per remediation, the failure margin never below 0.
func TestKCPSecondFailureWhileTheProviderHoldsTheMember(t *testing.T) {
	const hold = clusterv1.PreTerminateDeleteHookAnnotationPrefix + "/test-hold"
	var victim, second string
	res := kubeadm.RunScenario(ctx, t, sb, "kcp-dbmr-second", kubeadm.Scenario{ControlPlane: 3,
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			m, err := sb.EtcdMachine(ctx, wc, machines, false)
			if err != nil {
				return nil, err
			}
			victim = m.Name
			leader, err := sb.EtcdMachine(ctx, wc, machines, true)
			if err != nil {
				return nil, err
			}
			node := ""
			for i := range machines {
				if n := machines[i].Name; n != victim && n != leader.Name {
					second, node = n, machines[i].Status.NodeRef.Name
				}
			}
			if err := setAnnotation(ctx, wc.Namespace, victim, hold, ptr.To("test")); err != nil {
				return nil, err
			}
			if err := sb.AlarmEtcdMember(ctx, wc, m.Status.NodeRef.Name); err != nil {
				return nil, err
			}
			if err := pollMachine(ctx, wc.Namespace, victim, func(m *clusterv1.Machine) bool { return !m.DeletionTimestamp.IsZero() }); err != nil {
				return nil, fmt.Errorf("waiting for the victim's deletion: %w", err)
			}
			sb.KillEtcdMember(wc, node)
			return []string{victim, second}, setAnnotation(ctx, wc.Namespace, victim, hold, nil)
		}})
	g := NewWithT(t)
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	first := res.Remediations[victim]
	g.Expect(first.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval), first.Status.ControlPlane.OrderReason)
	events := &eventsv1.EventList{}
	g.Expect(sb.Client.List(ctx, events, client.InNamespace(first.Namespace))).To(Succeed())
	g.Expect(events.Items).To(ContainElement(And(HaveField("Regarding.Name", victim), HaveField("Reason", controlplane.EventDownMemberRemoved),
		HaveField("Note", ContainSubstring("of Machine "+second)))), "the second Machine's member removed by the first remediation")
	g.Expect(res.Remediations[second].Status.StartTime.Time).To(BeTemporally(">=", first.Status.CompletionTime.Time),
		"the first remediation finishes before the second starts (status times are whole seconds)")
	g.Expect(res.Created).To(HaveLen(2), "control-plane Machines created: one per remediation")
}

// setAnnotation sets (value) or removes (nil) an annotation of a Machine.
func setAnnotation(ctx context.Context, namespace, name, key string, value *string) error {
	m := &clusterv1.Machine{}
	if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, m); err != nil {
		return err
	}
	base := m.DeepCopy()
	a := m.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	if value == nil {
		delete(a, key)
	} else {
		a[key] = *value
	}
	m.SetAnnotations(a)
	return sb.Client.Patch(ctx, m, client.MergeFrom(base))
}

// pollMachine waits until done says so of the Machine.
func pollMachine(ctx context.Context, namespace, name string, done func(*clusterv1.Machine) bool) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		m := &clusterv1.Machine{}
		if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, m); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return done(m), nil
	})
}
