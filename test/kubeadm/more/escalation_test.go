package more_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/kubeadm"
	"github.com/capr-io/capr/test/sandbox"
)

// Escalation of control-plane Machines on the real KCP: the reboot operator is the sandbox's
// stand-in (test/sandbox/reboot.go, nothing real can reboot a sandbox node); the Node conditions come
// from kube-controller-manager's node lifecycle controller.

// escalationSeconds is the escalation step's timeoutSeconds (the API's minimum), turned into 15 s by
// escalationTimeout.
const escalationSeconds = 60

func escalationTimeout(seconds int32) time.Duration {
	return time.Duration(seconds) * 250 * time.Millisecond
}

// withReboot gives a health check a one-step escalation, a SandboxReboot from a template it creates
// in the health check's namespace (fails: the reboot does not bring the node back).
func withReboot(t *testing.T, fails bool) func(*caprv1.MachineHealthCheck) {
	return func(mhc *caprv1.MachineHealthCheck) {
		NewWithT(t).Expect(sb.Client.Create(ctx, sandbox.RebootTemplate(mhc.Namespace, "reboot", fails))).To(Succeed())
		mhc.Spec.Remediation.Escalation = []caprv1.EscalationStep{{
			TemplateRef:    caprv1.TemplateReference{APIVersion: sandbox.RebootGroupVersion.String(), Kind: "SandboxRebootTemplate", Name: "reboot"},
			TimeoutSeconds: escalationSeconds,
		}}
	}
}

// TestKCPRebootRecovers: a control-plane Node stops renewing its Lease; the remediation reboots it
// before anything else and the Node is Ready again. The remediation ends Succeeded with nothing
// replaced: KCP was never asked for a replica, never saw remediation-in-progress, and keeps its
// three Machines and members.
func TestKCPRebootRecovers(t *testing.T) {
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, "kcp-reboot")
	g.Expect(err).NotTo(HaveOccurred())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: 3})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(kubeadm.Describe(ctx, sb, wc))
		}
	})
	mhc := sandbox.ControlPlaneHealthCheck(ns, "cp", wc.Name, 2)
	withReboot(t, false)(mhc)
	g.Expect(sb.Client.Create(ctx, mhc)).To(Succeed())
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	before, err := sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{EscalationTimeout: escalationTimeout}})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	quorum := sb.WatchQuorum(ctx, wc)

	victim := machines[1]
	start := time.Now()
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	mr := &caprv1.MachineRemediation{}
	g.Eventually(func(g Gomega) {
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim.Name}, mr)).To(Succeed())
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
	}, 5*time.Minute, time.Second).Should(Succeed())
	_, rebooted := sb.Log.Find(wc.LogKey(), start, "node "+victim.Status.NodeRef.Name+" rebooted")
	g.Expect(rebooted).To(BeTrue(), "the sandbox's reboot operator never saw a SandboxReboot")
	g.Expect(kubeadm.StepNames(mr)).To(Equal([]caprv1.StepName{caprv1.EscalationStepName(0)}))
	g.Expect(mr.Status.Steps[0].Outcome).To(Equal(caprv1.StepOutcomeSucceeded))

	reboot := sandbox.Reboot(ns, victim.Name)
	g.Eventually(func() bool {
		return apierrors.IsNotFound(sb.Client.Get(ctx, client.ObjectKeyFromObject(reboot), reboot))
	}, time.Minute, 250*time.Millisecond).Should(BeTrue(), "the reboot outlived the remediation")
	kcp := &controlplanev1.KubeadmControlPlane{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "wc-cp"}, kcp)).To(Succeed())
	g.Expect(ptr.Deref(kcp.Spec.Replicas, 0)).To(BeEquivalentTo(3))
	g.Expect(kcp.Annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
	g.Expect(kcp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
	now, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(now).To(HaveLen(3))
	for _, m := range now {
		g.Expect(m.UID).To(BeElementOf(machines[0].UID, machines[1].UID, machines[2].UID), "a Machine was replaced")
		g.Expect(m.Annotations).NotTo(HaveKey(caprv1.FenceBeforeDeleteHookAnnotation))
	}
	after, err := sb.EtcdState(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(after.Members).To(HaveLen(len(before.Members)))
	for _, m := range before.Members {
		g.Expect(after.ByName(m.Name)).NotTo(BeNil(), "member %s is gone", m.Name)
	}
	_, lost := quorum.Stop()
	g.Expect(lost).To(BeEmpty())
}

// TestKCPRebootThatDoesNotHelpIsFollowedByReplacement: the reboot leaves the Node down. At the step's
// timeout the reboot is deleted, the order is chosen again, and the Machine is replaced as without
// escalation (a surge of two, KCP's admission refusing even replicas), quorum kept throughout. The
// failure margin is 0, not 1, from the reboot until the first replacement votes: a reboot takes its
// member down, which quorum.CanTakeDown allows when the healthy others still make a quorum (2 of 3),
// and the stand-in reboot stops the member as a real one does (test/sandbox/reboot.go).
func TestKCPRebootThatDoesNotHelpIsFollowedByReplacement(t *testing.T) {
	var victim string
	res := kubeadm.RunScenario(ctx, t, sb, "kcp-reboot-fails", kubeadm.Scenario{ControlPlane: 3,
		HealthCheck: withReboot(t, true), EscalationTimeout: escalationTimeout,
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			victim = machines[1].Name
			return []string{victim}, sb.StopHeartbeat(ctx, wc, machines[1].Status.NodeRef.Name)
		}})
	g := NewWithT(t)
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "etcd lost quorum at %s", res.MinMarginAt)
	mr := res.Remediations[victim]
	steps := kubeadm.StepNames(mr)
	g.Expect(steps).NotTo(BeEmpty())
	g.Expect(steps[0]).To(Equal(caprv1.EscalationStepName(0)))
	g.Expect(mr.Status.Steps[0].Outcome).To(Equal(caprv1.StepOutcomeFailed))
	g.Expect(mr.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), mr.Status.ControlPlane.OrderReason)
	g.Expect(mr.Status.ControlPlane.Surge).To(Equal(int32(2)))
}
