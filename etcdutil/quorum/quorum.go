// Package quorum is the quorum math of CAPR: pure functions over member counts, with no etcd client
// (the health checker uses it without importing clientv3). V is the number of voting members, H the
// number of healthy voting members, L the number of learners, q(n) = floor(n/2)+1.
//
// Every safety decision about etcd membership made by CAPR goes through these functions, so the
// invariants are enforced (and table-tested) in this one place.
package quorum

// Counts summarises an etcd cluster for the quorum math.
type Counts struct {
	// Voting is V, the number of voting members (learners excluded).
	Voting int
	// Healthy is H, the number of voting members seen healthy: running and following a leader, an
	// alarmed member included (an etcd alarm stops requests, not its vote; etcdutil.MemberStatus.Up).
	// A member that could not be reached is counted only when etcd itself shows it alive (the leader
	// the others follow, a follower the leader hears from: etcdutil markAlive); otherwise, for every
	// safety check, it counts as unhealthy.
	Healthy int
	// Learners is L, the number of learners (members that do not vote yet).
	Learners int
	// Unreachable is how many voting members could not be asked at all (their kubelet or node may be
	// down while etcd runs), those counted in Healthy included. The others are unknown, not proven
	// dead.
	Unreachable int
	// QuorumProven is true when a linearizable read (a member list without WithSerializable) was
	// answered: etcd serves it only through a leader backed by a quorum, so quorum exists whatever H
	// says.
	QuorumProven bool
	// Serializable is true when no member could serve a linearizable read and the counts come from one
	// member's node-local member list. Such counts are not authoritative: no membership change may be
	// decided on them.
	Serializable bool
}

// Of returns q(n) = floor(n/2)+1, the number of voting members that must agree.
func Of(n int) int {
	return n/2 + 1
}

// Present is true when quorum exists: proven by a linearizable read, or H ≥ q(V) for counts that carry
// no proof (built by hand). Counts from a node-local (serializable) member list never show quorum.
// Without quorum nothing automatic may happen: disaster recovery is a human's job.
func Present(c Counts) bool {
	if c.Voting < 1 || c.Serializable {
		return false
	}
	return c.QuorumProven || c.Healthy >= Of(c.Voting)
}

// Lost is true when the counts show that quorum is gone: not proven by a linearizable read and fewer
// than q(V) voting members healthy. Unlike !Present, it is false for counts whose H is short only
// because members could not be reached while etcd still answers linearizably.
func Lost(c Counts) bool {
	return c.Voting > 0 && !c.QuorumProven && (c.Serializable || c.Healthy < Of(c.Voting))
}

// FailureMargin is how many more healthy voting members may fail before quorum is lost (negative
// when quorum is already lost, or when members are unreachable and cannot be counted on).
func FailureMargin(c Counts) int {
	return c.Healthy - Of(c.Voting)
}

// CanAddMember says whether adding one member is quorum-safe and would be accepted by etcd.
//
// etcd 3.6 (go.etcd.io/etcd/server/v3 etcdserver/server.go, EtcdServer.mayAddMember) refuses every
// add, learners included, unless the leader has been connected for HealthInterval (5s) to a quorum of
// V+1 voting members, itself included and the new member counted as not connected
// (etcdserver/util.go, isConnectedToQuorumAfterAddingNewMemberSince, numConnectedSince over
// RaftCluster.VotingMembers: learners never count). A single-member cluster is the exception: it may
// always grow. A voting add additionally needs q(V+1) started members
// (membership.RaftCluster.IsReadyToAddVotingMember), implied here because a healthy member is started.
// The healthy members stand for the members connected to the leader, so the rule is H ≥ q(V+1) for
// learners and voters alike, except that a learner may join a healthy single-member cluster. CAPR
// keeps H ≥ q(V+1) for a voting add to a single member (etcd allows it, but the cluster then has no
// quorum until the new member starts). A learner is also refused while the cluster has one already:
// etcd allows --max-learners learners, 1 by default (membership.RaftCluster.ValidateConfigurationChange,
// ErrTooManyLearners); CAPR assumes the default.
func CanAddMember(c Counts, asLearner bool) bool {
	if !Present(c) || asLearner && c.Learners >= 1 {
		return false
	}
	if asLearner && c.Voting == 1 {
		return c.Healthy == 1
	}
	return c.Healthy >= Of(c.Voting+1)
}

