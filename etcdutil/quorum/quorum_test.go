package quorum

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
)

// majority is an oracle independent of Of's formula: a group of healthy voters keeps quorum
// when it is a strict majority of the voters.
func majority(healthy, voting int) bool { return voting > 0 && 2*healthy > voting }

func TestQuorum(t *testing.T) {
	g := NewWithT(t)
	for n, want := range map[int]int{1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 4} {
		g.Expect(Of(n)).To(Equal(want), "q(%d)", n)
	}
}

func TestQuorumPresentEveryCombination(t *testing.T) {
	for v := 0; v <= 7; v++ {
		for h := 0; h <= v; h++ {
			for l := 0; l <= 2; l++ {
				c := Counts{Voting: v, Healthy: h, Learners: l}
				t.Run(fmt.Sprintf("V%d_H%d_L%d", v, h, l), func(t *testing.T) {
					NewWithT(t).Expect(Present(c)).To(Equal(majority(h, v)))
				})
			}
		}
	}
}

// etcdAcceptsAdd is etcd 3.6's own add rule, written from its source rather than from CanAddMember:
// EtcdServer.mayAddMember (etcdserver/server.go) counts the voting members the leader is connected
// to, itself included (numConnectedSince over RaftCluster.VotingMembers, learners never count), and
// needs a quorum of the cluster with the new member in it (isConnectedToQuorumAfterAddingNewMemberSince),
// except for a single-member cluster. A voting add also needs that many started members
// (RaftCluster.IsReadyToAddVotingMember). The healthy voting members stand for the connected ones.
// A learner is refused once the cluster has --max-learners (default 1) learners
// (membership.RaftCluster.ValidateConfigurationChange, ErrTooManyLearners).
func etcdAcceptsAdd(healthyVoters, voters, learners int, learner bool) bool {
	connected := healthyVoters
	started := healthyVoters
	if learner && learners >= 1 {
		return false
	}
	if voters == 1 {
		return true // both checks let a single-member cluster grow
	}
	if !learner && !majority(started, voters+1) {
		return false
	}
	return majority(connected, voters+1)
}

func TestCanAddMemberEveryCombination(t *testing.T) {
	for v := 1; v <= 7; v++ {
		for h := 0; h <= v; h++ {
			for l := 0; l <= 2; l++ {
				for _, learner := range []bool{true, false} {
					c := Counts{Voting: v, Healthy: h, Learners: l}
					t.Run(fmt.Sprintf("V%d_H%d_L%d_learner%t", v, h, l, learner), func(t *testing.T) {
						// Quorum must be there, and etcd must accept the add.
						want := majority(h, v) && etcdAcceptsAdd(h, v, l, learner)
						if !learner {
							// The new voter is unhealthy until seen healthy: the healthy ones must be a
							// majority of the enlarged cluster (stricter than etcd for one member).
							want = want && majority(h, v+1)
						}
						NewWithT(t).Expect(CanAddMember(c, learner)).To(Equal(want))
					})
				}
			}
		}
	}
}

func TestCanAddLearnerKnownCases(t *testing.T) {
	tests := []struct {
		name   string
		counts Counts
		want   bool
	}{
		{"3 of 3 healthy: the leader reaches 3 of 4", Counts{Voting: 3, Healthy: 3}, true},
		{"2 of 3 healthy: 2 of 4 is no quorum, etcd refuses even a learner", Counts{Voting: 3, Healthy: 2}, false},
		{"4 of 5 healthy: 4 of 6", Counts{Voting: 5, Healthy: 4}, true},
		{"3 of 5 healthy: 3 of 6 is no quorum", Counts{Voting: 5, Healthy: 3}, false},
		{"2 of 2 healthy: 2 of 3", Counts{Voting: 2, Healthy: 2}, true},
		{"single member: may always grow", Counts{Voting: 1, Healthy: 1}, true},
		{"learners do not count towards the quorum", Counts{Voting: 3, Healthy: 2, Learners: 2}, false},
		{"one learner already: etcd allows one at a time", Counts{Voting: 3, Healthy: 3, Learners: 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(CanAddMember(tt.counts, true)).To(Equal(tt.want))
		})
	}
}

