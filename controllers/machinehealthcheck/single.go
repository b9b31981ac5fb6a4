package machinehealthcheck

import (
	"fmt"
	"strings"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil/quorum"
)

// A control plane of one desired Machine with stacked etcd:
// floor((N-1)/2) allows no remediation for N = 1, whatever the member's health, and the cluster stays
// stuck until a person acts, as with KCP (CAPI #4554). When the one member is healthy (the kubelet,
// the container runtime or the node agent is what broke), the remediator can replace the Machine
// scale-up-first with the replacement joining as a learner (etcdutil/quorum single.go), so the health
// checker allows that one remediation; when it is down or cannot be reached, etcd has no quorum and it
// says so (quorumLostDecision) with the recovery a person must run.

// etcdLimit applies what etcd says to the control-plane decision cp: no remediation while quorum is
// lost; for a control plane of one, the limit that depends on its member.
func etcdLimit(cp limitDecision, q etcdQuorum) limitDecision {
	if q.lost() {
		return quorumLostDecision(cp, q)
	}
	if cp.single {
		return singleControlPlaneDecision(cp, q)
	}
	return cp
}

// singleControlPlaneDecision is the control-plane limit for one desired replica with stacked etcd:
// one remediation when every voting member is up (quorum.EffectiveSingleControlPlaneLimit), none
// otherwise, saying why. cp is controlPlaneDecision's (single set).
func singleControlPlaneDecision(cp limitDecision, q etcdQuorum) limitDecision {
	limit := quorum.EffectiveSingleControlPlaneLimit(cp.userLimit, q.counts, q.known)
	if q.readErr != nil {
		// No member answered, and there is only one: etcd has no quorum CAPR can see, whether the
		// member is down or cannot be reached. Said even while no Machine is marked: a dead member
		// cannot be observed, so the etcd member check never marks its Machine.
		return limitDecision{limit: 0, reason: caprv1.MachineHealthCheckEtcdQuorumLostReason, message: fmt.Sprintf(
			"Remediation of the only control-plane Machine is not allowed: its etcd could not be read (%v), so its one voting member is down or cannot be reached and etcd has no quorum CAPR can see; %s",
			q.readErr, quorum.SingleMemberRecovery)}
	}
	if cp.unhealthy <= limit {
		return limitDecision{allowed: true, remaining: limit - cp.unhealthy, limit: limit}
	}
	d := limitDecision{limit: limit, reason: caprv1.MachineHealthCheckControlPlaneQuorumLimitReason}
	switch {
	case cp.userLimit == 0:
		d.message = "Remediation of control-plane Machines is not allowed: the control plane has one desired Machine and triggerIf allows no unhealthy Machine"
	case !q.known:
		d.message = "Remediation of the only control-plane Machine is not allowed: it is replaced only while its etcd member is seen healthy, and etcd was not read " +
			"(set spec.checks.etcdMember, and check that etcd can be reached)"
	case len(q.dead) > 0:
		d.message = fmt.Sprintf("Remediation of the only control-plane Machine is not allowed: voting etcd members are not up (by Node): %s; it is replaced only while every voting member is up",
			strings.Join(q.dead, ", "))
	default:
		d.message = fmt.Sprintf("Remediation of control-plane Machines is not allowed, %d of 1 desired control-plane Machines are not started or unhealthy", cp.unhealthy)
	}
	return d
}
