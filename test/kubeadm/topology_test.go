package kubeadm_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	"github.com/capr-io/capr/remediation/controlplane"
	"github.com/capr-io/capr/remediation/fencing"
	"github.com/capr-io/capr/test/builder"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/kubeadm"
	"github.com/capr-io/capr/test/sandbox"
)

// TestTopologyNodeNotReadyMemberHealthySurgesThroughCluster: a cluster built from a ClusterClass
// (CAPI's Cluster topology controller owns KCP's spec.replicas), a control-plane Node stops renewing
// its Lease while its etcd member stays healthy. CAPR surges through Cluster
// spec.topology.controlPlane.replicas (3 → 5 → 3, server-side applied by its own field manager),
// never through KCP's field, and returns them as soon as KCP created the first replacement: both
// fields take exactly the values 3, 5, 3 (no flapping, nothing reverted by the topology controller),
// the failure margin never drops below one, and the API server's watch sees exactly one control-plane
// Machine created (no second replacement, no rollout). KCP's own remediation deletes first on the
// same cluster, margin 0 (docs/user/topology.md).
func TestTopologyNodeNotReadyMemberHealthySurgesThroughCluster(t *testing.T) {
	var victim string
	var history *sandbox.ReplicasHistory
	res := kubeadm.RunScenario(ctx, t, sb, "topo-hb", kubeadm.Scenario{ControlPlane: 3, Topology: &sandbox.TopologySpec{},
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			var err error
			if history, err = sb.WatchTopologyReplicas(ctx, wc); err != nil {
				return nil, err
			}
			victim = machines[1].Name
			return []string{victim}, sb.StopHeartbeat(ctx, wc, machines[1].Status.NodeRef.Name)
		}})
	g := NewWithT(t)
	values, err := history.Stop()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.MinMargin).To(BeNumerically(">=", 1), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	mr := res.Remediations[victim]
	cps := mr.Status.ControlPlane
	g.Expect(cps.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), cps.OrderReason)
	g.Expect(cps.Surge).To(Equal(int32(2)))
	g.Expect(cps.ReplicasField).To(Equal(caprv1.ReplicasFieldClusterTopology))
	g.Expect(kubeadm.StepNames(mr)).To(Equal(builder.Steps[caprv1.ControlPlaneOrderScaleUpFirst]))
	g.Expect(mr.Status.Steps[0].Message).To(ContainSubstring("Cluster wc spec.topology.controlPlane replicas 3 → 5, applied by field manager " + controlplane.TopologyFieldManager))
	g.Expect(values["Cluster"]).To(Equal([]int32{3, 5, 3}), "Cluster spec.topology.controlPlane.replicas over time")
	g.Expect(values["KubeadmControlPlane"]).To(Equal([]int32{3, 5, 3}), "KCP spec.replicas over time")
	g.Expect(cps.Replacements).To(Equal(int32(1)), cps.SurgeReason)
	g.Expect(res.Created).To(ConsistOf(cps.Replacement), "control-plane Machines created")

	// What a GitOps tool sees afterwards: the value it had, and CAPR's field manager gone from the
	// field, so that an apply of another value later takes it without a conflict (a dry run here:
	// the same request as a real one, without its effect).
	cluster := &clusterv1.Cluster{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: mr.Namespace, Name: "wc"}, cluster)).To(Succeed())
	g.Expect(topologyReplicasManagers(g, cluster)).NotTo(ContainElement(controlplane.TopologyFieldManager))
	apply := &unstructured.Unstructured{}
	apply.SetAPIVersion(clusterv1.GroupVersion.String())
	apply.SetKind("Cluster")
	apply.SetNamespace(mr.Namespace)
	apply.SetName("wc")
	g.Expect(unstructured.SetNestedField(apply.Object, int64(4), "spec", "topology", "controlPlane", "replicas")).To(Succeed())
	g.Expect(sb.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(apply), client.FieldOwner("gitops"), client.DryRunAll)).To(Succeed(),
		"a later apply of another value, not forced, conflicts with nobody")
}

