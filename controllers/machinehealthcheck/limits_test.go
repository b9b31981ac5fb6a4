package machinehealthcheck

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

func TestQuorumOf(t *testing.T) {
	healthy := EtcdMemberHealth{Healthy: true}
	dead := EtcdMemberHealth{Problem: "unreachable"}
	leaderless := EtcdMemberHealth{Problem: etcdProblemNoLeader}
	learner := EtcdMemberHealth{Problem: "a learner", Learner: true}
	alarmed := EtcdMemberHealth{Problem: "alarmed (NOSPACE)", Votes: true}
	alarmedNoLeader := EtcdMemberHealth{Problem: "alarmed (NOSPACE)"}
	tests := []struct {
		name   string
		health map[string]EtcdMemberHealth
		lost   bool
		dead   []string
	}{
		{name: "all healthy", health: map[string]EtcdMemberHealth{"a": healthy, "b": healthy, "c": healthy}},
		{name: "one of three dead keeps quorum", health: map[string]EtcdMemberHealth{"a": healthy, "b": healthy, "c": dead}, dead: []string{"c"}},
		{name: "two of three dead, survivor without leader", lost: true,
			health: map[string]EtcdMemberHealth{"a": leaderless, "b": dead, "c": dead}, dead: []string{"b", "c"}},
		{name: "a learner does not vote", health: map[string]EtcdMemberHealth{"a": healthy, "b": healthy, "c": dead, "d": learner}, dead: []string{"c"}},
		// Counted as a dead voter, an unreachable learner made 2 of 4 up: quorum lost, the
		// reading of a replacement's join on kind.
		{name: "an unreachable learner does not vote either", health: map[string]EtcdMemberHealth{"a": healthy, "b": healthy, "c": dead,
			"d": {Problem: "unreachable", Learner: true}}, dead: []string{"c"}},
		{name: "two of five dead keeps quorum", health: map[string]EtcdMemberHealth{"a": healthy, "b": healthy, "c": healthy, "d": dead, "e": dead},
			dead: []string{"d", "e"}},
		{name: "no members: not known to be lost", health: map[string]EtcdMemberHealth{}},
		{name: "an election: every member up without a leader", health: map[string]EtcdMemberHealth{"a": leaderless, "b": leaderless, "c": leaderless}},
		// An alarm stops requests, not raft: the alarmed member and one healthy member are a quorum.
		{name: "an alarmed member that follows a leader votes", health: map[string]EtcdMemberHealth{"a": healthy, "b": alarmed, "c": dead}, dead: []string{"c"}},
		{name: "an alarmed member without a leader is not up", lost: true,
			health: map[string]EtcdMemberHealth{"a": healthy, "b": alarmedNoLeader, "c": dead}, dead: []string{"b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			q := quorumOf(tt.health)
			g.Expect(q.lost()).To(Equal(tt.lost))
			g.Expect(q.dead).To(Equal(tt.dead))
		})
	}
	NewWithT(t).Expect(etcdQuorum{}.lost()).To(BeFalse(), "etcd not read: quorum unknown, not lost")
}

func TestExcuseLeaderless(t *testing.T) {
	g := NewWithT(t)
	targets := []target{
		{machine: machine(asControlPlane), etcd: &etcdMemberFact{problem: etcdProblemNoLeader}},
		{machine: machine(asControlPlane), etcd: &etcdMemberFact{problem: "unreachable"}},
		{machine: machine(asControlPlane), etcd: &etcdMemberFact{healthy: true}},
	}
	excuseLeaderless(targets)
	g.Expect(targets[0].etcd).To(BeNil())
	g.Expect(targets[1].etcd).NotTo(BeNil())
	g.Expect(targets[2].etcd).NotTo(BeNil())
}

