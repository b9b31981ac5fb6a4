package controlplane

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
)

// topologyCluster returns a Cluster built from a ClusterClass with spec.topology.controlPlane.replicas
// 3 and its TopologyReconciled condition at status.
func topologyCluster(replicas *int32, reconciled metav1.ConditionStatus) *clusterv1.Cluster {
	c := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "wc"}}
	c.Spec.Topology = clusterv1.Topology{ClassRef: clusterv1.ClusterClassRef{Name: "cc"}, Version: "v1.36.3",
		ControlPlane: clusterv1.ControlPlaneTopology{Replicas: replicas}}
	c.Status.Conditions = []metav1.Condition{{Type: clusterv1.ClusterTopologyReconciledCondition, Status: reconciled, Reason: "ReconcileFailed", Message: "boom"}}
	return c
}

// topologyKCP is a quiet KCP of three replicas, owned by the topology.
func topologyKCP(t *testing.T) *unstructured.Unstructured {
	g := NewWithT(t)
	cp := kcpObject()
	cp.SetLabels(map[string]string{clusterv1.ClusterTopologyOwnedLabel: ""})
	g.Expect(unstructured.SetNestedField(cp.Object, int64(3), "status", "replicas")).To(Succeed())
	g.Expect(unstructured.SetNestedField(cp.Object, int64(3), "status", "upToDateReplicas")).To(Succeed())
	return cp
}

// reachableState is an etcd cluster of healthy, reachable voting members named after the nodes,
// with the members of down unhealthy.
func reachableState(nodes []string, down ...string) *etcdutil.State {
	s := &etcdutil.State{QuorumProven: true}
	bad := map[string]bool{}
	for _, d := range down {
		bad[d] = true
	}
	for i, n := range nodes {
		m := etcdutil.MemberStatus{ID: uint64(i + 1), Name: n, Reachable: true, Healthy: !bad[n]}
		if bad[n] {
			m.Reachable, m.Problem = false, "connection refused"
		}
		s.Members = append(s.Members, m)
	}
	return s
}

func TestTopologyAdapterOnlyForReplicasTheTopologyOwns(t *testing.T) {
	g := NewWithT(t)
	mr := &caprv1.MachineRemediation{}
	g.Expect(topologyAdapter(KCP{}, topologyCluster(ptr.To(int32(3)), metav1.ConditionTrue), topologyKCP(t), mr)).To(BeAssignableToTypeOf(Topology{}))
	// spec.topology.controlPlane.replicas unset: the topology does not set KCP's replicas
	// (desired_state.go computeControlPlane), so KCP's own field is changed as for any KCP.
	g.Expect(topologyAdapter(KCP{}, topologyCluster(nil, metav1.ConditionTrue), topologyKCP(t), mr)).To(Equal(KCP{}))
	// A KCP not owned by the topology (no label) is a hand-built one.
	g.Expect(topologyAdapter(KCP{}, topologyCluster(ptr.To(int32(3)), metav1.ConditionTrue), kcpObject(), mr)).To(Equal(KCP{}))
}

// TestTopologySurgeCreatesOneMachine: where the topology owns the replicas, a surge of two still
// costs one Machine, as KCP's own surge does: the replicas return through the Cluster's field at the
// first replacement (firstreplacement.go), so ChooseOrder weighs the same cost as on a hand-built KCP.
func TestTopologySurgeCreatesOneMachine(t *testing.T) {
	g := NewWithT(t)
	cp := topologyKCP(t)
	g.Expect(KCP{}.Surge(cp)).To(HaveField("Machines", int32(1)))
	plan := Topology{Adapter: KCP{}, cluster: topologyCluster(ptr.To(int32(3)), metav1.ConditionTrue)}.Surge(cp)
	g.Expect(plan.Replicas).To(Equal(int32(2)))
	g.Expect(plan.Machines).To(Equal(int32(1)))
	g.Expect(plan.Reason).To(HavePrefix("through Cluster"))
	g.Expect(plan.Reason).To(ContainSubstring("spec.topology.controlPlane.replicas"))
}

func TestTopologyBusyUntilTheTopologyAppliedItsReplicas(t *testing.T) {
	g := NewWithT(t)
	victim := kcpMachine("c")
	machines := []*clusterv1.Machine{kcpMachine("a"), kcpMachine("b"), victim}
	view := ProviderView{ControlPlane: topologyKCP(t), Machines: machines, Victim: victim}
	g.Expect(Topology{Adapter: KCP{}, cluster: topologyCluster(ptr.To(int32(3)), metav1.ConditionTrue)}.Busy(view)).To(BeEmpty())
	g.Expect(Topology{Adapter: KCP{}, cluster: topologyCluster(ptr.To(int32(5)), metav1.ConditionTrue)}.Busy(view)).To(
		ContainSubstring("spec.topology.controlPlane.replicas is 5 and the Cluster topology has not applied it"))
}

