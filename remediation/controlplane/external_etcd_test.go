package controlplane

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
)

// externalKCP returns kcpObject with etcd.external set, as a user writes it.
func externalKCP(*testing.T) *unstructured.Unstructured { return kcpObject(withExternalEtcd()) }

// With external etcd the steps never read etcd (the fake's Inspect fails, and is not called): the
// surge is one, and a replacement is up when it serves the API.
func TestStepsWithExternalEtcdReadNoEtcd(t *testing.T) {
	etcdFails := withEtcd(&fakeEtcd{inspectErr: errInjected})
	healthy := withMachines(cpMachine("m-a", kcpHealthy()), cpMachine("m-b", kcpHealthy()), cpMachine("m-c", kcpHealthy()))
	runStepCases(t, caprv1.StepScaleUp, []stepCase{
		{name: "replicas raised by one, with remediation-in-progress, etcd not read",
			world: []worldOption{withControlPlaneObject(kcpObject(withExternalEtcd())), etcdFails, healthy},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(w.replicas(g)).To(BeEquivalentTo(4))
				g.Expect(w.controlPlaneAnnotations(g)).To(HaveKey(controlplanev1.RemediationInProgressAnnotation))
				g.Expect(w.etcd.inspected).To(BeEmpty())
			}},
	})
	runStepCases(t, caprv1.StepWaitForReplacement, []stepCase{
		{name: "replacement not serving yet: waits, etcd not read",
			world: []worldOption{withControlPlaneObject(kcpObject(withExternalEtcd())), etcdFails, healthy,
				withReplacement(cpMachine("m-d", kcpHealthy(), func(m *clusterv1.Machine) {
					m.Status.Conditions[0].Status = "Unknown" // APIServerPodHealthy
				}))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectIssued(g, res, err)
				g.Expect(res.Message).To(ContainSubstring("APIServerPodHealthy"))
				g.Expect(w.etcd.inspected).To(BeEmpty())
			}},
		{name: "replacement serving: done, etcd not read",
			world: []worldOption{withControlPlaneObject(kcpObject(withExternalEtcd())), etcdFails, healthy, withReplacement(cpMachine("m-d", kcpHealthy()))},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectDone(g, res, err)
				g.Expect(res.Message).To(ContainSubstring("serving the API"))
				g.Expect(w.etcd.inspected).To(BeEmpty())
			}},
	})
	runStepCases(t, caprv1.StepRemoveMember, []stepCase{
		{name: "a membership step in an old record is skipped, etcd not touched",
			world: []worldOption{withControlPlaneObject(kcpObject(withExternalEtcd())), etcdFails},
			check: func(g Gomega, w *world, res stepResult, err error) {
				expectSkipped(g, res, err)
				g.Expect(w.etcd.inspected).To(BeEmpty())
				expectNoEtcdChange(g, w)
			}},
	})
}

func TestPlacementOf(t *testing.T) {
	g := NewWithT(t)
	g.Expect(remediation.EtcdPlacementOf(kcpObject())).To(Equal(caprv1.EtcdPlacementStacked))
	g.Expect(remediation.EtcdPlacementOf(externalKCP(t))).To(Equal(caprv1.EtcdPlacementExternal))
	local := kcpObject()
	g.Expect(unstructured.SetNestedMap(local.Object, map[string]interface{}{"dataDir": "/var/lib/etcd"},
		"spec", "kubeadmConfigSpec", "clusterConfiguration", "etcd", "local")).To(Succeed())
	g.Expect(remediation.EtcdPlacementOf(local)).To(Equal(caprv1.EtcdPlacementStacked))
	other := externalKCP(t)
	other.SetKind("SandboxControlPlane")
	g.Expect(remediation.EtcdPlacementOf(other)).To(Equal(caprv1.EtcdPlacementStacked), "only KCP's spec is understood; any other provider is Stacked")
	g.Expect(remediation.EtcdPlacementOf(nil)).To(Equal(caprv1.EtcdPlacementStacked))
}

func TestStepsWithExternalEtcdHaveNoMembershipSteps(t *testing.T) {
	g := NewWithT(t)
	for _, order := range []caprv1.ControlPlaneOrder{caprv1.ControlPlaneOrderScaleUpFirst, caprv1.ControlPlaneOrderRemoveMemberFirst, caprv1.ControlPlaneOrderDeleteFirst, caprv1.ControlPlaneOrderReplace} {
		steps := StepsWithEtcd(order, caprv1.EtcdPlacementExternal)
		g.Expect(steps).NotTo(ContainElements(caprv1.StepMoveLeader), order)
		g.Expect(steps).NotTo(ContainElements(caprv1.StepRemoveMember), order)
		g.Expect(steps).To(ContainElement(caprv1.StepDelete), order)
		g.Expect(StepsWithEtcd(order, caprv1.EtcdPlacementStacked)).To(Equal(StepsFor(order)))
		g.Expect(StepsWithEtcd(order, "")).To(Equal(StepsFor(order)), "a record without a placement is Stacked")
	}
	g.Expect(StepsWithEtcd(caprv1.ControlPlaneOrderScaleUpFirst, caprv1.EtcdPlacementExternal)).To(Equal(
		[]caprv1.StepName{caprv1.StepScaleUp, caprv1.StepWaitForReplacement, caprv1.StepFence, caprv1.StepDelete}))
	mr := &caprv1.MachineRemediation{Status: caprv1.MachineRemediationStatus{ControlPlane: &caprv1.ControlPlaneRemediationStatus{
		Order: caprv1.ControlPlaneOrderDeleteFirst, Etcd: caprv1.EtcdPlacementExternal}}}
	g.Expect(PlanSteps(mr)).To(Equal([]caprv1.StepName{caprv1.StepFence, caprv1.StepDelete, caprv1.StepWaitForReplacement}))
}

func TestKCPWithExternalEtcd(t *testing.T) {
	g := NewWithT(t)
	cp := externalKCP(t)
	plan := KCP{}.Surge(cp)
	g.Expect(plan.Replicas).To(Equal(int32(1)), plan.Reason)
	g.Expect(plan.Machines).To(Equal(int32(1)), plan.Reason)

	// KCP never sets the etcd conditions with external etcd: a Machine without them serves.
	serving := kcpMachine("a")
	serving.Status.Conditions = serving.Status.Conditions[:3]
	g.Expect(KCP{}.ServesAPI(serving)).To(BeEmpty())
	g.Expect(KCP{}.ServesAPI(kcpMachine("b", controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition))).To(ContainSubstring("APIServerPodHealthy"))
	noNode := kcpMachine("c")
	noNode.Status.NodeRef = clusterv1.MachineNodeReference{}
	g.Expect(KCP{}.ServesAPI(noNode)).To(ContainSubstring("no Node"))

	// Preflights ignore etcd: no member list is needed to scale up, and an etcd condition that KCP
	// does not set does not hold a scale-down.
	victim := kcpMachine("victim", controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition)
	b := kcpMachine("b")
	b.Status.Conditions = b.Status.Conditions[:3]
	view := ProviderView{ControlPlane: cp, Machines: []*clusterv1.Machine{serving, b, victim}, Victim: victim}
	g.Expect(KCP{}.ScaleUpRefusal(view, false)).To(BeEmpty())
	g.Expect(KCP{}.ScaleDownRefusal(view)).To(BeEmpty())
	view.Machines = []*clusterv1.Machine{serving, kcpMachine("b", controlplanev1.KubeadmControlPlaneMachineSchedulerPodHealthyCondition), victim}
	g.Expect(KCP{}.ScaleDownRefusal(view)).To(ContainSubstring("b is not"))
}