func TestCanRemoveMemberEveryCombination(t *testing.T) {
	for v := 1; v <= 7; v++ {
		for h := 0; h <= v; h++ {
			for l := 0; l <= 2; l++ {
				for _, victim := range []Victim{{Healthy: true}, {Healthy: false}, {Learner: true}} {
					if victim.Healthy && h == 0 {
						continue // a healthy victim needs at least one healthy member
					}
					if victim.Learner && l == 0 {
						continue // a learner victim needs at least one learner
					}
					if !victim.Healthy && !victim.Learner && h == v {
						continue // an unhealthy voting victim needs an unhealthy member
					}
					c := Counts{Voting: v, Healthy: h, Learners: l}
					name := fmt.Sprintf("V%d_H%d_L%d_healthy%t_learner%t", v, h, l, victim.Healthy, victim.Learner)
					t.Run(name, func(t *testing.T) {
						var want bool
						switch {
						case !majority(h, v):
							want = false // quorum already lost: nothing automatic
						case victim.Learner:
							want = true
						case l > 0:
							want = false // a learner pending promotion
						default:
							hAfter := h
							if victim.Healthy {
								hAfter--
							}
							want = v-1 >= 1 && majority(hAfter, v-1)
						}
						NewWithT(t).Expect(CanRemoveMember(c, victim)).To(Equal(want))
					})
				}
			}
		}
	}
}

// tookDownSafely is the oracle for CanTakeDown, counted over every cluster the counts may stand for.
// A healthy member votes. A voting member that is not healthy may or may not vote: it may be dead,
// or alive and carrying the quorum while it cannot be reached through its node (kubelet down) or is
// alarmed. A linearizable read (proven) rules out the worlds where fewer than a majority vote. The
// victim may go down only when, in every world left, the voters other than the victim are still a
// majority of all voters. A node-local (serializable) view is never acted on, and counts without
// proof must show a healthy majority (nothing automatic without quorum).
func tookDownSafely(c Counts, victimHealthy, victimLearner bool) bool {
	if c.Serializable || c.Voting < 1 || !c.QuorumProven && !majority(c.Healthy, c.Voting) {
		return false
	}
	if victimLearner {
		return true
	}
	unknown := c.Voting - c.Healthy // members that may or may not vote, the victim among them when it is unhealthy
	worlds := 0
	for alive := range 1 << unknown {
		voting := c.Healthy
		victimVotes := victimHealthy
		for i := range unknown {
			if alive&(1<<i) != 0 {
				voting++
				if !victimHealthy && i == 0 {
					victimVotes = true // unknown member 0 is the victim
				}
			}
		}
		if c.QuorumProven && !majority(voting, c.Voting) {
			continue // etcd could not have answered the linearizable read in this world
		}
		worlds++
		after := voting
		if victimVotes {
			after--
		}
		if !majority(after, c.Voting) {
			return false
		}
	}
	return worlds > 0
}

