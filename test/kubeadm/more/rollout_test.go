package more_test

import (
	"sort"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// TestKCPRolloutDuringRemediation: a remediation of the oldest Machine (its kubelet stopped, its
// member healthy) has begun its surge of two when someone starts a KCP rollout (spec.rollout.after).
// Rollouts take precedence over scaling in KCP, and its rollout scales down the oldest outdated
// Machine first: the victim. CAPI's Machine controller holds that deletion on CAPR's pre-drain hook
// until the victim is fenced (the fence is held closed for a while: the victim must not be torn
// down), then lets it go. CAPR's remediation ends (replaced, or "deleted by someone else" with its
// surge undone), KCP finishes its rollout at 3 up-to-date Machines, and quorum is never lost.
func TestKCPRolloutDuringRemediation(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "kcp-rollout")
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: 3})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	mhc := sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2)
	mhc.Spec.Remediation.Fencing = sandbox.ExternalFencing("gate")
	g.Expect(sb.Client.Create(ctx, mhc)).To(Succeed())
	check, err := sandbox.WriteData(ctx, wc, 50)
	g.Expect(err).NotTo(HaveOccurred())
	gate := &sandbox.GateBackend{}
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{Fencer: gate.Fencer()}})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	quorum := sb.WatchQuorum(ctx, wc)
	running := sb.WatchRunning(ctx, wc)

	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	sort.Slice(machines, func(i, j int) bool { return machines[i].CreationTimestamp.Before(&machines[j].CreationTimestamp) })
	victim := machines[0]
	deletions, err := sb.WatchMachineDeletions(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(deletions.Stop)
	start := time.Now()
	g.Expect(sb.StopKubelet(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())

	// The surge has begun: KCP was asked for 5.
	kcpKey := client.ObjectKey{Namespace: ns, Name: "wc-cp"}
	g.Eventually(func(g Gomega) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		g.Expect(sb.Client.Get(ctx, kcpKey, kcp)).To(Succeed())
		g.Expect(ptr.Deref(kcp.Spec.Replicas, 0)).To(BeEquivalentTo(5))
	}, 5*time.Minute, 500*time.Millisecond).Should(Succeed())

	// The rollout.
	rolloutAt := metav1.Now()
	g.Eventually(func() error {
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := sb.Client.Get(ctx, kcpKey, kcp); err != nil {
			return err
		}
		kcp.Spec.Rollout.After = rolloutAt
		return sb.Client.Update(ctx, kcp)
	}, time.Minute, time.Second).Should(Succeed())

	// Whoever deletes the victim, it is not torn down unfenced: while the gate is closed the victim's
	// machine keeps running, for as long as it takes for it to be deleted and then 10 s more.
	victimKey := client.ObjectKeyFromObject(&victim)
	g.Eventually(func(g Gomega) {
		m := &clusterv1.Machine{}
		g.Expect(sb.Client.Get(ctx, victimKey, m)).To(Succeed())
		g.Expect(m.DeletionTimestamp.IsZero()).To(BeFalse(), "the victim is not being deleted yet")
	}, 10*time.Minute, time.Second).Should(Succeed())
	// CAPI's Machine controller has reached the victim's pre-drain hooks and waits for them: what
	// holds the teardown is CAPR's fence hook, not the controller's pace.
	g.Eventually(func(g Gomega) {
		m := &clusterv1.Machine{}
		g.Expect(sb.Client.Get(ctx, victimKey, m)).To(Succeed())
		g.Expect(conditions.GetReason(m, clusterv1.MachineDeletingCondition)).To(Equal(clusterv1.MachineDeletingWaitingForPreDrainHookReason))
	}, time.Minute, 250*time.Millisecond).Should(Succeed())
	g.Consistently(func(g Gomega) {
		_, gone := sb.Log.Find(wc.LogKey(), start, "machine "+victim.Name+" gone")
		g.Expect(gone).To(BeFalse(), "the victim was torn down before its fence")
	}, 10*time.Second, 250*time.Millisecond).Should(Succeed())
	gate.Open()

	// The remediation ends; KCP finishes its rollout.
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, victimKey, mr)).To(Succeed())
		g.Expect(mr.Status.Phase).To(BeElementOf(caprv1.MachineRemediationPhaseFailed, caprv1.MachineRemediationPhaseSucceeded),
			"step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
		if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
			g.Expect(mr.Status.LastError).To(ContainSubstring("deleted by someone else"))
		}
	}, 10*time.Minute, time.Second).Should(Succeed())
	gone, ok := sb.Log.Find(wc.LogKey(), start, "machine "+victim.Name+" gone")
	g.Expect(ok).To(BeTrue(), "the victim was never torn down")
	g.Expect(gone).To(BeTemporally(">=", gate.FencedAt()), "torn down before it was fenced")
	// From the API server, against the backend's confirmation (ms): KCP's deletion took effect
	// only once the victim was fenced.
	g.Expect(deletions.SeenAfter(victim.Name, sandbox.MachineReleased, gate.FencedAtFor(victim.Name))).To(Succeed())
	g.Eventually(func(g Gomega) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		g.Expect(sb.Client.Get(ctx, kcpKey, kcp)).To(Succeed())
		g.Expect(ptr.Deref(kcp.Spec.Replicas, 0)).To(BeEquivalentTo(3))
		g.Expect(kcp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
		g.Expect(kcp.Annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
		now, err := sb.ControlPlaneMachines(ctx, wc)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(now).To(HaveLen(3))
		for _, m := range now {
			g.Expect(m.CreationTimestamp.Time).To(BeTemporally(">=", rolloutAt.Time.Truncate(time.Second)), "Machine %s is outdated: the rollout did not finish", m.Name)
		}
	}, 15*time.Minute, 2*time.Second).Should(Succeed())
	g.Expect(sb.WaitForControlPlane(ctx, wc, 3, 3*time.Minute)).To(Succeed())
	_, lost := quorum.Stop()
	g.Expect(lost).To(BeEmpty())
	g.Expect(running.Stop()).To(BeEmpty(), "two control-plane remediations ran at once")
	g.Expect(check()).To(Succeed())
}