func TestLimitsRemaining(t *testing.T) {
	g := NewWithT(t)
	noControlPlane := limitDecision{allowed: true, limit: -1}
	g.Expect(limits{trigger: limitDecision{allowed: true, remaining: 2, limit: 3}, controlPlane: noControlPlane}.remaining()).To(Equal(2))
	// 1 of 3 control-plane Machines unhealthy: triggerIf leaves 2, the quorum-safe limit 0.
	g.Expect(limits{trigger: limitDecision{allowed: true, remaining: 2, limit: 3},
		controlPlane: controlPlaneDecision(3, 3, 1, caprv1.EtcdPlacementStacked)}.remaining()).To(Equal(0))
	// Refused by the control-plane limit: nothing more may be remediated, whatever triggerIf leaves.
	refused := limits{trigger: limitDecision{allowed: true, remaining: 3, limit: 3}, controlPlane: controlPlaneDecision(3, 3, 2, caprv1.EtcdPlacementStacked)}
	g.Expect(refused.remaining()).To(Equal(0))
	g.Expect(refused.refusal().reason).To(Equal(caprv1.MachineHealthCheckControlPlaneQuorumLimitReason))
}

func TestSurgeStarting(t *testing.T) {
	tests := []struct {
		name                    string
		size, desired, starting int
		want                    int
	}{
		{name: "no surge: a starting Machine counts", size: 3, desired: 3, starting: 1, want: 0},
		{name: "surge of one, starting", size: 4, desired: 3, starting: 1, want: 1},
		{name: "surge of one, two starting: one still counts", size: 4, desired: 3, starting: 2, want: 1},
		{name: "surge of two (KCP, stacked etcd), both starting", size: 5, desired: 3, starting: 2, want: 2},
		{name: "surge already started: nothing excused", size: 4, desired: 3, starting: 0, want: 0},
		{name: "replicas below desired (scaled back first)", size: 2, desired: 3, starting: 1, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(surgeStarting(tt.size, tt.desired, tt.starting)).To(Equal(tt.want))
		})
	}
}

// TestControlPlaneLimitExcusesTheStartingReplacement: a remediation holding the control plane with
// KCP and stacked etcd returns the replicas from 5 to 3 as soon as its one replacement exists
// (remediation/controlplane firstreplacement.go): 4 Machines, the victim and the replacement
// without a Node not healthy. The replacement is extra to N and not counted, as during the surge.
func TestControlPlaneLimitExcusesTheStartingReplacement(t *testing.T) {
	g := NewWithT(t)
	lock, err := (&caprv1.ControlPlaneLock{MachineRemediation: "m-b", DesiredReplicas: 3}).Marshal()
	g.Expect(err).NotTo(HaveOccurred())
	cp := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
		"metadata": map[string]interface{}{"name": "kcp", "annotations": map[string]interface{}{caprv1.ControlPlaneLockAnnotation: lock}},
		"spec":     map[string]interface{}{"replicas": int64(3)},
	}}
	d := controlPlaneLimit(cp, nil, -1, 4, 2, 1)
	g.Expect(d.allowed).To(BeTrue(), d.message)
	g.Expect(controlPlaneLimit(cp, nil, -1, 4, 3, 1).allowed).To(BeFalse(), "a second Machine that is not healthy for another reason still counts")
}

