package e2e_test

import (
	"fmt"
	"sort"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// machinesOf returns the cluster's control-plane and worker Machines that are not being deleted,
// sorted by name.
func machinesOf(g Gomega, ns, cluster string) (controlPlane, workers []clusterv1.Machine) {
	list := &clusterv1.MachineList{}
	g.Expect(env.client().List(ctx, list, client.InNamespace(ns), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster})).To(Succeed())
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	for _, m := range list.Items {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		if _, ok := m.Labels[clusterv1.MachineControlPlaneLabel]; ok {
			controlPlane = append(controlPlane, m)
		} else {
			workers = append(workers, m)
		}
	}
	return controlPlane, workers
}

// TestRemediatesAControlPlaneMachineAndAWorker: CAPR's health checks on a cluster's control plane
// and workers; a control-plane Node and a worker Node stop at once. Both Machines are marked and
// remediated — the control-plane one replaced through KubeadmControlPlane with its etcd member
// removed, the worker deleted and replaced by its MachineSet — and the cluster is back at three
// control-plane Machines and two workers, every one with a Node, neither broken Machine among them.
func TestRemediatesAControlPlaneMachineAndAWorker(t *testing.T) {
	g := NewWithT(t)
	c := env.client()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "capr-e2e-"}}
	g.Expect(c.Create(ctx, ns)).To(Succeed())
	cluster := env.createCluster(t, ns.Name)
	cpCheck, workerCheck := env.healthChecks(ns.Name, cluster)
	g.Expect(c.Create(ctx, cpCheck)).To(Succeed())
	g.Expect(c.Create(ctx, workerCheck)).To(Succeed())

	cp, workers := machinesOf(g, ns.Name, cluster)
	g.Expect(cp).To(HaveLen(3))
	g.Expect(workers).To(HaveLen(2))
	victims := []clusterv1.Machine{cp[1], workers[0]}
	for _, m := range victims {
		env.breakNode(t, ns.Name, cluster, m.Status.NodeRef.Name)
	}

	g.Eventually(func(g Gomega) {
		for _, m := range victims {
			mr := &caprv1.MachineRemediation{}
			g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: m.Name}, mr)).To(Succeed(), "no request for %s", m.Name)
			if mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
				StopTrying(fmt.Sprintf("the remediation of %s failed: %v", m.Name, mr.Status.Conditions)).Now()
			}
			g.Expect(mr.Status.Phase).To(Equal(caprv1.MachineRemediationPhaseSucceeded),
				"%s on %s: step %s: %v", m.Name, env.name(), mr.Status.CurrentStep, mr.Status.Conditions)
		}
		cp, workers := machinesOf(g, ns.Name, cluster)
		g.Expect(cp).To(HaveLen(3))
		g.Expect(workers).To(HaveLen(2))
		for _, m := range append(cp, workers...) {
			g.Expect(m.Name).NotTo(BeElementOf(victims[0].Name, victims[1].Name))
			g.Expect(m.Status.NodeRef.IsDefined()).To(BeTrue(), "Machine %s has no Node", m.Name)
		}
	}, env.remediationTimeout(), env.remediationTimeout()/300).Should(Succeed())

	mr := &caprv1.MachineRemediation{}
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: victims[0].Name}, mr)).To(Succeed())
	g.Expect(mr.Status.ControlPlane).NotTo(BeNil())
	g.Expect(mr.Status.Step(caprv1.StepRemoveMember)).NotTo(BeNil(), "the control-plane victim's etcd member was not removed by CAPR")
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: victims[1].Name}, mr)).To(Succeed())
	g.Expect(mr.Status.Worker).NotTo(BeNil())
	g.Expect(mr.Status.Step(caprv1.StepDelete)).NotTo(BeNil())
}
