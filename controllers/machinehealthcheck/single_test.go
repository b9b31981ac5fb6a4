package machinehealthcheck

import (
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestSingleControlPlaneLimit: a control plane of one desired Machine (stacked etcd) may have that
// Machine remediated when its etcd member is up (the remediator replaces it scale-up-first, the
// replacement joining as a learner), and not when the member is down or cannot be reached: then etcd
// has lost quorum, and the condition names the recovery a person runs. Before the single-control-plane
// rule, floor((1-1)/2) = 0 refused the first case too.
func TestSingleControlPlaneLimit(t *testing.T) {
	cp := func(replicas int64, external bool) *unstructured.Unstructured {
		obj := &unstructured.Unstructured{Object: map[string]interface{}{
			"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
			"metadata": map[string]interface{}{"name": "kcp"}, "spec": map[string]interface{}{"replicas": replicas},
		}}
		if external {
			_ = unstructured.SetNestedMap(obj.Object, map[string]interface{}{"endpoints": []interface{}{"https://etcd:2379"}},
				"spec", "kubeadmConfigSpec", "clusterConfiguration", "etcd", "external")
		}
		return obj
	}
	healthy := EtcdMemberHealth{Healthy: true}
	unreachable := EtcdMemberHealth{Problem: "unreachable"}
	tests := []struct {
		name string
		cp   *unstructured.Unstructured
		// unhealthy of the control-plane targets (all of them, no workers)
		targets, unhealthy int
		health             map[string]EtcdMemberHealth // nil: etcd not read
		readErr            error                       // etcd tried and not read
		triggerIf          *caprv1.MachineHealthCheckRemediationTriggerIf
		allowed            bool
		remaining          int
		reason             string
		says               []string
	}{
		{name: "member healthy, kubelet dead: the one remediation is allowed", cp: cp(1, false), targets: 1, unhealthy: 1,
			health: map[string]EtcdMemberHealth{"n1": healthy}, allowed: true, remaining: 0},
		{name: "member healthy, nothing unhealthy: one more may become unhealthy", cp: cp(1, false), targets: 1,
			health: map[string]EtcdMemberHealth{"n1": healthy}, allowed: true, remaining: 1},
		{name: "member unreachable: quorum lost, recovery named", cp: cp(1, false), targets: 1, unhealthy: 1,
			health: map[string]EtcdMemberHealth{"n1": unreachable}, reason: caprv1.MachineHealthCheckEtcdQuorumLostReason,
			says: []string{"0 of 1 voting members are up", "n1", "etcdutl snapshot restore", "runbook.md#single-member-etcd-recovery"}},
		{name: "member alarmed without a leader: quorum lost", cp: cp(1, false), targets: 1, unhealthy: 1,
			health: map[string]EtcdMemberHealth{"n1": {Problem: "alarmed (NOSPACE)"}}, reason: caprv1.MachineHealthCheckEtcdQuorumLostReason,
			says: []string{"single voting member"}},
		{name: "member alarmed but voting: it is up, the one remediation is allowed", cp: cp(1, false), targets: 1, unhealthy: 1,
			health: map[string]EtcdMemberHealth{"n1": {Problem: "alarmed (NOSPACE)", Votes: true}}, allowed: true, remaining: 0},
		{name: "etcd not read: refused, says the etcd member check is needed", cp: cp(1, false), targets: 1, unhealthy: 1,
			reason: caprv1.MachineHealthCheckControlPlaneQuorumLimitReason, says: []string{"spec.checks.etcdMember"}},
		{name: "etcd tried and no member answered: quorum lost, said even with nothing marked", cp: cp(1, false), targets: 1,
			readErr: errors.New("no etcd member could be reached"), reason: caprv1.MachineHealthCheckEtcdQuorumLostReason,
			says: []string{"no etcd member could be reached", "etcdutl snapshot restore"}},
		{name: "triggerIf allows none", cp: cp(1, false), targets: 1, unhealthy: 1, health: map[string]EtcdMemberHealth{"n1": healthy},
			triggerIf: &caprv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromInt32(0))},
			reason:    caprv1.MachineHealthCheckTooManyUnhealthyReason},
		// During the remediation the lock holds N = 1 while replicas are 3 (limits file,
		// controlPlaneLimit): the promoted replacements are voters too.
		{name: "mid-surge, three voters up: still allowed", cp: cp(1, false), targets: 1, unhealthy: 1,
			health: map[string]EtcdMemberHealth{"n1": healthy, "r1": healthy, "r2": healthy}, allowed: true},
		{name: "mid-surge, a replacement's member down: refused, named", cp: cp(1, false), targets: 1, unhealthy: 1,
			health: map[string]EtcdMemberHealth{"n1": healthy, "r1": healthy, "r2": unreachable},
			reason: caprv1.MachineHealthCheckControlPlaneQuorumLimitReason, says: []string{"r2"}},
		{name: "a learner joining does not vote: allowed", cp: cp(1, false), targets: 1, unhealthy: 1,
			health: map[string]EtcdMemberHealth{"n1": healthy, "r1": {Problem: "a learner", Learner: true}}, allowed: true},
		{name: "external etcd, one Machine: unchanged, none may be remediated", cp: cp(1, true), targets: 1, unhealthy: 1,
			reason: caprv1.MachineHealthCheckControlPlaneQuorumLimitReason},
		{name: "three Machines: unchanged, one of three", cp: cp(3, false), targets: 3, unhealthy: 1,
			health: map[string]EtcdMemberHealth{"n1": healthy, "n2": healthy, "n3": healthy}, allowed: true, remaining: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			mhc := &caprv1.MachineHealthCheck{}
			mhc.Spec.Remediation.TriggerIf = tt.triggerIf
			rd := &round{total: tt.targets, healthy: tt.targets - tt.unhealthy, cpTargets: tt.targets, cpNotHealthy: tt.unhealthy}
			q := etcdQuorum{readErr: tt.readErr}
			if tt.health != nil {
				q = quorumOf(tt.health)
			}
			lim, err := (&Reconciler{}).decideLimits(mhc, rd, q, tt.cp, nil, time.Now())
			g.Expect(err).NotTo(HaveOccurred())
			refusal := lim.refusal()
			if tt.allowed {
				g.Expect(refusal).To(BeNil(), "%+v", refusal)
				g.Expect(lim.remaining()).To(Equal(tt.remaining))
				return
			}
			g.Expect(refusal).NotTo(BeNil())
			g.Expect(refusal.reason).To(Equal(tt.reason), refusal.message)
			for _, s := range tt.says {
				g.Expect(refusal.message).To(ContainSubstring(s))
			}
		})
	}
}