// TestTopologyMemberDeadDeletesFirst: on a cluster built from a ClusterClass the victim's etcd
// process dies. CAPR removes the dead member and deletes the victim first, and KCP replaces it at
// the replicas it has: nothing the topology owns changes (both replica fields stay 3), one Machine
// is created, and the failure margin is what the dead member left (0), never less. `make test-kcp`
// runs it; `make test` leaves it out (hack/test-levels.sh).
func TestTopologyMemberDeadDeletesFirst(t *testing.T) {
	var victim string
	var history *sandbox.ReplicasHistory
	res := kubeadm.RunScenario(ctx, t, sb, "topo-dead", kubeadm.Scenario{ControlPlane: 3, Topology: &sandbox.TopologySpec{},
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			var err error
			if history, err = sb.WatchTopologyReplicas(ctx, wc); err != nil {
				return nil, err
			}
			victim = machines[1].Name
			sb.KillEtcdMember(wc, machines[1].Status.NodeRef.Name)
			return []string{victim}, nil
		}})
	g := NewWithT(t)
	values, err := history.Stop()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "the failure margin dropped to %d at %s", res.MinMargin, res.MinMarginAt)
	cps := res.Remediations[victim].Status.ControlPlane
	g.Expect(cps.Order).To(Equal(caprv1.ControlPlaneOrderDeleteFirst), cps.OrderReason)
	g.Expect(cps.OrderReason).To(ContainSubstring("removing it first costs no failure margin"))
	g.Expect(cps.Surge).To(BeZero())
	g.Expect(values["Cluster"]).To(Equal([]int32{3}), "Cluster spec.topology.controlPlane.replicas over time")
	g.Expect(values["KubeadmControlPlane"]).To(Equal([]int32{3}), "KCP spec.replicas over time")
	g.Expect(res.Created).To(HaveLen(1), "one replacement: %v", res.Created)
}

// TestTopologyLeaveWaitsForConsent: spec.controlPlane.topologyReplicas Leave (e.g. a GitOps tool
// owns the Cluster's replicas). A healthy member leaves only orders that lose the failure margin:
// the request waits WouldLoseFailureMargin and the Cluster is never written; once a person sets
// order RemoveMemberFirst on it, the victim is deleted first without any replicas change. `make
// test-kcp` runs it; `make test` leaves it out (hack/test-levels.sh).
func TestTopologyLeaveWaitsForConsent(t *testing.T) {
	var victim string
	var history *sandbox.ReplicasHistory
	res := kubeadm.RunScenario(ctx, t, sb, "topo-leave", kubeadm.Scenario{ControlPlane: 3, Topology: &sandbox.TopologySpec{},
		HealthCheck: func(mhc *caprv1.MachineHealthCheck) {
			mhc.Spec.Remediation.ControlPlane = &caprv1.ControlPlaneRemediationSpec{TopologyReplicas: caprv1.TopologyReplicasLeave}
		},
		Inject: func(ctx context.Context, wc *sandbox.WorkloadCluster, machines []clusterv1.Machine) ([]string, error) {
			var err error
			if history, err = sb.WatchTopologyReplicas(ctx, wc); err != nil {
				return nil, err
			}
			victim = machines[1].Name
			if err := sb.StopHeartbeat(ctx, wc, machines[1].Status.NodeRef.Name); err != nil {
				return nil, err
			}
			// The request waits for consent, then gets it.
			mr := &caprv1.MachineRemediation{}
			if err := waitFor(ctx, 3*time.Minute, func() (bool, error) {
				if err := sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim}, mr); err != nil {
					return false, client.IgnoreNotFound(err)
				}
				return conditions.GetReason(mr, caprv1.MachineRemediationProgressingCondition) == caprv1.MachineRemediationWouldLoseFailureMarginReason, nil
			}); err != nil {
				return nil, fmt.Errorf("waiting for %s to wait WouldLoseFailureMargin: %w", victim, err)
			}
			base := mr.DeepCopy()
			if mr.Spec.ControlPlane == nil {
				mr.Spec.ControlPlane = &caprv1.ControlPlaneRemediationSpec{}
			}
			mr.Spec.ControlPlane.Order = caprv1.ControlPlaneOrderRemoveMemberFirst
			return []string{victim}, sb.Client.Patch(ctx, mr, client.MergeFrom(base))
		}})
	g := NewWithT(t)
	values, err := history.Stop()
	g.Expect(err).NotTo(HaveOccurred())
	cps := res.Remediations[victim].Status.ControlPlane
	// The member votes (only the heartbeat stopped): KCP's kcp-cleanup hook removes it during the
	// victim's deletion, as under KCP's own remediation.
	g.Expect(cps.Order).To(Equal(caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval), cps.OrderReason)
	g.Expect(cps.OrderReason).To(ContainSubstring("topologyReplicas is Leave"))
	g.Expect(values["Cluster"]).To(Equal([]int32{3}), "the Cluster was never written")
	g.Expect(values["KubeadmControlPlane"]).To(Equal([]int32{3}))
	g.Expect(res.MinMargin).To(BeNumerically(">=", 0), "quorum kept; the margin was given up by consent (%s)", res.MinMarginAt)
}

