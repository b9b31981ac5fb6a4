package machinehealthcheck

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

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

func TestApplyMark(t *testing.T) {
	g := NewWithT(t)
	unhealthy := evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckUnhealthyNodeReason, message: "Ready=False"}
	m := machine()
	mark := func() *metav1.Condition { return conditions.Get(m, caprv1.MachineCAPRHealthCheckSucceededCondition) }

	g.Expect(applyMark(m, unhealthy, "ns/hc")).To(Equal(markSet))
	g.Expect(mark()).To(HaveField("Status", metav1.ConditionFalse))
	g.Expect(mark().Reason).To(Equal(unhealthy.reason))
	g.Expect(caprv1.MarkEntriesFromMessage(mark().Message)).To(Equal(caprv1.MarkEntries{{Checker: "ns/hc", Reason: unhealthy.reason, Message: unhealthy.message}}))
	g.Expect(m.Annotations).NotTo(HaveKey(caprv1.UnhealthyAnnotation), "the mark is the condition alone: one write")
	since := metav1.NewTime(now.Add(-time.Hour))
	mark().LastTransitionTime = since
	// Same verdict later: nothing to write.
	g.Expect(applyMark(m, unhealthy, "ns/hc")).To(Equal(markUnchanged))
	// New reason: updated, since (the condition's lastTransitionTime) kept.
	g.Expect(applyMark(m, evaluation{verdict: verdictUnhealthy, reason: caprv1.MachineCAPRHealthCheckNodeDeletedReason, message: "gone"}, "ns/hc")).To(Equal(markUpdated))
	g.Expect(mark().Reason).To(Equal(caprv1.MachineCAPRHealthCheckNodeDeletedReason))
	g.Expect(mark().LastTransitionTime.Time).To(BeTemporally("==", since.Time))
	// Pending leaves the mark alone.
	g.Expect(applyMark(m, evaluation{verdict: verdictPending}, "ns/hc")).To(Equal(markUnchanged))
	// Healthy clears it.
	g.Expect(applyMark(m, evaluation{verdict: verdictHealthy}, "ns/hc")).To(Equal(markCleared))
	g.Expect(mark()).To(HaveField("Status", metav1.ConditionTrue))
	g.Expect(applyMark(m, evaluation{verdict: verdictHealthy}, "ns/hc")).To(Equal(markUnchanged))

	// Someone else's annotation is never rewritten nor cleared.
	foreign := machine(func(m *clusterv1.Machine) {
		m.Annotations = map[string]string{caprv1.UnhealthyAnnotation: `{"reason":"ManualRequest","checker":"alice"}`}
	})
	g.Expect(applyMark(foreign, unhealthy, "ns/hc")).Error().NotTo(HaveOccurred())
	g.Expect(applyMark(foreign, evaluation{verdict: verdictHealthy}, "ns/hc")).Error().NotTo(HaveOccurred())
	g.Expect(foreign.Annotations[caprv1.UnhealthyAnnotation]).To(Equal(`{"reason":"ManualRequest","checker":"alice"}`))
}

func TestTriggerIfDecision(t *testing.T) {
	pct := func(s string) *caprv1.MachineHealthCheckRemediationTriggerIf {
		v := intOrString(s)
		return &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: &v}
	}
	rng := func(s string) *caprv1.MachineHealthCheckRemediationTriggerIf {
		return &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyInRange: s}
	}
	tests := []struct {
		name                string
		trigger             *caprv1.MachineHealthCheckRemediationTriggerIf
		expected, unhealthy int
		allowed             bool
		remaining           int
		wantErr             bool
	}{
		{"unset means 100%", nil, 5, 5, true, 0, false},
		{"int limit ok", pct("2"), 5, 2, true, 0, false},
		{"int limit exceeded", pct("2"), 5, 3, false, 0, false},
		{"percent rounds down: 40% of 3 is 1", pct("40%"), 3, 1, true, 0, false},
		{"percent rounds down: 40% of 3 refuses 2", pct("40%"), 3, 2, false, 0, false},
		{"percent 50% of 10", pct("50%"), 10, 3, true, 2, false},
		{"zero allows none", pct("0"), 3, 1, false, 0, false},
		{"zero with nothing unhealthy", pct("0"), 3, 0, true, 0, false},
		{"range inside", rng("[1-3]"), 10, 2, true, 1, false},
		{"range below", rng("[1-3]"), 10, 0, false, 0, false},
		{"range above", rng("[1-3]"), 10, 4, false, 0, false},
		{"range edges", rng("[2-2]"), 10, 2, true, 0, false},
		{"range wins over limit", &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyInRange: "[0-5]", UnhealthyLessThanOrEqualTo: ptr.To(intOrString("1"))}, 10, 4, true, 1, false},
		{"range max below min is an error", rng("[3-1]"), 10, 2, false, 0, true},
		{"malformed range is an error", rng("1-3"), 10, 2, false, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			d, err := triggerIfDecision(tt.trigger, tt.expected, tt.unhealthy)
			if tt.wantErr {
				g.Expect(err).To(HaveOccurred())
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(d.allowed).To(Equal(tt.allowed))
			g.Expect(d.remaining).To(Equal(tt.remaining))
			if !d.allowed {
				g.Expect(d.message).To(ContainSubstring("Remediation is not allowed"))
			}
		})
	}
}

func TestControlPlaneDecision(t *testing.T) {
	stacked, external := caprv1.EtcdPlacementStacked, caprv1.EtcdPlacementExternal
	tests := []struct {
		replicas, userLimit, unhealthy int
		placement                      caprv1.EtcdPlacement
		allowed                        bool
		limit                          int
	}{
		{1, -1, 0, stacked, true, 0}, {1, -1, 1, stacked, false, 0},
		{3, -1, 1, stacked, true, 1}, {3, -1, 2, stacked, false, 1},
		{5, -1, 2, stacked, true, 2}, {5, -1, 3, stacked, false, 2}, {5, 1, 2, stacked, false, 1},
		{7, -1, 3, stacked, true, 3}, {7, -1, 4, stacked, false, 3}, {7, 10, 3, stacked, true, 3},
		// External etcd: all but one Machine may be unhealthy.
		{1, -1, 1, external, false, 0},
		{3, -1, 2, external, true, 2}, {3, -1, 3, external, false, 2}, {3, 1, 2, external, false, 1},
		{2, -1, 1, external, true, 1},
	}
	for _, tt := range tests {
		g := NewWithT(t)
		d := controlPlaneDecision(tt.userLimit, tt.replicas, tt.unhealthy, tt.placement)
		g.Expect(d.allowed).To(Equal(tt.allowed), "%+v", tt)
		g.Expect(d.limit).To(Equal(tt.limit), "%+v", tt)
	}
}

func intOrString(s string) intstr.IntOrString { return intstr.Parse(s) }
