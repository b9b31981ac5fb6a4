package controlplane

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
)

func TestChooseOrder(t *testing.T) {
	auto := caprv1.ControlPlaneOrderAuto
	tests := []struct {
		name       string
		in         OrderInput
		order      caprv1.ControlPlaneOrder
		waitReason string
	}{
		{"not initialized: replace", OrderInput{Policy: auto, Counts: etcdutil.Counts{}}, caprv1.ControlPlaneOrderReplace, ""},
		{"3 healthy, node broken: scale up first", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"3 members, victim member dead: remove first", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 2}, Victim: VictimUnhealthy}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"3 members, victim dead, provider adds learners: scale up first is safe", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 2}, Victim: VictimUnhealthy, AddsLearners: true}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"5 members, victim dead: scale up first is still safe", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 5, Healthy: 4}, Victim: VictimUnhealthy}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"5 members, two dead, victim dead: remove first", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 5, Healthy: 3}, Victim: VictimUnhealthy}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"5 members, two dead, victim healthy: neither is safe", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 5, Healthy: 3}, Victim: VictimHealthy}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"3 members, another dead, victim healthy: wait", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 2}, Victim: VictimHealthy}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"3 members, two dead: quorum lost", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 1}, Victim: VictimUnhealthy}, "", caprv1.MachineRemediationQuorumLostReason},
		{"victim member missing: remove is a no-op, then scale up", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 2, Healthy: 2}, Victim: VictimMissing}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"learner pending: wait", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 3, Learners: 1}, Victim: VictimHealthy}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"victim is the only learner: removable", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 3, Learners: 1}, Victim: VictimLearner}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"policy RemoveMemberFirst with healthy victim", OrderInput{Policy: caprv1.ControlPlaneOrderRemoveMemberFirst, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"provider refuses scale-up now: remove first", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy, ProviderRefusesScaleUpNow: "KCP preflight"}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"provider refuses both: wait", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy, ProviderRefusesScaleUpNow: "x", ProviderRefusesScaleUpAfterRemoval: "y"}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"single member healthy: adding a voter is not safe, removing the last is refused", OrderInput{Policy: auto, Initialized: true,
			Counts: etcdutil.Counts{Voting: 1, Healthy: 1}, Victim: VictimHealthy}, "", caprv1.MachineRemediationNotQuorumSafeReason},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			d := ChooseOrder(tt.in)
			g.Expect(d.Order).To(Equal(tt.order), d.WaitMessage)
			g.Expect(d.WaitReason).To(Equal(tt.waitReason), d.Reason)
			if tt.waitReason != "" {
				g.Expect(d.WaitMessage).NotTo(BeEmpty())
			} else {
				g.Expect(d.Reason).NotTo(BeEmpty())
			}
		})
	}
}

// TestChosenOrdersNeverLoseQuorum checks every order ChooseOrder allows against the quorum math at each
// membership change it implies, for every cluster up to 7 members (the invariant, exhaustively).
func TestChosenOrdersNeverLoseQuorum(t *testing.T) {
	for v := 1; v <= 7; v++ {
		for h := 0; h <= v; h++ {
			for _, victim := range []VictimMember{VictimHealthy, VictimUnhealthy, VictimMissing} {
				for _, learners := range []bool{false, true} {
					if victim == VictimHealthy && h == 0 || victim == VictimUnhealthy && h == v {
						continue
					}
					c := etcdutil.Counts{Voting: v, Healthy: h}
					d := ChooseOrder(OrderInput{Policy: caprv1.ControlPlaneOrderAuto, Initialized: true, Counts: c, Victim: victim, AddsLearners: learners})
					name := fmt.Sprintf("V%d_H%d_%s_learners%t", v, h, victim, learners)
					t.Run(name, func(t *testing.T) {
						g := NewWithT(t)
						if d.WaitReason != "" {
							return
						}
						g.Expect(etcdutil.QuorumPresent(c)).To(BeTrue())
						// The new member counts as unhealthy until it is seen healthy.
						addVoting := func(c etcdutil.Counts) etcdutil.Counts {
							if learners {
								return c
							}
							return etcdutil.Counts{Voting: c.Voting + 1, Healthy: c.Healthy}
						}
						switch d.Order {
						case caprv1.ControlPlaneOrderScaleUpFirst:
							g.Expect(etcdutil.QuorumPresent(addVoting(c))).To(BeTrue(), "while the replacement joins")
							// Replacement healthy and voting; then the victim is removed.
							withNew := etcdutil.Counts{Voting: v + 1, Healthy: h + 1}
							if victim != VictimMissing {
								g.Expect(etcdutil.CanRemoveMember(withNew, etcdutil.Victim{Healthy: victim == VictimHealthy})).To(BeTrue())
							}
						case caprv1.ControlPlaneOrderRemoveMemberFirst:
							after := countsAfterRemoval(c, victim)
							g.Expect(etcdutil.QuorumPresent(after)).To(BeTrue(), "after removal")
							g.Expect(etcdutil.QuorumPresent(addVoting(after))).To(BeTrue(), "while the replacement joins")
						default:
							t.Fatalf("unexpected order %q", d.Order)
						}
					})
				}
			}
		}
	}
}