// TestCanTakeDownEveryCombination covers every count up to 7 voters with the proof of quorum, the
// unreachable members and a node-local view, for a healthy, unhealthy (unreachable or alarmed) and
// learner victim.
func TestCanTakeDownEveryCombination(t *testing.T) {
	for v := 1; v <= 7; v++ {
		for h := 0; h <= v; h++ {
			for u := 0; u <= v; u++ {
				// Unreachable members are the unhealthy ones plus, when quorum is proven, healthy ones
				// that etcd shows alive (etcdutil markAlive: the leader the others follow, a follower the
				// leader hears from): u ≤ V-H, or any u with proof.
				for _, flags := range []Counts{{}, {QuorumProven: true}, {Serializable: true}} {
					if u > v-h && !flags.QuorumProven {
						continue
					}
					for _, victim := range []Victim{{Healthy: true}, {Healthy: false}, {Learner: true}} {
						if victim.Healthy && h == 0 {
							continue // a healthy victim needs at least one healthy member
						}
						if !victim.Healthy && !victim.Learner && h == v {
							continue // an unhealthy voting victim needs an unhealthy member
						}
						c := Counts{Voting: v, Healthy: h, Learners: 1, Unreachable: u, QuorumProven: flags.QuorumProven, Serializable: flags.Serializable}
						if !victim.Learner {
							c.Learners = 0
						}
						t.Run(fmt.Sprintf("V%d_H%d_U%d_proven%t_serializable%t_healthy%t_learner%t", v, h, u, c.QuorumProven, c.Serializable, victim.Healthy, victim.Learner), func(t *testing.T) {
							NewWithT(t).Expect(CanTakeDown(c, victim)).To(Equal(tookDownSafely(c, victim.Healthy, victim.Learner)))
						})
					}
				}
			}
		}
	}
}

func TestCanTakeDownKnownCases(t *testing.T) {
	tests := []struct {
		name   string
		counts Counts
		victim Victim
		want   bool
	}{
		{"3 healthy, healthy victim reboots: 2 of 3 vote", Counts{Voting: 3, Healthy: 3}, Victim{Healthy: true}, true},
		{"3 members, one other dead, healthy victim: 1 of 3 would lose quorum", Counts{Voting: 3, Healthy: 2}, Victim{Healthy: true}, false},
		{"3 members, the victim dead: nothing changes", Counts{Voting: 3, Healthy: 2}, Victim{}, true},
		{"5 healthy, healthy victim: 4 of 5", Counts{Voting: 5, Healthy: 5}, Victim{Healthy: true}, true},
		{"5 members, two others dead, healthy victim: 2 of 5", Counts{Voting: 5, Healthy: 3}, Victim{Healthy: true}, false},
		{"1 member, healthy victim: the only voter", Counts{Voting: 1, Healthy: 1}, Victim{Healthy: true}, false},
		{"quorum lost: nothing automatic", Counts{Voting: 3, Healthy: 1}, Victim{}, false},
		{"node-local member list: not authoritative", Counts{Voting: 3, Healthy: 3, Serializable: true}, Victim{}, false},
		// Quorum proven by a linearizable read while members cannot be reached: A healthy
		// and leading, B dead, C's kubelet down with its member alive. A and C carry the quorum, so
		// C may not go down: A alone is 1 of 3.
		{"3 voters proven, A healthy, B dead, victim C unreachable: A alone would be 1 of 3", Counts{Voting: 3, Healthy: 1, Unreachable: 2, QuorumProven: true}, Victim{}, false},
		{"3 voters proven, A healthy, B alarmed, victim C unreachable: B may not vote", Counts{Voting: 3, Healthy: 1, Unreachable: 1, QuorumProven: true}, Victim{}, false},
		{"3 voters proven, A and B healthy, victim C unreachable: 2 of 3 without it", Counts{Voting: 3, Healthy: 2, Unreachable: 1, QuorumProven: true}, Victim{}, true},
		{"3 voters proven, leader A healthy but unreachable, B healthy, victim C unreachable", Counts{Voting: 3, Healthy: 2, Unreachable: 2, QuorumProven: true}, Victim{}, true},
		{"3 voters proven, A healthy, B dead, healthy victim C: 1 of 3", Counts{Voting: 3, Healthy: 2, Unreachable: 1, QuorumProven: true}, Victim{Healthy: true}, false},
		{"5 voters proven, 2 healthy, victim among 3 unreachable: 2 of 5", Counts{Voting: 5, Healthy: 2, Unreachable: 3, QuorumProven: true}, Victim{}, false},
		{"5 voters proven, 3 healthy, victim among 2 unreachable: 3 of 5", Counts{Voting: 5, Healthy: 3, Unreachable: 2, QuorumProven: true}, Victim{}, true},
		{"3 voters proven, 1 healthy, learner victim: the vote is untouched", Counts{Voting: 3, Healthy: 1, Unreachable: 2, Learners: 1, QuorumProven: true}, Victim{Learner: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(CanTakeDown(tt.counts, tt.victim)).To(Equal(tt.want))
		})
	}
}