// TestTopologyOrder: the orders a topology-owned KCP of three gets: a dead member
// is deleted first (no replicas change, no margin lost), a healthy one surges through the Cluster's
// replicas, and where CAPR may not surge (policy Leave, topology not reconciled) the healthy one
// waits for consent, which RemoveMemberFirst gives.
func TestTopologyOrder(t *testing.T) {
	nodes := []string{"a", "b", "c"}
	tests := []struct {
		name       string
		down       []string
		policy     caprv1.TopologyReplicasPolicy
		order      caprv1.ControlPlaneOrder
		reconciled metav1.ConditionStatus
		want       caprv1.ControlPlaneOrder
		wait       string
		reason     string
	}{
		{name: "member healthy: surge through the Cluster's replicas", want: caprv1.ControlPlaneOrderScaleUpFirst},
		{name: "member dead: delete first", down: []string{"c"}, want: caprv1.ControlPlaneOrderDeleteFirst, reason: "removing it first costs no failure margin"},
		{name: "member dead, policy Leave: delete first", down: []string{"c"}, policy: caprv1.TopologyReplicasLeave, want: caprv1.ControlPlaneOrderDeleteFirst},
		{name: "member healthy, policy Leave: wait for consent", policy: caprv1.TopologyReplicasLeave, wait: caprv1.MachineRemediationWouldLoseFailureMarginReason},
		{name: "member healthy, policy Leave, consent given: delete first, KCP's hook removes the member", policy: caprv1.TopologyReplicasLeave, order: caprv1.ControlPlaneOrderRemoveMemberFirst,
			want: caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval, reason: "topologyReplicas is Leave"},
		{name: "member healthy, topology not reconciled: wait for consent", reconciled: metav1.ConditionFalse, wait: caprv1.MachineRemediationWouldLoseFailureMarginReason},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			reconciled := tt.reconciled
			if reconciled == "" {
				reconciled = metav1.ConditionTrue
			}
			mr := &caprv1.MachineRemediation{Spec: caprv1.MachineRemediationSpec{ControlPlane: &caprv1.ControlPlaneRemediationSpec{TopologyReplicas: tt.policy}}}
			adapter := topologyAdapter(KCP{}, topologyCluster(ptr.To(int32(3)), reconciled), topologyKCP(t), mr)
			var machines []*clusterv1.Machine
			for _, n := range nodes {
				if len(tt.down) > 0 && n == tt.down[0] {
					machines = append(machines, kcpMachine(n, "EtcdMemberHealthy"))
				} else {
					machines = append(machines, kcpMachine(n))
				}
			}
			victim := machines[2]
			state := reachableState(nodes, tt.down...)
			view := ProviderView{ControlPlane: topologyKCP(t), Machines: machines, Victim: victim, Etcd: state}
			g.Expect(adapter.Busy(view)).To(BeEmpty())
			policy := caprv1.ControlPlaneOrderAuto
			if tt.order != "" {
				policy = tt.order
			}
			in := OrderInput{Policy: policy, Initialized: true, Counts: state.Counts(), Victim: victimMember(state, "c")}
			in.setProvider(adapter, view)
			d := ChooseOrder(in)
			g.Expect(d.WaitReason).To(Equal(tt.wait), d.WaitMessage)
			g.Expect(d.Order).To(Equal(tt.want), d.Reason)
			g.Expect(d.Reason).To(ContainSubstring(tt.reason))
		})
	}
}

// TestOwnsTopologyReplicas reads managedFields as the API server writes them (the entries below are
// copied from a real Cluster after CAPR's apply and after a person's kubectl edit).
func TestOwnsTopologyReplicas(t *testing.T) {
	g := NewWithT(t)
	replicas := []byte(`{"f:spec":{"f:topology":{"f:controlPlane":{"f:replicas":{}}}}}`)
	other := []byte(`{"f:spec":{"f:topology":{"f:version":{}}}}`)
	entry := func(manager string, op metav1.ManagedFieldsOperationType, fields []byte) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: fields}}
	}
	c := &clusterv1.Cluster{}
	c.ManagedFields = []metav1.ManagedFieldsEntry{entry("kubectl-edit", metav1.ManagedFieldsOperationUpdate, replicas), entry(TopologyFieldManager, metav1.ManagedFieldsOperationApply, other)}
	g.Expect(ownsTopologyReplicas(c)).To(BeFalse(), "someone else owns the field")
	g.Expect(topologyReplicasOwners(c)).To(Equal("kubectl-edit (Update)"))
	c.ManagedFields = []metav1.ManagedFieldsEntry{entry(TopologyFieldManager, metav1.ManagedFieldsOperationApply, replicas)}
	g.Expect(ownsTopologyReplicas(c)).To(BeTrue())
	c.ManagedFields = []metav1.ManagedFieldsEntry{entry(TopologyFieldManager, metav1.ManagedFieldsOperationApply, []byte(`not json`))}
	g.Expect(ownsTopologyReplicas(c)).To(BeFalse(), "unreadable entries own nothing")
}
