package scenarios_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/remediation/escalation"
	"github.com/capr-io/capr/remediation/fencing"
	"github.com/capr-io/capr/test/builder"
	"github.com/capr-io/capr/test/sandbox"
)

// Escalation of control-plane Machines (spec.remediation.escalation): a reboot is tried, while the
// remediation holds the control plane, before any membership change. The reboot operator is the
// sandbox's stand-in (test/sandbox/reboot.go): it stops the node's etcd member for
// sandbox.RebootDuration, then restarts the node's kubelet heartbeat, or, with fails, leaves the node
// down.

// escalationSeconds is the escalation step's timeoutSeconds (the API's minimum); escalationTimeout
// turns it into 15 s here.
const escalationSeconds = 60

func escalationTimeout(seconds int32) time.Duration {
	return time.Duration(seconds) * 250 * time.Millisecond
}

// withReboot gives the cluster's health check a one-step escalation, a SandboxReboot, created from a
// template in the cluster's namespace (fails: the reboot does not bring the node back).
func withReboot(t *testing.T, fails bool) clusterOption {
	return withReboots(t, fails, escalationSeconds)
}

// withReboots is withReboot with one SandboxReboot step per timeout (timeoutSeconds each).
func withReboots(t *testing.T, fails bool, timeouts ...int32) clusterOption {
	return withHealthCheck(func(mhc *caprv1.MachineHealthCheck) {
		NewWithT(t).Expect(sb.Client.Create(ctx, sandbox.RebootTemplate(mhc.Namespace, "reboot", fails))).To(Succeed())
		mhc.Spec.Remediation.Escalation = nil
		for _, seconds := range timeouts {
			mhc.Spec.Remediation.Escalation = append(mhc.Spec.Remediation.Escalation, caprv1.EscalationStep{
				TemplateRef:    caprv1.TemplateReference{APIVersion: sandbox.RebootGroupVersion.String(), Kind: "SandboxRebootTemplate", Name: "reboot"},
				TimeoutSeconds: seconds,
			})
		}
	})
}

// startCAPRWithEscalation starts CAPR with escalation timeouts short enough for the sandbox (and the
// fencer, when not nil).
func startCAPRWithEscalation(t *testing.T, fencer fencing.Fencer) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			list := &caprv1.MachineHealthCheckList{}
			_ = sb.Client.List(ctx, list)
			for _, m := range list.Items {
				t.Logf("health check %s/%s conditions: %+v", m.Namespace, m.Name, m.Status.Conditions)
			}
		}
	})
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{EscalationTimeout: escalationTimeout, Fencer: fencer}})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
}

// rebootOf returns the SandboxReboot of a Machine, nil when there is none.
func rebootOf(g Gomega, wc *sandbox.WorkloadCluster, machine string) *unstructured.Unstructured {
	r := sandbox.Reboot(wc.Namespace, machine)
	err := sb.Client.Get(ctx, client.ObjectKeyFromObject(r), r)
	if apierrors.IsNotFound(err) {
		return nil
	}
	g.Expect(err).NotTo(HaveOccurred())
	return r
}