// Victim describes the member about to be removed.
type Victim struct {
	// Healthy is true when the victim is a healthy voting member.
	Healthy bool
	// Learner is true when the victim is a learner (it does not vote).
	Learner bool
}

// CanRemoveMember says whether removing the victim's member is quorum-safe:
// V' = V-1, H' = H - (victim healthy ? 1 : 0), safe when H' ≥ q(V') and no other learner is pending
// promotion (a promotion during the change could leave the cluster without quorum). The last voting
// member is never removed. Removing a learner never changes the vote, so it is safe whenever quorum
// is present.
func CanRemoveMember(c Counts, v Victim) bool {
	if !Present(c) {
		return false
	}
	if v.Learner {
		return true
	}
	if c.Learners > 0 {
		return false
	}
	after := Counts{Voting: c.Voting - 1, Healthy: c.Healthy}
	if v.Healthy {
		after.Healthy--
	}
	if after.Voting < 1 {
		return false
	}
	return after.Healthy >= Of(after.Voting)
}

// CanTakeDown says whether the victim's member may go down for a while without losing quorum (a
// reboot of its Machine, an escalation step before any membership change): V unchanged, safe when
// quorum is present and the healthy voting members other than the victim are q(V) on their own:
// H - (victim healthy ? 1 : 0) ≥ q(V). A learner victim takes nothing away. Unlike a removal, the
// vote keeps counting the downed member, so a healthy victim of 3 healthy voters may go down (2 of 3)
// but not one of 2 healthy of 3.
//
// An unhealthy victim is not assumed to be dead: a member that cannot be reached through its node
// (kubelet down) may run and vote, and a linearizable read proves quorum with fewer than q(V) healthy
// members only because such members carry it (Counts.QuorumProven). With 3 voters, A healthy, B dead
// and the victim C unreachable but running, A and C are the quorum; C going down leaves A alone. The
// healthy members are the only ones known to vote, so they must make the quorum without the victim.
func CanTakeDown(c Counts, v Victim) bool {
	if !Present(c) {
		return false
	}
	if v.Learner {
		return true
	}
	others := c.Healthy
	if v.Healthy {
		others--
	}
	return others >= Of(c.Voting)
}

// RemovalKeepsMargin says whether removing the victim's member first keeps a failure margin the
// cluster has now: removing a healthy member of 3 healthy voters is quorum-safe (2 of 2) but leaves
// no margin — the next failure loses quorum — where adding the replacement first would have kept
// one. An unhealthy or learner victim never lowers the margin, and a cluster without a margin has
// none to keep. Callers refuse a remove-first order on it unless a person chose that order.
func RemovalKeepsMargin(c Counts, v Victim) bool {
	if !v.Healthy || v.Learner || FailureMargin(c) < 1 {
		return true
	}
	return FailureMargin(Counts{Voting: c.Voting - 1, Healthy: c.Healthy - 1}) >= 1
}

// MaxUnhealthyControlPlane is the quorum-safe number of control-plane Machines that may be unhealthy
// (and so remediated) at once for a control plane of n desired replicas: floor((n-1)/2), i.e. 1 of 3,
// 2 of 5, 3 of 7, 0 of 1.
func MaxUnhealthyControlPlane(n int) int {
	if n < 1 {
		return 0
	}
	return (n - 1) / 2
}

// MaxUnhealthyControlPlaneExternalEtcd is the number of control-plane Machines that may be unhealthy
// at once when etcd runs outside them: n-1, so that one Machine still serves the API a replacement
// joins through (0 of 1).
func MaxUnhealthyControlPlaneExternalEtcd(n int) int {
	return max(n-1, 0)
}

// EffectiveControlPlaneLimit is min(userLimit, floor((n-1)/2)), or min(userLimit, n-1) when etcd is
// external. A negative userLimit means "no user limit".
func EffectiveControlPlaneLimit(userLimit, n int, externalEtcd bool) int {
	limit := MaxUnhealthyControlPlane(n)
	if externalEtcd {
		limit = MaxUnhealthyControlPlaneExternalEtcd(n)
	}
	if userLimit >= 0 && userLimit < limit {
		return userLimit
	}
	return limit
}
