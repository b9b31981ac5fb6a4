package etcdutil

// The quorum math of design §5, as plain functions over counts. V is the number of voting members,
// H the number of healthy voting members, L the number of learners, q(n) = floor(n/2)+1.
//
// Every safety decision about etcd membership made by CAPR goes through these functions, so the
// invariants are enforced (and table-tested) in this one place.

// Counts summarises an etcd cluster for the quorum math.
type Counts struct {
	// Voting is V, the number of voting members (learners excluded).
	Voting int
	// Healthy is H, the number of healthy voting members.
	Healthy int
	// Learners is L, the number of learners (members that do not vote yet).
	Learners int
}

// Quorum returns q(n) = floor(n/2)+1, the number of voting members that must agree.
func Quorum(n int) int {
	return n/2 + 1
}

// QuorumPresent is true when H ≥ q(V). Without quorum nothing automatic may happen: disaster
// recovery is a human's job.
func QuorumPresent(c Counts) bool {
	return c.Voting > 0 && c.Healthy >= Quorum(c.Voting)
}

// FailureMargin is how many more healthy voting members may fail before quorum is lost (negative
// when quorum is already lost).
func FailureMargin(c Counts) int {
	return c.Healthy - Quorum(c.Voting)
}

// CanAddMember says whether scaling up by one member is quorum-safe. A member that joins as a learner
// does not vote, so it is safe whenever quorum is present. A member that joins as a voting member
// counts as unhealthy until it is seen healthy, so it needs H ≥ q(V+1).
func CanAddMember(c Counts, asLearner bool) bool {
	if !QuorumPresent(c) {
		return false
	}
	if asLearner {
		return true
	}
	return c.Healthy >= Quorum(c.Voting+1)
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
	if !QuorumPresent(c) {
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
	return after.Healthy >= Quorum(after.Voting)
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

// EffectiveControlPlaneLimit is min(userLimit, floor((n-1)/2)). A negative userLimit means "no user
// limit".
func EffectiveControlPlaneLimit(userLimit, n int) int {
	limit := MaxUnhealthyControlPlane(n)
	if userLimit >= 0 && userLimit < limit {
		return userLimit
	}
	return limit
}
