package quorum

// A control plane of one desired Machine has one voting member: floor((n-1)/2) = 0 allows no
// remediation, and KCP refuses to remediate it (CAPI #4554). One order is still safe when the member
// itself is healthy (only the kubelet, the container runtime or the node agent is broken): a
// replacement joins as a learner, which etcd always lets a single-member cluster add
// (etcdserver/server.go mayAddMember, CanAddMember), is promoted, and only then is the old member
// removed, so the cluster never has fewer healthy voters than the one it had. With the member down
// there is no quorum and nothing is safe: a person restores etcd.

// SingleMemberRecovery names what a person runs when the only voting member of a cluster is down or
// cannot be reached. Messages of the health checker and the remediator end with it.
const SingleMemberRecovery = "with a single voting member there is no other member to take over, so nothing is done automatically: " +
	"a person must bring the member back; first check the node's kubelet, through which CAPR reaches etcd: if the workload cluster's API server " +
	"still answers, the member runs and only its kubelet is down, so start the kubelet and restore nothing; otherwise restart etcd on its Machine " +
	"if its data directory is intact, or restore etcd from a snapshot " +
	"(etcdutl snapshot restore, then start the one member from the restored data directory); see docs/operations/runbook.md#single-member-etcd-recovery"

// SingleMemberReplaceable says whether the Machine of a control plane of one may be replaced:
// quorum is present, no voting member is down (V = H: the victim's member is one of them, and during
// the remediation the replacements that already vote are the others), and at least one votes.
// Learners do not count; a pending one is the replacement joining.
func SingleMemberReplaceable(c Counts) bool {
	return Present(c) && c.Voting >= 1 && c.Healthy == c.Voting
}

// EffectiveSingleControlPlaneLimit is EffectiveControlPlaneLimit for one desired replica with
// stacked etcd, given the etcd counts (known false when etcd was not read): one Machine may be
// remediated when SingleMemberReplaceable, none otherwise; a user limit of 0 still allows none.
func EffectiveSingleControlPlaneLimit(userLimit int, c Counts, known bool) int {
	if userLimit == 0 || !known || !SingleMemberReplaceable(c) {
		return 0
	}
	return 1
}
