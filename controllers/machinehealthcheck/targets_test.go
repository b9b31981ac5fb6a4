package machinehealthcheck

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// machine returns a worker Machine with a Node, changed by the given options (e.g. asControlPlane).
func machine(options ...func(*clusterv1.Machine)) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{
		Name: "m", Labels: map[string]string{}, CreationTimestamp: metav1.NewTime(now.Add(-time.Hour)),
	}}
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: "n"}
	for _, o := range options {
		o(m)
	}
	return m
}

// asControlPlane makes a test Machine a control-plane Machine.
func asControlPlane(m *clusterv1.Machine) {
	m.Labels[clusterv1.MachineControlPlaneLabel] = ""
}

func node(conds ...corev1.NodeCondition) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Conditions: conds}}
}

// deletingNode is a Node deleting (held by a finalizer) for age.
func deletingNode(age time.Duration, conds ...corev1.NodeCondition) *corev1.Node {
	n := node(conds...)
	n.DeletionTimestamp = ptr.To(metav1.NewTime(now.Add(-age)))
	n.Finalizers = []string{"example.com/hold"}
	return n
}

func nodeCond(t corev1.NodeConditionType, s corev1.ConditionStatus, age time.Duration) corev1.NodeCondition {
	return corev1.NodeCondition{Type: t, Status: s, LastTransitionTime: metav1.NewTime(now.Add(-age))}
}

var readyCluster = clusterFacts{
	infrastructureReady: true, infrastructureReadyTime: now.Add(-2 * time.Hour),
	controlPlaneInitialized: true, controlPlaneInitTime: now.Add(-2 * time.Hour),
}

func defaultConfig() checkConfig {
	return checkConfig{
		checker:            "ns/hc",
		nodeStartupTimeout: 10 * time.Minute,
		nodeConditions: []caprv1.UnhealthyNodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To[int32](300)},
			{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To[int32](300)},
			{Type: "DiskPressure", Status: corev1.ConditionTrue, TimeoutSeconds: ptr.To[int32](0)},
		},
		machineConditions: []caprv1.UnhealthyMachineCondition{
			{Type: "EtcdMemberHealthy", Status: metav1.ConditionFalse, TimeoutSeconds: ptr.To[int32](60)},
		},
		etcdMemberTimeout: 2 * time.Minute,
	}
}