func TestStormCooldown(t *testing.T) {
	now := time.Date(2026, 11, 23, 6, 0, 0, 0, time.UTC)
	cooldown := time.Minute
	allowed := limitDecision{allowed: true, remaining: 1, limit: 1}
	storm := limitDecision{limit: 1, storm: true, reason: caprv1.MachineHealthCheckTooManyUnhealthyReason, message: "too many"}
	tooFew := limitDecision{limit: 3, reason: caprv1.MachineHealthCheckTooManyUnhealthyReason, message: "not within the range"}
	cond := func(status metav1.ConditionStatus, reason string, since time.Time) *metav1.Condition {
		return &metav1.Condition{Type: caprv1.MachineHealthCheckStormCooldownCondition, Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(since)}
	}
	tests := []struct {
		name        string
		prev        *metav1.Condition
		trigger     limitDecision
		wantStatus  metav1.ConditionStatus
		wantReason  string
		wantSince   time.Time // checked when the condition is True
		wantAllowed bool
		wantEnds    time.Duration
	}{
		{name: "no storm ever", trigger: allowed, wantStatus: metav1.ConditionFalse, wantReason: caprv1.MachineHealthCheckNoStormReason, wantAllowed: true},
		{name: "a storm starts", prev: cond(metav1.ConditionFalse, caprv1.MachineHealthCheckNoStormReason, now.Add(-time.Hour)), trigger: storm,
			wantStatus: metav1.ConditionFalse, wantReason: caprv1.MachineHealthCheckStormActiveReason},
		{name: "the storm ends: the cooldown starts now", prev: cond(metav1.ConditionFalse, caprv1.MachineHealthCheckStormActiveReason, now.Add(-time.Hour)), trigger: allowed,
			wantStatus: metav1.ConditionTrue, wantReason: caprv1.MachineHealthCheckStormCooldownReason, wantSince: now, wantEnds: cooldown},
		{name: "cooling down, half-way", prev: cond(metav1.ConditionTrue, caprv1.MachineHealthCheckStormCooldownReason, now.Add(-30*time.Second)), trigger: allowed,
			wantStatus: metav1.ConditionTrue, wantReason: caprv1.MachineHealthCheckStormCooldownReason, wantSince: now.Add(-30 * time.Second), wantEnds: 30 * time.Second},
		{name: "cooldown over", prev: cond(metav1.ConditionTrue, caprv1.MachineHealthCheckStormCooldownReason, now.Add(-cooldown)), trigger: allowed,
			wantStatus: metav1.ConditionFalse, wantReason: caprv1.MachineHealthCheckNoStormReason, wantAllowed: true},
		{name: "a new storm during the cooldown", prev: cond(metav1.ConditionTrue, caprv1.MachineHealthCheckStormCooldownReason, now.Add(-10*time.Second)), trigger: storm,
			wantStatus: metav1.ConditionFalse, wantReason: caprv1.MachineHealthCheckStormActiveReason},
		{name: "too few unhealthy for unhealthyInRange is no storm", prev: cond(metav1.ConditionFalse, caprv1.MachineHealthCheckNoStormReason, now), trigger: tooFew,
			wantStatus: metav1.ConditionFalse, wantReason: caprv1.MachineHealthCheckNoStormReason},
		{name: "cooling down while triggerIf refuses anyway keeps triggerIf's reason", prev: cond(metav1.ConditionTrue, caprv1.MachineHealthCheckStormCooldownReason, now.Add(-time.Second)),
			trigger: tooFew, wantStatus: metav1.ConditionTrue, wantReason: caprv1.MachineHealthCheckStormCooldownReason, wantSince: now.Add(-time.Second), wantEnds: cooldown - time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			c, d, ends := stormCooldown(tt.prev, cooldown, tt.trigger, now.Add(300*time.Millisecond))
			g.Expect(c.Type).To(Equal(caprv1.MachineHealthCheckStormCooldownCondition))
			g.Expect(c.Status).To(Equal(tt.wantStatus))
			g.Expect(c.Reason).To(Equal(tt.wantReason))
			g.Expect(d.allowed).To(Equal(tt.wantAllowed))
			g.Expect(ends).To(Equal(tt.wantEnds))
			if tt.wantStatus == metav1.ConditionTrue {
				g.Expect(c.LastTransitionTime.Time).To(BeTemporally("==", tt.wantSince))
				g.Expect(c.Message).To(ContainSubstring("no new remediation until " + tt.wantSince.Add(cooldown).Format(time.RFC3339)))
			}
			switch {
			case tt.trigger.allowed && !tt.wantAllowed:
				g.Expect(d.reason).To(Equal(caprv1.MachineHealthCheckStormCooldownReason))
			case !tt.trigger.allowed:
				g.Expect(d).To(Equal(tt.trigger), "triggerIf's own refusal is kept")
			}
		})
	}
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