func TestCanRemoveMemberKnownCases(t *testing.T) {
	tests := []struct {
		name   string
		counts Counts
		victim Victim
		want   bool
	}{
		{"3 members, dead victim: 2 of 2 remain", Counts{Voting: 3, Healthy: 2, Learners: 0}, Victim{}, true},
		{"3 members all healthy, healthy victim: 2 of 2 remain", Counts{Voting: 3, Healthy: 3, Learners: 0}, Victim{Healthy: true}, true},
		{"3 members, one other dead, healthy victim: 1 of 2 would lose quorum", Counts{Voting: 3, Healthy: 2, Learners: 0}, Victim{Healthy: true}, false},
		{"3 members, two dead: quorum already lost", Counts{Voting: 3, Healthy: 1, Learners: 0}, Victim{}, false},
		{"5 members, two dead, dead victim: 3 of 4", Counts{Voting: 5, Healthy: 3, Learners: 0}, Victim{}, true},
		{"4 voters after scale-up, healthy victim: 3 of 3", Counts{Voting: 4, Healthy: 4, Learners: 0}, Victim{Healthy: true}, true},
		{"learner pending promotion blocks removal", Counts{Voting: 3, Healthy: 3, Learners: 1}, Victim{Healthy: true}, false},
		{"never the last member", Counts{Voting: 1, Healthy: 1, Learners: 0}, Victim{Healthy: true}, false},
		{"2 members, dead victim: 1 of 1", Counts{Voting: 2, Healthy: 1, Learners: 0}, Victim{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(CanRemoveMember(tt.counts, tt.victim)).To(Equal(tt.want))
		})
	}
}

func TestMaxUnhealthyControlPlane(t *testing.T) {
	g := NewWithT(t)
	for n, want := range map[int]int{0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2, 7: 3} {
		g.Expect(MaxUnhealthyControlPlane(n)).To(Equal(want), "n=%d", n)
	}
	g.Expect(EffectiveControlPlaneLimit(-1, 5, false)).To(Equal(2))
	g.Expect(EffectiveControlPlaneLimit(1, 5, false)).To(Equal(1))
	g.Expect(EffectiveControlPlaneLimit(10, 7, false)).To(Equal(3))
	g.Expect(EffectiveControlPlaneLimit(0, 3, false)).To(Equal(0))
}

// With external etcd no quorum is at stake on the control-plane Machines: all but one may be
// unhealthy, the one a replacement joins through.
func TestMaxUnhealthyControlPlaneExternalEtcd(t *testing.T) {
	g := NewWithT(t)
	for n, want := range map[int]int{0: 0, 1: 0, 2: 1, 3: 2, 4: 3, 5: 4} {
		g.Expect(MaxUnhealthyControlPlaneExternalEtcd(n)).To(Equal(want), "n=%d", n)
	}
	g.Expect(EffectiveControlPlaneLimit(-1, 3, true)).To(Equal(2))
	g.Expect(EffectiveControlPlaneLimit(1, 3, true)).To(Equal(1))
	g.Expect(EffectiveControlPlaneLimit(-1, 1, true)).To(Equal(0))
}