// waitFor polls cond every second until it is true, it fails, or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(context.Context) (bool, error) { return cond() })
}

// topologyHealthChecks returns a ClusterClass's control-plane and worker health checks (a Node not
// Ready for 2 s) whose remediation is CAPR's MachineRemediationTemplate template: CAPI's topology
// controller generates a MachineHealthCheck from each, and those create the MachineRemediations.
func topologyHealthChecks(template string) *sandbox.TopologySpec {
	checks := []clusterv1.UnhealthyNodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To(int32(2))},
		{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To(int32(2))},
	}
	ref := clusterv1.MachineHealthCheckRemediationTemplateReference{APIVersion: caprv1.GroupVersion.String(), Kind: "MachineRemediationTemplate", Name: template}
	return &sandbox.TopologySpec{
		ControlPlaneHealthCheck: &clusterv1.ControlPlaneClassHealthCheck{
			Checks:      clusterv1.ControlPlaneClassHealthCheckChecks{UnhealthyNodeConditions: checks},
			Remediation: clusterv1.ControlPlaneClassHealthCheckRemediation{TemplateRef: ref},
		},
		WorkerHealthCheck: &clusterv1.MachineDeploymentClassHealthCheck{
			Checks:      clusterv1.MachineDeploymentClassHealthCheckChecks{UnhealthyNodeConditions: checks},
			Remediation: clusterv1.MachineDeploymentClassHealthCheckRemediation{TemplateRef: ref},
		},
	}
}

// topologyHealthCheckCluster creates CAPR's template (fencing as given), a topology cluster of three
// control-plane Machines and workers whose ClusterClass health checks point at it, and starts CAPR
// with fencer. There is no CAPR health check.
func topologyHealthCheckCluster(t *testing.T, name string, workers int, fencingSpec *caprv1.FencingSpec, fencer fencing.Fencer) *sandbox.WorkloadCluster {
	t.Helper()
	g := NewWithT(t)
	ns, err := capienv.CreateNamespace(ctx, sb.Client, name)
	g.Expect(err).NotTo(HaveOccurred())
	template := &caprv1.MachineRemediationTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "capr"},
		Spec:       caprv1.MachineRemediationTemplateSpec{Template: caprv1.MachineRemediationTemplateResource{Spec: caprv1.MachineRemediationSpec{Fencing: fencingSpec}}},
	}
	g.Expect(sb.Client.Create(ctx, template)).To(Succeed())
	wc, err := sb.CreateCluster(ctx, sandbox.ClusterSpec{Namespace: ns, Name: "wc", ControlPlane: 3, Workers: workers, Topology: topologyHealthChecks(template.Name)})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { sb.DestroyCluster(ctx, wc) })
	t.Cleanup(func() { // runs before the cluster is destroyed
		if t.Failed() {
			t.Log(kubeadm.Describe(ctx, sb, wc))
		}
	})
	// CAPI's topology controller generated one MachineHealthCheck per health check, pointing at CAPR.
	g.Eventually(func(g Gomega) {
		mhcs := &clusterv1.MachineHealthCheckList{}
		g.Expect(sb.Client.List(ctx, mhcs, client.InNamespace(ns))).To(Succeed())
		want := 1
		if workers > 0 {
			want = 2
		}
		g.Expect(mhcs.Items).To(HaveLen(want))
		for _, mhc := range mhcs.Items {
			g.Expect(mhc.Spec.Remediation.TemplateRef.Kind).To(Equal("MachineRemediationTemplate"))
		}
	}, time.Minute, time.Second).Should(Succeed())
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{Options: controllers.Options{Fencer: fencer}})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	return wc
}