// TestControlPlaneRebootRecovers: a control-plane Node stops reporting; the remediation takes the
// control plane and creates the reboot before anything else; the node comes back, the mark goes, and
// the remediation ends with nothing replaced: same Machines, same etcd members, replicas untouched,
// the lock and the fence hook released, the reboot deleted, the request owned by its Machine again.
func TestControlPlaneRebootRecovers(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withReboot(t, false), withHealthCheck(func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.Fencing = sandbox.ExternalFencing("gate")
	}))
	machines := controlPlane(g, wc)
	victim := machines[1]
	members := memberNames(g, wc)
	gate := &sandbox.GateBackend{} // never opened: the victim is never fenced
	startCAPRWithEscalation(t, gate.Fencer())

	start := time.Now()
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(getRemediation(g, wc, victim.Name).Status.CurrentStep).To(Equal(caprv1.EscalationStepName(0)))
		g.Expect(getMachine(g, wc, victim.Name).Annotations).To(HaveKeyWithValue(caprv1.FenceBeforeDeleteHookAnnotation, victim.Name))
	}, remediationTimeout, 20*time.Millisecond).Should(Succeed(), "the hook holds any deletion of the victim during the reboot")
	var mr *caprv1.MachineRemediation
	g.Eventually(func(g Gomega) {
		mr = getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())

	_, rebooted := sb.Log.Find(wc.LogKey(), start, "node "+victim.Status.NodeRef.Name+" rebooted")
	g.Expect(rebooted).To(BeTrue(), "the sandbox's reboot operator never saw a SandboxReboot")
	g.Expect(eventCount(g, wc.Namespace, victim.Name, escalation.EventCreated)).To(Equal(1))
	g.Expect(stepNames(mr)).To(Equal([]caprv1.StepName{caprv1.EscalationStepName(0)}))
	g.Expect(stepOutcome(mr, caprv1.EscalationStepName(0))).To(Equal(caprv1.StepOutcomeSucceeded))
	g.Expect(mr.Status.Conditions).To(ContainElement(And(
		HaveField("Type", caprv1.MachineRemediationSucceededCondition), HaveField("Message", ContainSubstring("nothing deleted")))))
	g.Expect(mr.OwnerReferences).To(ConsistOf(And(HaveField("Kind", "Machine"), HaveField("UID", victim.UID))))

	g.Expect(rebootOf(g, wc, victim.Name)).To(BeNil(), "the reboot outlived the remediation")
	g.Expect(controlPlane(g, wc)).To(HaveLen(3))
	for _, m := range controlPlane(g, wc) {
		g.Expect(m.UID).To(BeElementOf(machines[0].UID, machines[1].UID, machines[2].UID), "a Machine was replaced")
	}
	g.Expect(memberNames(g, wc)).To(ConsistOf(members))
	cp := controlPlaneObject(g, wc)
	g.Expect(*cp.Spec.Replicas).To(BeEquivalentTo(3))
	g.Expect(cp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	g.Expect(getMachine(g, wc, victim.Name).Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
	g.Expect(eventCount(g, wc.Namespace, victim.Name, remediation.EventRemediationStarted)).To(Equal(1))
}

// TestControlPlaneRebootThatDoesNotHelpIsFollowedByReplacement: the reboot leaves the node down. At
// the step's timeout the reboot is deleted (Escalate1 Failed), the order is chosen again on the etcd
// state of then, and the Machine is replaced as without escalation, quorum kept throughout.
func TestControlPlaneRebootThatDoesNotHelpIsFollowedByReplacement(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withReboot(t, true))
	victim := controlPlane(g, wc)[1]
	startCAPRWithEscalation(t, nil)
	watch := sb.WatchQuorum(ctx, wc)

	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(rebootOf(g, wc, victim.Name)).NotTo(BeNil())
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.EscalationStepName(0)))
		g.Expect(mr.Annotations).To(HaveKey(clusterctlv1.BlockMoveAnnotation), "clusterctl move would drop the running remediation's status")
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	g.Expect(controlPlaneObject(g, wc).Annotations).To(HaveKey(caprv1.ControlPlaneLockAnnotation), "the reboot runs while the control plane is held")
	g.Expect(*controlPlaneObject(g, wc).Spec.Replicas).To(BeEquivalentTo(3), "nothing but the reboot before its timeout")

	mr := waitRemediated(t, wc, victim.Name, 3)
	g.Expect(mr.Annotations).NotTo(HaveKey(clusterctlv1.BlockMoveAnnotation), "a finished remediation blocks no move")
	_, lost := watch.Stop()
	g.Expect(lost).To(BeEmpty(), "etcd lost quorum during the remediation")
	g.Expect(stepNames(mr)).To(Equal(append([]caprv1.StepName{caprv1.EscalationStepName(0)}, builder.Steps[mr.Status.ControlPlane.Order]...)))
	g.Expect(stepOutcome(mr, caprv1.EscalationStepName(0))).To(Equal(caprv1.StepOutcomeFailed))
	g.Expect(mr.Status.Steps[0].FinishTime.Time).To(BeTemporally(">=", mr.Status.Steps[0].StartTime.Add(escalationTimeout(escalationSeconds))))
	g.Expect(eventCount(g, wc.Namespace, victim.Name, controlplane.EventOrderReplanned)).To(Equal(1))
	g.Expect(rebootOf(g, wc, victim.Name)).To(BeNil())
	g.Expect(memberNames(g, wc)).NotTo(ContainElement(victim.Status.NodeRef.Name))
}

// TestAbortDuringEscalationDeletesTheReboot: deleting the request while its reboot runs undoes the
// remediation: the reboot deleted, the lock released, nothing else touched.
func TestAbortDuringEscalationDeletesTheReboot(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withReboot(t, true))
	victim := controlPlane(g, wc)[1]
	startCAPRWithEscalation(t, nil)

	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) *unstructured.Unstructured { return rebootOf(g, wc, victim.Name) }, remediationTimeout, 100*time.Millisecond).
		ShouldNot(BeNil())
	g.Expect(sb.Client.DeleteAllOf(ctx, &caprv1.MachineHealthCheck{}, client.InNamespace(wc.Namespace))).To(Succeed())
	g.Expect(sb.Client.Delete(ctx, getRemediation(g, wc, victim.Name))).To(Succeed())
	expectRequestGone(t, wc, victim.Name)

	g.Expect(rebootOf(g, wc, victim.Name)).To(BeNil(), "the reboot outlived the aborted remediation")
	cp := controlPlaneObject(g, wc)
	g.Expect(*cp.Spec.Replicas).To(BeEquivalentTo(3))
	g.Expect(cp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	g.Expect(controlPlane(g, wc)).To(HaveLen(3))
	g.Expect(eventCount(g, wc.Namespace, victim.Name, remediation.EventRemediationAborted)).To(Equal(1))
}