func TestEvaluate(t *testing.T) {
	ready := nodeCond(corev1.NodeReady, corev1.ConditionTrue, time.Hour)
	tests := []struct {
		name      string
		target    target
		cluster   clusterFacts
		config    func(*checkConfig)
		verdict   verdict
		reason    string
		nextCheck time.Duration
	}{
		{name: "healthy node", target: target{machine: machine(), node: node(ready)}, verdict: verdictHealthy},
		{name: "Ready=False past timeout", target: target{machine: machine(), node: node(nodeCond(corev1.NodeReady, corev1.ConditionFalse, 301*time.Second))},
			verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason},
		{name: "Ready=False exactly at timeout is not yet unhealthy", target: target{machine: machine(), node: node(nodeCond(corev1.NodeReady, corev1.ConditionFalse, 300*time.Second))},
			verdict: verdictPending, nextCheck: time.Second},
		{name: "Ready=Unknown within timeout requeues at expiry", target: target{machine: machine(), node: node(nodeCond(corev1.NodeReady, corev1.ConditionUnknown, 100*time.Second))},
			verdict: verdictPending, nextCheck: 201 * time.Second},
		{name: "zero timeout condition is immediate", target: target{machine: machine(), node: node(ready, nodeCond("DiskPressure", corev1.ConditionTrue, time.Millisecond))},
			verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason},
		{name: "condition with another status is ignored", target: target{machine: machine(), node: node(ready, nodeCond("DiskPressure", corev1.ConditionFalse, time.Hour))},
			verdict: verdictHealthy},
		{name: "node deleted", target: target{machine: machine(), nodeMissing: true}, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckNodeDeletedReason},
		{name: "no node within startup timeout", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Status.NodeRef = clusterv1.MachineNodeReference{}
			m.CreationTimestamp = metav1.NewTime(now.Add(-9 * time.Minute))
		})}, verdict: verdictPending, nextCheck: time.Minute + time.Second},
		{name: "no node past startup timeout", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Status.NodeRef = clusterv1.MachineNodeReference{}
			m.CreationTimestamp = metav1.NewTime(now.Add(-11 * time.Minute))
		})}, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckNodeStartupTimeoutReason},
		{name: "startup timeout counts from the latest of machine and cluster readiness", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Status.NodeRef = clusterv1.MachineNodeReference{}
		})}, cluster: clusterFacts{infrastructureReady: true, infrastructureReadyTime: now.Add(-5 * time.Minute),
			controlPlaneInitialized: true, controlPlaneInitTime: now.Add(-2 * time.Hour)},
			verdict: verdictPending, nextCheck: 5*time.Minute + time.Second},
		{name: "no node with startup check disabled is pending, not healthy", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Status.NodeRef = clusterv1.MachineNodeReference{}
		})}, config: func(c *checkConfig) { c.nodeStartupTimeout = 0 }, verdict: verdictPending},
		{name: "machine condition past timeout", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Status.Conditions = []metav1.Condition{{Type: "EtcdMemberHealthy", Status: metav1.ConditionFalse, LastTransitionTime: metav1.NewTime(now.Add(-2 * time.Minute))}}
		}), node: node(ready)}, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyMachineReason},
		{name: "machine condition within timeout", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Status.Conditions = []metav1.Condition{{Type: "EtcdMemberHealthy", Status: metav1.ConditionFalse, LastTransitionTime: metav1.NewTime(now.Add(-30 * time.Second))}}
		}), node: node(ready)}, verdict: verdictPending, nextCheck: 31 * time.Second},
		{name: "machine and node failures: machine reason wins, messages merged", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Status.Conditions = []metav1.Condition{{Type: "EtcdMemberHealthy", Status: metav1.ConditionFalse, LastTransitionTime: metav1.NewTime(now.Add(-2 * time.Minute))}}
		}), nodeMissing: true}, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyMachineReason},
		{name: "remediate-machine annotation is immediate", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Annotations = map[string]string{clusterv1.RemediateMachineAnnotation: ""}
		}), node: node(ready)}, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckManualRequestReason},
		{name: "hand-written mark is a request", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: `{"reason":"x","checker":"bob"}`}
		}), node: node(ready)}, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckManualRequestReason},
		{name: "hand-written non-JSON mark is a request", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: "broken disk"}
		}), node: node(ready)}, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckManualRequestReason},
		{name: "own mark is not a request: health decides", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: `{"reason":"UnhealthyNode","checker":"ns/hc"}`}
		}), node: node(ready)}, verdict: verdictHealthy},
		{name: "worker before control plane init is not checked", target: target{machine: machine(), nodeMissing: true},
			cluster: clusterFacts{infrastructureReady: true}, verdict: verdictPending},
		{name: "control-plane machine before init is checked", target: target{machine: machine(asControlPlane), nodeMissing: true},
			cluster: clusterFacts{infrastructureReady: true}, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckNodeDeletedReason},
		{name: "infrastructure not ready: not checked", target: target{machine: machine(asControlPlane), nodeMissing: true},
			cluster: clusterFacts{controlPlaneInitialized: true}, verdict: verdictPending},
		{name: "deleting machine with a healthy node is pending", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.DeletionTimestamp = ptr.To(metav1.NewTime(now))
		}), node: node(ready)}, verdict: verdictPending},
		{name: "node deleting past nodeDeletingTimeout", target: target{machine: machine(), node: deletingNode(6*time.Minute, ready)},
			config: func(c *checkConfig) { c.nodeDeletingTimeout = 5 * time.Minute }, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckNodeDeletingReason},
		{name: "node deleting within nodeDeletingTimeout requeues at expiry", target: target{machine: machine(), node: deletingNode(4*time.Minute, ready)},
			config: func(c *checkConfig) { c.nodeDeletingTimeout = 5 * time.Minute }, verdict: verdictPending, nextCheck: time.Minute + time.Second},
		{name: "node deleting with the check disabled", target: target{machine: machine(), node: deletingNode(time.Hour, ready)}, verdict: verdictHealthy},
		{name: "node deleting because its Machine is", target: target{machine: machine(func(m *clusterv1.Machine) {
			m.DeletionTimestamp = ptr.To(metav1.NewTime(now.Add(-time.Hour)))
		}), node: deletingNode(time.Hour, ready)}, config: func(c *checkConfig) { c.nodeDeletingTimeout = 5 * time.Minute }, verdict: verdictPending},
		{name: "etcd member unhealthy past timeout", target: target{machine: machine(asControlPlane), node: node(ready),
			etcd: &etcdMemberFact{problem: "unreachable", since: now.Add(-3 * time.Minute)}}, verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason},
		{name: "etcd member unhealthy within timeout", target: target{machine: machine(asControlPlane), node: node(ready),
			etcd: &etcdMemberFact{problem: "unreachable", since: now.Add(-time.Minute)}}, verdict: verdictPending, nextCheck: time.Minute + time.Second},
		{name: "etcd check ignores workers", target: target{machine: machine(), node: node(ready),
			etcd: &etcdMemberFact{problem: "unreachable", since: now.Add(-time.Hour)}}, verdict: verdictHealthy},
		{name: "etcd check disabled", target: target{machine: machine(asControlPlane), node: node(ready),
			etcd: &etcdMemberFact{problem: "unreachable", since: now.Add(-time.Hour)}}, config: func(c *checkConfig) { c.etcdMemberTimeout = 0 }, verdict: verdictHealthy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			cfg := defaultConfig()
			if tt.config != nil {
				tt.config(&cfg)
			}
			cluster := tt.cluster
			if cluster == (clusterFacts{}) {
				cluster = readyCluster
			}
			ev := evaluate(tt.target, cfg, cluster, now)
			g.Expect(ev.verdict).To(Equal(tt.verdict))
			g.Expect(ev.reason).To(Equal(tt.reason))
			g.Expect(ev.nextCheck).To(Equal(tt.nextCheck))
			if tt.verdict == verdictUnhealthy {
				g.Expect(ev.message).NotTo(BeEmpty())
			}
		})
	}
}