// TestTopologyCAPIHealthChecksDriveCAPR: the ClusterClass declares the control-plane and worker
// health checks with CAPR's MachineRemediationTemplate as their remediation. A control-plane Node
// and a worker's kubelet stop; CAPI's generated MachineHealthChecks create the two requests, and
// CAPR remediates both: the control plane by a surge through the Cluster's replicas (quorum kept),
// the worker through its MachineSet, each Machine fenced (Required, the test's backend) before its
// deletion took effect. `make test-kcp` runs it; `make test` leaves it out (hack/test-levels.sh).
func TestTopologyCAPIHealthChecksDriveCAPR(t *testing.T) {
	g := NewWithT(t)
	gate := &sandbox.GateBackend{}
	gate.Open()
	wc := topologyHealthCheckCluster(t, "topo-capi-mhc", 1, sandbox.ExternalFencing("power"), gate.Fencer())
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	workers := workerMachines(g, wc.Namespace)
	g.Expect(workers).To(HaveLen(1))
	quorum := sb.WatchQuorum(ctx, wc)
	deletions, err := sb.WatchMachineDeletions(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(deletions.Stop)
	victim, worker := machines[0], workers[0]
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Expect(sb.StopKubelet(ctx, wc, worker.Status.NodeRef.Name)).To(Succeed())

	g.Eventually(func(g Gomega) {
		for _, name := range []string{victim.Name, worker.Name} {
			mr := &caprv1.MachineRemediation{}
			g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: name}, mr)).To(Succeed())
			if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
				StopTrying(fmt.Sprintf("remediation of %s failed: %v", name, mr.Status.Conditions)).Now()
			}
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "%s: step %s: %v", name, mr.Status.CurrentStep, mr.Status.Conditions)
		}
	}, 10*time.Minute, time.Second).Should(Succeed())
	cp := &caprv1.MachineRemediation{}
	g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: victim.Name}, cp)).To(Succeed())
	g.Expect(cp.Status.ControlPlane.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), cp.Status.ControlPlane.OrderReason)
	g.Expect(cp.Status.ControlPlane.ReplicasField).To(Equal(caprv1.ReplicasFieldClusterTopology))
	expectKCPAtRest(g, wc)
	expectTopologyReplicas(g, wc, 3)
	_, lost := quorum.Stop()
	g.Expect(lost).To(BeEmpty())
	for _, m := range []clusterv1.Machine{victim, worker} {
		g.Expect(gate.FencedAtFor(m.Name).IsZero()).To(BeFalse(), "%s was never fenced", m.Name)
		g.Expect(deletions.SeenAfter(m.Name, sandbox.MachineReleased, gate.FencedAtFor(m.Name))).To(Succeed())
	}
	g.Eventually(func(g Gomega) {
		now := workerMachines(g, wc.Namespace)
		g.Expect(now).To(HaveLen(1))
		g.Expect(now[0].Name).NotTo(Equal(worker.Name))
		g.Expect(now[0].Status.NodeRef.IsDefined()).To(BeTrue())
	}, 3*time.Minute, time.Second).Should(Succeed())
}

