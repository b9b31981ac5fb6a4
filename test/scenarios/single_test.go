package scenarios_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/test/builder"
	"github.com/capr-io/capr/test/sandbox"
)

// A control plane of one Machine (docs/user/control-plane-remediation.md, "A single
// control-plane Machine"). The sandbox provider joins etcd members as learners, as kubeadm ≥ 1.29
// does, and its control-plane object says so (caprv1.EtcdLearnerJoinsAnnotation).

// newSingleCluster creates a cluster of one control-plane Machine whose provider declares learner
// joins, with Required fencing through a test backend (sandbox.GateBackend) so that
// fence-before-delete is exercised.
func newSingleCluster(t *testing.T) *sandbox.WorkloadCluster {
	t.Helper()
	g := NewWithT(t)
	wc := newCluster(t, withControlPlane(1), withHealthCheck(func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.Fencing = sandbox.ExternalFencing("gate")
	}))
	g.Expect(sb.AnnotateControlPlane(ctx, wc, caprv1.EtcdLearnerJoinsAnnotation, "true")).To(Succeed())
	return wc
}

// TestSingleControlPlaneMemberHealthyIsReplaced: the only Machine's Node stops reporting while its
// etcd member is healthy. It is replaced scale-up-first (1 → 2 → 1): the replacement joins as a
// learner and votes before the old member is removed, so etcd never has fewer running voters than a
// quorum nor fewer than the one it had; the victim is fenced before it is deleted, and the data
// written before the fault is still there.
func TestSingleControlPlaneMemberHealthyIsReplaced(t *testing.T) {
	g := NewWithT(t)
	wc := newSingleCluster(t)
	check := writeData(t, wc)
	victim := controlPlane(g, wc)[0]
	gate := &sandbox.GateBackend{}
	gate.Open()
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{Fencer: gate.Fencer()}})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	start := time.Now()
	quorum := sb.WatchQuorum(ctx, wc)
	running := sb.WatchRunning(ctx, wc)

	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	mr := waitRemediated(t, wc, victim.Name, 1)

	_, lost := quorum.Stop()
	g.Expect(lost).To(BeEmpty(), "etcd lost quorum during the remediation")
	minMargin, when, _ := quorum.Margin()
	g.Expect(minMargin).To(BeNumerically(">=", 0), "fewer running voters than a quorum at %s", when)
	g.Expect(running.Stop()).To(BeEmpty())
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(stepNames(mr)).To(Equal(builder.Steps[caprv1.ControlPlaneOrderScaleUpFirst]))
	var fence, del *caprv1.RemediationStep
	for i := range mr.Status.Steps {
		switch mr.Status.Steps[i].Name {
		case caprv1.StepFence:
			fence = &mr.Status.Steps[i]
		case caprv1.StepDelete:
			del = &mr.Status.Steps[i]
		}
	}
	g.Expect(fence.Outcome).To(Equal(caprv1.StepOutcomeSucceeded), fence.Message)
	g.Expect(fence.FinishTime.Time).NotTo(BeTemporally(">", del.StartTime.Time), "deleted before it was fenced")
	deleted, ok := sb.Log.Find(wc.LogKey(), start, "Machine "+victim.Name+" deleted")
	g.Expect(ok).To(BeTrue())
	g.Expect(gate.FencedAt()).NotTo(BeZero())
	g.Expect(gate.FencedAt()).To(BeTemporally("<=", deleted), "the victim was deleted before it was fenced")
	g.Expect(memberNames(g, wc)).To(ConsistOf(mr.Status.ControlPlane.Replacement))
	g.Expect(controlPlane(g, wc)).To(HaveLen(1))
	check()
}

// TestSingleControlPlaneMemberDeadDoesNothing: the only etcd member is dead, so etcd has no quorum.
// The health check says so, naming the recovery a person must run, and requests nothing; no Machine
// is created or deleted.
func TestSingleControlPlaneMemberDeadDoesNothing(t *testing.T) {
	g := NewWithT(t)
	wc := newSingleCluster(t)
	victim := controlPlane(g, wc)[0]
	startCAPR(t)

	killed := time.Now()
	sb.KillEtcdMember(wc, victim.Status.NodeRef.Name)
	g.Eventually(func(g Gomega) {
		mhc := &caprv1.MachineHealthCheck{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: "cp"}, mhc)).To(Succeed())
		c := conditions.Get(mhc, caprv1.MachineHealthCheckRemediationAllowedCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(caprv1.MachineHealthCheckEtcdQuorumLostReason))
		g.Expect(c.Message).To(ContainSubstring("etcdutl snapshot restore"))
	}, time.Minute, 200*time.Millisecond).Should(Succeed())
	// A request made wrongly would come once the etcd member check's 10 s timeout has passed, at the
	// etcd read after it (every 5 s): watch until well past both.
	g.Consistently(func(g Gomega) {
		list := &caprv1.MachineRemediationList{}
		g.Expect(sb.Client.List(ctx, list, client.InNamespace(wc.Namespace))).To(Succeed())
		g.Expect(list.Items).To(BeEmpty())
		g.Expect(controlPlane(g, wc)).To(ConsistOf(HaveField("Name", victim.Name)))
	}, max(time.Until(killed.Add(20*time.Second)), 5*time.Second), 500*time.Millisecond).Should(Succeed())
}