// TestCutForeignMessage: a hand-written mark's message is cut to maxForeignMarkMessage bytes without
// splitting a character, and says how long it was; a short one is kept whole.
func TestCutForeignMessage(t *testing.T) {
	g := NewWithT(t)
	g.Expect(cutForeignMessage("disk is failing")).To(Equal("disk is failing"))
	exact := strings.Repeat("x", maxForeignMarkMessage)
	g.Expect(cutForeignMessage(exact)).To(Equal(exact))
	for _, long := range []string{strings.Repeat("é", 5000), "a" + strings.Repeat("é", 5000), strings.Repeat("😀", 3000)} {
		cut := cutForeignMessage(long)
		g.Expect(len(cut)).To(BeNumerically("<=", maxForeignMarkMessage))
		g.Expect(len(cut)).To(BeNumerically(">", maxForeignMarkMessage-60), "no more is cut than the note needs")
		g.Expect(utf8.ValidString(cut)).To(BeTrue(), "a character was split")
		g.Expect(cut).To(HaveSuffix(fmt.Sprintf("(cut: the annotation's message has %d bytes)", len(long))))
		kept, _, found := strings.Cut(cut, " … (cut:")
		g.Expect(found).To(BeTrue())
		g.Expect(long).To(HavePrefix(kept))
	}
	g.Expect(cutUTF8("héllo", 2)).To(Equal("h"), "é is two bytes: cut before it")
	g.Expect(cutUTF8("", 0)).To(BeEmpty())
}