// TestRebootWaitsWhileUnreachableMembersCarryQuorum: three members; the victim C's kubelet
// stops, its etcd member keeps running. The first reboot (2 of 3 healthy: A and B) stops C's member
// for a while and does not help. Then B's member dies and A leads: a linearizable read is answered
// (A and C are the quorum; only A answers, and C counts alive because A, leading, hears from it). Rebooting C
// again would leave A alone, so
// the second step must wait with NotQuorumSafe, create nothing, and quorum must hold throughout.
func TestRebootWaitsWhileUnreachableMembersCarryQuorum(t *testing.T) {
	g := NewWithT(t)
	// The first step's timeout leaves time to kill B and move the leadership before the second begins.
	wc := newCluster(t, withReboots(t, true, 2*escalationSeconds, escalationSeconds))
	machines := controlPlane(g, wc)
	a, b, victim := machines[0], machines[1], machines[2]
	nodeA, nodeB, nodeC := a.Status.NodeRef.Name, b.Status.NodeRef.Name, victim.Status.NodeRef.Name
	startCAPRWithEscalation(t, nil)
	watch := sb.WatchQuorum(ctx, wc)
	start := time.Now()

	g.Expect(sb.StopKubelet(ctx, wc, nodeC)).To(Succeed())
	g.Eventually(func(g Gomega) {
		r := rebootOf(g, wc, victim.Name)
		g.Expect(r).NotTo(BeNil())
		result, _, _ := unstructured.NestedString(r.Object, "status", "result")
		g.Expect(result).To(Equal("NodeDidNotComeBack"))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed(), "the first reboot ends")
	g.Expect(sb.EtcdRunning(wc, nodeC)).To(BeTrue(), "the reboot restarts the victim's member")
	_, stopped := sb.Log.Find(wc.LogKey(), start, "node "+nodeC+" rebooting (SandboxReboot): its etcd member is stopped")
	g.Expect(stopped).To(BeTrue())

	sb.KillEtcdMember(wc, nodeB)
	// A must lead: an unreachable leader followed by A would be counted alive (etcdutil markAlive).
	direct := &etcdutil.Cluster{Connector: wc.Etcd.Direct(), CallTimeout: 2 * time.Second}
	g.Eventually(func(g Gomega) {
		state, err := sb.EtcdState(ctx, wc)
		g.Expect(err).NotTo(HaveOccurred())
		leader, memberA := state.ByID(state.LeaderID), state.ByName(nodeA)
		g.Expect(leader).NotTo(BeNil(), "no leader yet")
		g.Expect(memberA).NotTo(BeNil())
		if leader.Name != nodeA {
			g.Expect(direct.MoveLeader(ctx, leader.Name, memberA.ID)).To(Succeed())
		}
		g.Expect(leader.Name).To(Equal(nodeA))
	}, time.Minute, 200*time.Millisecond).Should(Succeed())
	g.Expect(getRemediation(g, wc, victim.Name).Status.CurrentStep).To(Equal(caprv1.EscalationStepName(0)),
		"the scenario needs B dead and A leading before the second step begins")

	g.Eventually(func(g Gomega) {
		if n := rebootsOf(wc, nodeC, start); n > 1 {
			StopTrying(fmt.Sprintf("the victim was rebooted again (%d reboots) while it carried the quorum; quorum lost: %v", n, watch.Lost())).Now()
		}
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.EscalationStepName(1)))
		g.Expect(mr.Status.Conditions).To(ContainElement(And(
			HaveField("Type", caprv1.MachineRemediationProgressingCondition),
			HaveField("Reason", caprv1.MachineRemediationNotQuorumSafeReason),
			HaveField("Message", ContainSubstring("not quorum-safe")))))
	}, remediationTimeout, 100*time.Millisecond).Should(Succeed())
	g.Expect(eventCount(g, wc.Namespace, victim.Name, remediation.EventRemediationWaiting)).To(BeNumerically(">=", 1))

	// The second step times out without its reboot: created once in all (the first step's).
	g.Eventually(func(g Gomega) {
		g.Expect(stepOutcome(getRemediation(g, wc, victim.Name), caprv1.EscalationStepName(1))).To(Equal(caprv1.StepOutcomeFailed))
	}, remediationTimeout, 200*time.Millisecond).Should(Succeed())
	g.Expect(eventCount(g, wc.Namespace, victim.Name, escalation.EventCreated)).To(Equal(1), "the second reboot was created")
	g.Expect(rebootsOf(wc, nodeC, start)).To(Equal(1), "the victim was rebooted while it carried the quorum")
	g.Expect(rebootOf(g, wc, victim.Name)).To(BeNil())
	g.Expect(sb.EtcdRunning(wc, nodeC)).To(BeTrue())
	_, lost := watch.Stop()
	g.Expect(lost).To(BeEmpty(), "etcd lost quorum")
}

// rebootsOf counts the sandbox reboots of node begun since start.
func rebootsOf(wc *sandbox.WorkloadCluster, node string, start time.Time) int {
	n := 0
	for _, e := range sb.Log.Since(wc.LogKey(), start) {
		if strings.Contains(e.Text, "node "+node+" rebooting") {
			n++
		}
	}
	return n
}
