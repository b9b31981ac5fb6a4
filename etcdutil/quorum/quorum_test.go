package etcdutil

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
)

// majority is an oracle independent of Quorum's formula: a group of healthy voters keeps quorum
// when it is a strict majority of the voters.
func majority(healthy, voting int) bool { return voting > 0 && 2*healthy > voting }

func TestQuorum(t *testing.T) {
	g := NewWithT(t)
	for n, want := range map[int]int{1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 4} {
		g.Expect(Quorum(n)).To(Equal(want), "q(%d)", n)
	}
}

func TestQuorumPresentEveryCombination(t *testing.T) {
	for v := 0; v <= 7; v++ {
		for h := 0; h <= v; h++ {
			for l := 0; l <= 2; l++ {
				c := Counts{Voting: v, Healthy: h, Learners: l}
				t.Run(fmt.Sprintf("V%d_H%d_L%d", v, h, l), func(t *testing.T) {
					NewWithT(t).Expect(QuorumPresent(c)).To(Equal(majority(h, v)))
				})
			}
		}
	}
}

func TestCanAddMemberEveryCombination(t *testing.T) {
	for v := 1; v <= 7; v++ {
		for h := 0; h <= v; h++ {
			for _, learner := range []bool{true, false} {
				c := Counts{Voting: v, Healthy: h}
				t.Run(fmt.Sprintf("V%d_H%d_learner%t", v, h, learner), func(t *testing.T) {
					want := majority(h, v)
					if !learner {
						// The new voter is unhealthy until seen healthy: the healthy ones must be a
						// majority of the enlarged cluster.
						want = want && majority(h, v+1)
					}
					NewWithT(t).Expect(CanAddMember(c, learner)).To(Equal(want))
				})
			}
		}
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

func TestCanRemoveMemberKnownCases(t *testing.T) {
	tests := []struct {
		name   string
		counts Counts
		victim Victim
		want   bool
	}{
		{"3 members, dead victim: 2 of 2 remain", Counts{3, 2, 0}, Victim{}, true},
		{"3 members all healthy, healthy victim: 2 of 2 remain", Counts{3, 3, 0}, Victim{Healthy: true}, true},
		{"3 members, one other dead, healthy victim: 1 of 2 would lose quorum", Counts{3, 2, 0}, Victim{Healthy: true}, false},
		{"3 members, two dead: quorum already lost", Counts{3, 1, 0}, Victim{}, false},
		{"5 members, two dead, dead victim: 3 of 4", Counts{5, 3, 0}, Victim{}, true},
		{"4 voters after scale-up, healthy victim: 3 of 3", Counts{4, 4, 0}, Victim{Healthy: true}, true},
		{"learner pending promotion blocks removal", Counts{3, 3, 1}, Victim{Healthy: true}, false},
		{"never the last member", Counts{1, 1, 0}, Victim{Healthy: true}, false},
		{"2 members, dead victim: 1 of 1", Counts{2, 1, 0}, Victim{}, false},
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
	g.Expect(EffectiveControlPlaneLimit(-1, 5)).To(Equal(2))
	g.Expect(EffectiveControlPlaneLimit(1, 5)).To(Equal(1))
	g.Expect(EffectiveControlPlaneLimit(10, 7)).To(Equal(3))
	g.Expect(EffectiveControlPlaneLimit(0, 3)).To(Equal(0))
}