// TestTopologyCAPIHealthCheckRecoveryWithdrawsCAPR: the control-plane Node stops reporting, CAPR
// surges through the Cluster's replicas (the replacements cannot come up), then the Node reports
// again. CAPI's generated MachineHealthCheck deletes the request; CAPR, before its point of no
// return, undoes: the Cluster's replicas back to 3 (its field manager still owned the 5), the
// replacements gone, lock and KCP's annotation cleared. `make test-kcp` runs it; `make test`
// leaves it out (hack/test-levels.sh).
func TestTopologyCAPIHealthCheckRecoveryWithdrawsCAPR(t *testing.T) {
	g := NewWithT(t)
	wc := topologyHealthCheckCluster(t, "topo-capi-abort", 0, &caprv1.FencingSpec{Policy: caprv1.FencingDisabled}, nil)
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	history, err := sb.WatchTopologyReplicas(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	recoverDuringSurge(g, wc, machines[0])
	expectKCPAtRest(g, wc)
	expectTopologyReplicas(g, wc, 3)
	values, err := history.Stop()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(values["Cluster"]).To(Equal([]int32{3, 5, 3}), "Cluster spec.topology.controlPlane.replicas over time")
	now, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(now).To(ConsistOf(HaveField("Name", machines[0].Name), HaveField("Name", machines[1].Name), HaveField("Name", machines[2].Name)),
		"the original Machines, and only them")
}

// expectTopologyReplicas checks Cluster spec.topology.controlPlane.replicas.
func expectTopologyReplicas(g Gomega, wc *sandbox.WorkloadCluster, n int32) {
	cluster := &clusterv1.Cluster{}
	g.Expect(sb.Client.Get(ctx, wc.Key(), cluster)).To(Succeed())
	g.Expect(cluster.Spec.Topology.ControlPlane.Replicas).To(HaveValue(Equal(n)))
}

// TestTopologyGitOpsRevertIsLeftAlone: CAPR surges through the Cluster's replicas while KCP cannot
// create Machines (an admission policy refuses them, as a quota would), and a GitOps tool applies
// Git's 3 back during the surge with its own field manager, forced, as Flux's kustomize-controller
// does. CAPR never raises them again, and when CAPI's health check deletes the request (the Node
// reports again) the undo writes nothing to the Cluster: the field stays the GitOps tool's. (With
// Machines created, CAPR returns the replicas itself at the first replacement, within a second of the
// surge, which leaves a GitOps tool almost no window.) `make test-kcp` runs it; `make test` leaves it
// out (hack/test-levels.sh).
func TestTopologyGitOpsRevertIsLeftAlone(t *testing.T) {
	g := NewWithT(t)
	wc := topologyHealthCheckCluster(t, "topo-gitops", 0, &caprv1.FencingSpec{Policy: caprv1.FencingDisabled}, nil)
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	history, err := sb.WatchTopologyReplicas(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	victim := machines[0]
	allowMachines := refuseMachineCreation(t, g, wc.Namespace)
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	mrKey := client.ObjectKey{Namespace: wc.Namespace, Name: victim.Name}
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, mrKey, mr)).To(Succeed())
		g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.StepWaitForReplacement))
		expectTopologyReplicas(g, wc, 5)
	}, 5*time.Minute, time.Second).Should(Succeed())

	const gitops = "gitops-test"
	apply := &unstructured.Unstructured{}
	apply.SetAPIVersion(clusterv1.GroupVersion.String())
	apply.SetKind("Cluster")
	apply.SetNamespace(wc.Namespace)
	apply.SetName(wc.Name)
	g.Expect(unstructured.SetNestedField(apply.Object, int64(3), "spec", "topology", "controlPlane", "replicas")).To(Succeed())
	g.Expect(sb.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(apply), client.FieldOwner(gitops), client.ForceOwnership)).To(Succeed())
	g.Consistently(func(g Gomega) {
		expectTopologyReplicas(g, wc, 3)
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, mrKey, mr)).To(Succeed())
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseRunning))
	}, 10*time.Second, 250*time.Millisecond).Should(Succeed(), "CAPR raised the replicas again")
	g.Eventually(func(g Gomega) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: "wc-cp"}, kcp)).To(Succeed())
		g.Expect(kcp.Spec.Replicas).To(HaveValue(Equal(int32(3))), "the topology applied Git's replicas to KCP")
	}, time.Minute, 250*time.Millisecond).Should(Succeed())
	allowMachines()

	g.Expect(sb.ResumeHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(apierrors.IsNotFound(sb.Client.Get(ctx, mrKey, &caprv1.MachineRemediation{}))).To(BeTrue(), "the request is still there")
	}, 3*time.Minute, time.Second).Should(Succeed())
	expectKCPAtRest(g, wc)
	values, err := history.Stop()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(values["Cluster"]).To(Equal([]int32{3, 5, 3}), "Cluster spec.topology.controlPlane.replicas over time")
	cluster := &clusterv1.Cluster{}
	g.Expect(sb.Client.Get(ctx, wc.Key(), cluster)).To(Succeed())
	g.Expect(topologyReplicasManagers(g, cluster)).To(ConsistOf(gitops), "the GitOps tool's value, never taken back by CAPR")
	now, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(now).To(ConsistOf(HaveField("Name", machines[0].Name), HaveField("Name", machines[1].Name), HaveField("Name", machines[2].Name)))
}

