package etcdutil

import "github.com/capr-io/capr/etcdutil/quorum"

// The quorum math lives in package etcdutil/quorum, which does not import the etcd client. These
// names forward to it so that code holding a State keeps one import.

// Counts summarises an etcd cluster for the quorum math (quorum.Counts).
type Counts = quorum.Counts

// Victim describes the member about to be removed (quorum.Victim).
type Victim = quorum.Victim

// Quorum returns q(n) = floor(n/2)+1 (quorum.Of).
func Quorum(n int) int { return quorum.Of(n) }

// QuorumPresent says whether quorum exists (quorum.Present).
func QuorumPresent(c Counts) bool { return quorum.Present(c) }

// CanAddMember says whether adding one member is quorum-safe and accepted by etcd (quorum.CanAddMember).
func CanAddMember(c Counts, asLearner bool) bool { return quorum.CanAddMember(c, asLearner) }

// CanRemoveMember says whether removing the victim's member is quorum-safe (quorum.CanRemoveMember).
func CanRemoveMember(c Counts, v Victim) bool { return quorum.CanRemoveMember(c, v) }

// CanTakeDown says whether the victim's member may go down for a while without losing quorum (quorum.CanTakeDown).
func CanTakeDown(c Counts, v Victim) bool { return quorum.CanTakeDown(c, v) }
