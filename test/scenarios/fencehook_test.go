package scenarios_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/test/sandbox"
)

// TestVictimDeletedBySomeoneElseWaitsForItsFence: while a remediation runs, someone else deletes the
// victim Machine (a rollout of the control-plane provider, a person). CAPI's pre-drain hook that the
// remediation keeps on it holds that deletion: the victim is not drained, powered off or deleted
// until its fence is confirmed. Then the deletion proceeds and the control plane is back at 3.
func TestVictimDeletedBySomeoneElseWaitsForItsFence(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t, withHealthCheck(func(mhc *caprv1.MachineHealthCheck) {
		mhc.Spec.Remediation.Fencing = sandbox.ExternalFencing("gate")
	}))
	check := writeData(t, wc)
	gate, deletions := startCAPRBehindGate(t, wc)
	start := time.Now()
	victim := controlPlane(g, wc)[1]
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())

	// Running, with the hook on the victim; then someone else deletes the victim.
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
		m := &clusterv1.Machine{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim.Name}, m)).To(Succeed())
		g.Expect(m.Annotations).To(HaveKeyWithValue(caprv1.FenceBeforeDeleteHookAnnotation, victim.Name))
	}, remediationTimeout, 200*time.Millisecond).Should(Succeed())
	m := victim.DeepCopy()
	g.Expect(sb.Client.Delete(ctx, m)).To(Succeed())

	// Unfenced, the victim stays: deleting, not torn down.
	g.Consistently(func(g Gomega) {
		g.Expect(sb.Client.Get(ctx, client.ObjectKeyFromObject(m), m)).To(Succeed())
		g.Expect(m.DeletionTimestamp.IsZero()).To(BeFalse())
		_, tornDown := sb.Log.Find(wc.LogKey(), start, "Machine "+victim.Name+" deleted")
		g.Expect(tornDown).To(BeFalse(), "the victim was torn down before its fence")
	}, 10*time.Second, 250*time.Millisecond).Should(Succeed())

	// Fenced, the deletion proceeds. The remediation then either completes (its replacement had been
	// created before the deletion: it reached its own Fence and Delete steps) or ends Failed saying
	// who took the victim (the provider created no replacement while the victim was deleting).
	gate.Open()
	g.Eventually(func(g Gomega) {
		mr := getRemediation(g, wc, victim.Name)
		g.Expect(mr.Status.Phase).To(BeElementOf(caprv1.MachineRemediationPhaseFailed, caprv1.MachineRemediationPhaseSucceeded))
		if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
			g.Expect(mr.Status.LastError).To(ContainSubstring("deleted by someone else"))
		}
	}, remediationTimeout, 200*time.Millisecond).Should(Succeed())
	deleted, ok := sb.Log.Find(wc.LogKey(), start, "Machine "+victim.Name+" deleted")
	g.Expect(ok).To(BeTrue())
	g.Expect(deleted).To(BeTemporally(">=", gate.FencedAt()))
	// From the API server, against the backend's confirmation (ms): the deletion took effect only
	// once the victim was fenced.
	g.Expect(deletions.SeenAfter(victim.Name, sandbox.MachineReleased, gate.FencedAtFor(victim.Name))).To(Succeed())
	g.Expect(sb.WaitForControlPlane(ctx, wc, 3, 3*time.Minute)).To(Succeed())
	check()
}

// startCAPRBehindGate starts CAPR's manager, with the RBAC it ships, fencing through a closed gate
// (its External backend: sandbox.ExternalFencing("gate")), and watches wc's Machine deletions as the
// API server shows them, both for the rest of the test.
func startCAPRBehindGate(t *testing.T, wc *sandbox.WorkloadCluster) (*sandbox.GateBackend, *sandbox.FirstSeen) {
	t.Helper()
	g := NewWithT(t)
	gate := &sandbox.GateBackend{}
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{Fencer: gate.Fencer()}})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	deletions, err := sb.WatchMachineDeletions(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(deletions.Stop)
	return gate, deletions
}
