package controlplane

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil/quorum"
)

// A control plane of one Machine with stacked etcd: its etcd has one voting member, the
// victim's. With that member healthy the only safe order is scale-up-first with the replacement
// joining as a learner (etcd always lets a single-member cluster add a learner, quorum.CanAddMember),
// promoted before the victim's member is removed: the healthy voters go 1 → 2 (→ 3 with KCP's surge
// of two) → back to the replicas, never fewer than the one there was. RemoveMemberFirst and DeleteFirst
// would remove the last voter, and a voting join leaves the cluster without quorum until the new
// member starts, so neither is ever chosen. With the member down there is no quorum (quorumWait),
// and the message names the recovery a person runs (quorum.SingleMemberRecovery).

// learnerJoins reads EtcdLearnerJoinsAnnotation on the control-plane object: whether its provider
// joins etcd members as learners, and, when the value is invalid, why it is taken as false (voting
// joins, the stricter model).
func learnerJoins(cp *unstructured.Unstructured) (bool, string) {
	if cp == nil {
		return false, ""
	}
	value, ok := cp.GetAnnotations()[caprv1.EtcdLearnerJoinsAnnotation]
	if !ok {
		return false, ""
	}
	learners, err := caprv1.EtcdLearnerJoinsFromAnnotation(value)
	if err != nil {
		return false, fmt.Sprintf("%s %s: %v; taken as voting joins", cp.GetKind(), cp.GetName(), err)
	}
	return learners, ""
}

// chooseSingleMemberOrder decides for a victim whose member is the cluster's only voting member and
// is healthy (quorum present, no learner pending: chooseSurgeOrder checked both). ok is false when
// the input is not that case.
func chooseSingleMemberOrder(in OrderInput) (d OrderDecision, ok bool) {
	c := in.Counts
	if c.Voting != 1 || in.Victim != VictimHealthy {
		return OrderDecision{}, false
	}
	const only = "etcd has one voting member, the victim's, and it is healthy"
	switch {
	case !in.AddsLearners:
		msg := fmt.Sprintf("cannot proceed safely: %s; the control-plane provider joins new members as voters, and a voting member added to a single-member etcd leaves it without quorum until it starts, while removing the member first would remove the last voter; if the provider joins members as learners (kubeadm ≥ 1.29), set the annotation %s: \"true\" on the control-plane object",
			only, caprv1.EtcdLearnerJoinsAnnotation)
		if in.LearnerJoinsProblem != "" {
			msg += " (" + in.LearnerJoinsProblem + ")"
		}
		return OrderDecision{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, WaitMessage: msg}, true
	case in.ProviderRefusesScaleUpNow != "":
		return OrderDecision{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, WaitMessage: fmt.Sprintf(
			"cannot proceed: %s, so the replacement must join before it is removed, and the control-plane provider would not create one now: %s", only, in.ProviderRefusesScaleUpNow)}, true
	case in.SurgeRefused != "":
		return OrderDecision{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, WaitMessage: fmt.Sprintf(
			"cannot proceed: %s, so the replacement must join before it is removed, and CAPR may not raise the replicas: %s", only, in.SurgeRefused)}, true
	case in.ProviderRefusesScaleDown != "" && in.surgeMachines() > 1:
		return OrderDecision{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, WaitMessage: fmt.Sprintf(
			"cannot proceed: %s, so the replacement must join before it is removed, and the control-plane provider would not scale the surplus Machine of its surge back down afterwards (%s)", only, in.ProviderRefusesScaleDown)}, true
	}
	policy := ""
	if in.Policy == caprv1.ControlPlaneOrderRemoveMemberFirst {
		policy = "; the RemoveMemberFirst policy would remove the last voting member and is not followed"
	}
	return OrderDecision{Order: caprv1.ControlPlaneOrderScaleUpFirst, Reason: fmt.Sprintf(
		"%s: the replacement joins as a learner and votes before the victim's member is removed, so there is never less than one healthy voter (%d/%d healthy)%s",
		only, c.Healthy, c.Voting, policy)}, true
}

// singleMemberRecovery is what a quorum-lost message adds for a cluster of one voting member: the
// recovery a person runs ("" for larger clusters, whose recovery is the runbook's general one).
func singleMemberRecovery(c quorum.Counts) string {
	if c.Voting != 1 {
		return ""
	}
	return "; " + quorum.SingleMemberRecovery
}
