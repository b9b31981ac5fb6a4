package quorum

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
)

// singleReplaceSafe is an oracle written without the package's functions: it replays the one order
// allowed for a control plane of one (add the replacement as a learner, promote it, remove the
// victim's healthy member) on v voters of which h are up, with etcd's add rule (a single voter may
// always grow; otherwise the up voters must be a majority of v+1), and says whether every change is
// accepted, the cluster keeps a majority after each, and it never has fewer up voters than before.
func singleReplaceSafe(v, h int) bool {
	if v < 1 || h < 1 || 2*h <= v {
		return false // no quorum: nothing is safe (h ≥ 1: the victim's own member is up)
	}
	if v != 1 && 2*h <= v+1 {
		return false // etcd refuses the learner
	}
	v, h = v+1, h+1 // promoted
	if 2*h <= v {
		return false
	}
	v, h = v-1, h-1 // the victim's healthy member removed
	return 2*h > v && h >= 1 && v-h == 0
}

func TestEffectiveSingleControlPlaneLimitEveryCombination(t *testing.T) {
	for v := 0; v <= 5; v++ {
		for h := 0; h <= v; h++ {
			for l := 0; l <= 1; l++ {
				for _, known := range []bool{true, false} {
					for user := -1; user <= 2; user++ {
						c := Counts{Voting: v, Healthy: h, Learners: l}
						t.Run(fmt.Sprintf("V%d_H%d_L%d_known%t_user%d", v, h, l, known, user), func(t *testing.T) {
							want := 0
							if known && user != 0 && singleReplaceSafe(v, h) {
								want = 1
							}
							NewWithT(t).Expect(EffectiveSingleControlPlaneLimit(user, c, known)).To(Equal(want))
						})
					}
				}
			}
		}
	}
}

func TestSingleMemberKnownCases(t *testing.T) {
	g := NewWithT(t)
	g.Expect(SingleMemberReplaceable(Counts{Voting: 1, Healthy: 1})).To(BeTrue(), "kubelet dead, member healthy")
	g.Expect(SingleMemberReplaceable(Counts{Voting: 1, Healthy: 0})).To(BeFalse(), "member dead: no quorum")
	g.Expect(SingleMemberReplaceable(Counts{Voting: 1, Healthy: 1, Serializable: true})).To(BeFalse(), "a node-local view is never acted on")
	g.Expect(SingleMemberReplaceable(Counts{Voting: 3, Healthy: 3})).To(BeTrue(), "mid-surge, both replacements vote")
	g.Expect(SingleMemberReplaceable(Counts{Voting: 2, Healthy: 1, QuorumProven: true})).To(BeFalse(), "a voter not seen up")
	// The clamp for one desired replica is unchanged: the member decides (EffectiveSingleControlPlaneLimit).
	g.Expect(EffectiveControlPlaneLimit(-1, 1, false)).To(Equal(0))
	g.Expect(SingleMemberRecovery).To(ContainSubstring("etcdutl snapshot restore"))
	// A stopped kubelet hides a running member (CAPR reaches etcd through it): the message says to
	// look there before anything that would restore over a live member.
	g.Expect(SingleMemberRecovery).To(ContainSubstring("start the kubelet and restore nothing"))
}