// refuseMachineCreation makes the API server refuse new Machines in namespace ns (a
// ValidatingAdmissionPolicy and its binding, as a platform team's quota or policy might) and waits
// until it does (a server-side dry-run create is refused). It returns the function that lifts it;
// the test's cleanup lifts it too.
func refuseMachineCreation(t *testing.T, g Gomega, ns string) (allow func()) {
	name := "refuse-machines-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{clusterv1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"machines"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "the test refuses new Machines"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}},
		},
	}
	g.Expect(sb.Client.Create(ctx, policy)).To(Succeed())
	g.Expect(sb.Client.Create(ctx, binding)).To(Succeed())
	allow = func() {
		for _, obj := range []client.Object{binding, policy} {
			g.Expect(client.IgnoreNotFound(sb.Client.Delete(ctx, obj))).To(Succeed())
		}
	}
	t.Cleanup(allow)
	probe := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "probe-"},
		Spec: clusterv1.MachineSpec{ClusterName: "wc", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To("none")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "DockerMachine", Name: "none"}},
	}
	g.Eventually(func() error {
		err := sb.Client.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if err == nil {
			return fmt.Errorf("a Machine is still admitted")
		}
		if !strings.Contains(err.Error(), "the test refuses new Machines") {
			return err // not refused by the policy yet (a webhook's own refusal is not it)
		}
		return nil
	}, time.Minute, 100*time.Millisecond).Should(Succeed())
	return allow
}

// topologyReplicasManagers returns the field managers of Cluster spec.topology.controlPlane.replicas
// (status.controlPlane.replicas, CAPI's, is another field).
func topologyReplicasManagers(g Gomega, cluster *clusterv1.Cluster) []string {
	path := fieldpath.MakePathOrDie("spec", "topology", "controlPlane", "replicas")
	var out []string
	for _, mf := range cluster.ManagedFields {
		set := &fieldpath.Set{}
		g.Expect(set.FromJSON(bytes.NewReader(mf.FieldsV1.GetRawBytes()))).To(Succeed())
		if set.Has(path) {
			out = append(out, mf.Manager)
		}
	}
	return out
}