func TestCheckRetryLimits(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	rec := func(ago time.Duration, count int32) *caprv1.RemediationRecord {
		return &caprv1.RemediationRecord{Machine: "old", Timestamp: metav1.NewTime(now.Add(-ago)), RetryCount: count}
	}
	spec := &caprv1.ControlPlaneRemediationSpec{MaxRetry: ptr.To[int32](2), RetryPeriodSeconds: ptr.To[int32](300), MinHealthyPeriodSeconds: ptr.To[int32](3600)}
	tests := []struct {
		name    string
		record  *caprv1.RemediationRecord
		spec    *caprv1.ControlPlaneRemediationSpec
		allowed bool
		giveUp  bool
		wait    bool
		count   int32
	}{
		{"not a replacement", nil, spec, true, false, false, 0},
		{"replacement failed after minHealthyPeriod: new sequence", rec(2*time.Hour, 5), spec, true, false, false, 0},
		{"within retry period: wait", rec(time.Minute, 0), spec, false, false, true, 0},
		{"retry allowed, count grows", rec(10*time.Minute, 0), spec, true, false, false, 1},
		{"second retry", rec(10*time.Minute, 1), spec, true, false, false, 2},
		{"maxRetry reached", rec(10*time.Minute, 2), spec, false, true, false, 2},
		{"no maxRetry: unlimited", rec(10*time.Minute, 50), &caprv1.ControlPlaneRemediationSpec{}, true, false, false, 51},
		{"default minHealthyPeriod is one hour", rec(59*time.Minute, 0), nil, true, false, false, 1},
		{"default minHealthyPeriod passed", rec(61*time.Minute, 3), nil, true, false, false, 0},
		{"unreadable (zero) timestamp is a new sequence", &caprv1.RemediationRecord{Machine: "(unreadable)", RetryCount: 9}, spec, true, false, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			d := CheckRetryLimits(tt.record, tt.spec, now)
			g.Expect(d.Allowed).To(Equal(tt.allowed))
			g.Expect(d.GiveUp).To(Equal(tt.giveUp))
			g.Expect(!d.WaitUntil.IsZero()).To(Equal(tt.wait))
			g.Expect(d.RetryCount).To(Equal(tt.count))
			if !tt.allowed {
				g.Expect(d.Message).NotTo(BeEmpty())
			}
		})
	}
}

func TestFirstCandidate(t *testing.T) {
	g := NewWithT(t)
	t0 := time.Now()
	g.Expect(FirstCandidate(nil)).To(Equal(""))
	g.Expect(FirstCandidate([]Candidate{
		{Name: "healthy-old", Member: VictimHealthy, Created: t0.Add(-time.Hour)},
		{Name: "dead-new", Member: VictimUnhealthy, Created: t0},
	})).To(Equal("dead-new"), "a dead member goes before a healthy one")
	g.Expect(FirstCandidate([]Candidate{
		{Name: "dead", Member: VictimUnhealthy, Created: t0},
		{Name: "asked", Requested: true, Member: VictimHealthy, Created: t0},
	})).To(Equal("asked"))
	g.Expect(FirstCandidate([]Candidate{
		{Name: "b", Member: VictimMissing, Created: t0},
		{Name: "a", Member: VictimUnhealthy, Created: t0},
	})).To(Equal("a"))
}