// A linearizable read proves quorum whatever H says; a node-local (serializable) view never shows it.
func TestPresentAndLostWithProof(t *testing.T) {
	tests := []struct {
		name          string
		counts        Counts
		present, lost bool
	}{
		{"no proof, majority healthy", Counts{Voting: 3, Healthy: 2}, true, false},
		{"no proof, minority healthy", Counts{Voting: 3, Healthy: 1}, false, true},
		{"proven, two unreachable", Counts{Voting: 3, Healthy: 1, Unreachable: 2, QuorumProven: true}, true, false},
		{"node-local view, all healthy", Counts{Voting: 3, Healthy: 3, Serializable: true}, false, true},
		{"node-local view, two unreachable", Counts{Voting: 3, Unreachable: 2, Serializable: true}, false, true},
		{"no members", Counts{}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(Present(tt.counts)).To(Equal(tt.present))
			g.Expect(Lost(tt.counts)).To(Equal(tt.lost))
		})
	}
}

// Unreachable members count as unhealthy for every change, even with quorum proven.
func TestUnreachableMembersCountAsUnhealthy(t *testing.T) {
	g := NewWithT(t)
	proven := Counts{Voting: 3, Healthy: 1, Unreachable: 2, QuorumProven: true}
	g.Expect(CanAddMember(proven, true)).To(BeFalse())
	g.Expect(CanAddMember(proven, false)).To(BeFalse())
	g.Expect(CanRemoveMember(proven, Victim{})).To(BeFalse())
	serializable := Counts{Voting: 3, Healthy: 3, Serializable: true}
	g.Expect(CanAddMember(serializable, true)).To(BeFalse())
	g.Expect(CanRemoveMember(serializable, Victim{})).To(BeFalse())
}

// spare is the oracle for the failure margin: how many healthy voters may fail, one at a time, while
// the rest are still a strict majority of v (counted by trying, not by the formula under test).
func spare(h, v int) int {
	k := 0
	for majority(h-k-1, v) {
		k++
	}
	if !majority(h, v) {
		return -1
	}
	return k
}

// TestRemovalKeepsMarginEveryCombination: the oracle counts the margin before and after the removal
// (spare, over the members that remain) and wants the removal refused exactly when it takes a
// margin of at least one to none, whatever the victim; it does not branch on the victim's kind.
func TestRemovalKeepsMarginEveryCombination(t *testing.T) {
	for v := 1; v <= 7; v++ {
		for h := 0; h <= v; h++ {
			for _, proven := range []bool{false, true} {
				for _, victim := range []Victim{{Healthy: true}, {Healthy: false}, {Learner: true}} {
					if victim.Healthy && h == 0 || !victim.Healthy && !victim.Learner && h == v {
						continue
					}
					c := Counts{Voting: v, Healthy: h, Unreachable: v - h, QuorumProven: proven}
					t.Run(fmt.Sprintf("V%d_H%d_proven%t_healthy%t_learner%t", v, h, proven, victim.Healthy, victim.Learner), func(t *testing.T) {
						vAfter, hAfter := v, h
						if !victim.Learner {
							vAfter--
						}
						if victim.Healthy {
							hAfter--
						}
						want := spare(h, v) < 1 || spare(hAfter, vAfter) >= 1
						NewWithT(t).Expect(RemovalKeepsMargin(c, victim)).To(Equal(want))
					})
				}
			}
		}
	}
}

func TestRemovalKeepsMarginKnownCases(t *testing.T) {
	g := NewWithT(t)
	g.Expect(RemovalKeepsMargin(Counts{Voting: 3, Healthy: 3}, Victim{Healthy: true})).To(BeFalse(), "3 healthy → 2 of 2: no margin left")
	g.Expect(RemovalKeepsMargin(Counts{Voting: 5, Healthy: 5}, Victim{Healthy: true})).To(BeTrue(), "5 healthy → 4 of 4: margin 1")
	g.Expect(RemovalKeepsMargin(Counts{Voting: 3, Healthy: 2}, Victim{})).To(BeTrue(), "a dead victim: the margin is 0 either way")
	g.Expect(RemovalKeepsMargin(Counts{Voting: 4, Healthy: 4}, Victim{Healthy: true})).To(BeTrue(), "4 healthy (margin 1) → 3 of 3 (margin 1)")
}