// TestTopologyReplicasRemovedMidRemediationIsLeftAlone: a person removes Cluster
// spec.topology.controlPlane.replicas (the field CAPR surged through) while the remediation waits at
// its Fence step, past the surge. CAPR never adds the field back, deletes the victim once fenced,
// releases its replicas-back hook and ends, leaving the replicas to KCP, and says so. Before the fix
// the Delete step failed on every pass reading the missing field, with the victim held by the hook
// for ever. What KCP does with its own replicas once the topology stops setting them is CAPI's: the
// test only asks that KCP end with as many Machines as its replicas. `make test-kcp` runs it; `make
// test` leaves it out (hack/test-levels.sh).
func TestTopologyReplicasRemovedMidRemediationIsLeftAlone(t *testing.T) {
	g := NewWithT(t)
	gate := &sandbox.GateBackend{}
	wc := topologyHealthCheckCluster(t, "topo-removed", 0, sandbox.ExternalFencing("power"), gate.Fencer())
	machines, err := sb.ControlPlaneMachines(ctx, wc)
	g.Expect(err).NotTo(HaveOccurred())
	victim := machines[0]
	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	mrKey := client.ObjectKey{Namespace: wc.Namespace, Name: victim.Name}
	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, mrKey, mr)).To(Succeed())
		g.Expect(mr.Status.CurrentStep).To(Equal(caprv1.StepFence))
		g.Expect(mr.Status.ControlPlane.ReplicasField).To(Equal(caprv1.ReplicasFieldClusterTopology))
	}, 5*time.Minute, time.Second).Should(Succeed())

	// As `kubectl patch cluster wc --type=json -p '[...]'`. CAPI's CRD refuses an empty
	// spec.topology.controlPlane (minProperties 1), so the field can go only beside another one: here
	// a label for the control plane's objects.
	cluster := &clusterv1.Cluster{}
	g.Expect(sb.Client.Get(ctx, wc.Key(), cluster)).To(Succeed())
	remove := client.RawPatch(types.JSONPatchType, []byte(`[{"op":"add","path":"/spec/topology/controlPlane/metadata","value":{"labels":{"example.com/team":"platform"}}},`+
		`{"op":"remove","path":"/spec/topology/controlPlane/replicas"}]`))
	g.Expect(sb.Client.Patch(ctx, cluster, remove)).To(Succeed())
	gate.Open()

	g.Eventually(func(g Gomega) {
		mr := &caprv1.MachineRemediation{}
		g.Expect(sb.Client.Get(ctx, mrKey, mr)).To(Succeed())
		if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
			StopTrying(fmt.Sprintf("remediation failed: %v", mr.Status.Conditions)).Now()
		}
		g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded), "step %s: %v", mr.Status.CurrentStep, mr.Status.Conditions)
		g.Expect(mr.Status.Steps).To(ContainElement(And(HaveField("Name", caprv1.StepDelete),
			HaveField("Message", ContainSubstring("spec.topology.controlPlane.replicas was removed")))))
	}, 10*time.Minute, time.Second).Should(Succeed())
	g.Expect(apierrors.IsNotFound(sb.Client.Get(ctx, client.ObjectKeyFromObject(&victim), &clusterv1.Machine{}))).To(BeTrue(), "the victim is gone")
	g.Expect(gate.FencedAtFor(victim.Name).IsZero()).To(BeFalse(), "the victim was never fenced")

	g.Expect(sb.Client.Get(ctx, wc.Key(), cluster)).To(Succeed())
	g.Expect(cluster.Spec.Topology.ControlPlane.Replicas).To(BeNil(), "CAPR added the removed field back")
	g.Expect(topologyReplicasManagers(g, cluster)).To(BeEmpty())
	g.Eventually(func(g Gomega) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		g.Expect(sb.Client.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: "wc-cp"}, kcp)).To(Succeed())
		g.Expect(kcp.Annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
		now, err := sb.ControlPlaneMachines(ctx, wc)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(now).To(HaveLen(int(ptr.Deref(kcp.Spec.Replicas, 0))), "KCP at rest at its own replicas")
		for _, m := range now {
			g.Expect(m.Annotations).NotTo(HaveKey(caprv1.ReplicasBackHookAnnotation), m.Name)
		}
		t.Logf("KCP at rest: spec.replicas %d, %d Machines", ptr.Deref(kcp.Spec.Replicas, 0), len(now))
	}, 5*time.Minute, time.Second).Should(Succeed())
}
