package controlplane

import (
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/etcdutil/quorum"
)

// TestAlarmedVictimIsKeptUntilItsReplacementVotes: a member carrying etcd's NOSPACE alarm still follows
// the leader and votes (an alarm stops requests, not raft), so it counts in the quorum and its Machine
// is replaced scale-up-first, as a member under a dead kubelet is: removing it first would leave 2 of 2
// voting members, margin 0, until the replacement votes (compare-kcp's "etcd member degraded" row).
// The state is what Inspect reports for such a member (TestInspectAlarmedMember, real etcd).
func TestAlarmedVictimIsKeptUntilItsReplacementVotes(t *testing.T) {
	g := NewWithT(t)
	state := &etcdutil.State{QuorumProven: true, LeaderID: 1, Members: []etcdutil.MemberStatus{
		{ID: 1, Name: "a", Reachable: true, Healthy: true, Votes: true},
		{ID: 2, Name: "b", Reachable: true, Healthy: true, Votes: true},
		{ID: 3, Name: "c", Reachable: true, Votes: true, Alarms: []string{"NOSPACE"}, Problem: "alarmed (NOSPACE)"},
	}}
	g.Expect(victimMember(state, "c")).To(Equal(VictimHealthy))
	in := OrderInput{Policy: caprv1.ControlPlaneOrderAuto, Initialized: true, Counts: state.Counts(), Victim: victimMember(state, "c"),
		VictimProblem: state.ByName("c").Problem}
	g.Expect(in.Counts.Healthy).To(Equal(3))
	d := ChooseOrder(in)
	g.Expect(d.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), d.WaitMessage)
	g.Expect(d.Reason).To(ContainSubstring("alarmed (NOSPACE) but still votes"))

	// Where the provider refuses the surge (KCP's preflight, while the victim's EtcdMemberHealthy is
	// False), an alarmed victim is removed first, not waited for: a healthy one would wait for consent.
	in.ProviderRefusesScaleUpNow = "Machine c reports EtcdMemberHealthy False"
	d = ChooseOrder(in)
	g.Expect(d.Order).To(Equal(caprv1.ControlPlaneOrderRemoveMemberFirst), d.WaitMessage)
	g.Expect(d.Reason).To(ContainSubstring("alarmed (NOSPACE) but still votes"))
	in.VictimProblem = ""
	g.Expect(ChooseOrder(in).WaitReason).To(Equal(caprv1.MachineRemediationWouldLoseFailureMarginReason))
	in.VictimProblem = state.ByName("c").Problem
	in.ProviderRefusesScaleUpNow = ""

	// Without a leader the alarmed member is not up: it is removed first.
	state.Members[2].Votes = false
	g.Expect(victimMember(state, "c")).To(Equal(VictimUnhealthy))
	g.Expect(state.Counts().Healthy).To(Equal(2))
}

func TestChooseOrder(t *testing.T) {
	auto := caprv1.ControlPlaneOrderAuto
	tests := []struct {
		name       string
		in         OrderInput
		order      caprv1.ControlPlaneOrder
		waitReason string
	}{
		{"not initialized: replace", OrderInput{Policy: auto, Counts: quorum.Counts{}}, caprv1.ControlPlaneOrderReplace, ""},
		{"3 healthy, node broken: scale up first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"3 members, victim member dead: remove first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 2}, Victim: VictimUnhealthy}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"3 members, victim dead, provider adds learners: etcd refuses even a learner (2 of 4), remove first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 2}, Victim: VictimUnhealthy, AddsLearners: true}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"5 members, victim dead, provider adds learners: adding first would be safe (4 of 6), but removing first costs no margin", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 4}, Victim: VictimUnhealthy, AddsLearners: true}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"3 members, two unreachable, linearizable read answered: quorum proven, not lost: wait for etcd", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 1, Unreachable: 2, QuorumProven: true}, Victim: VictimUnhealthy, Unreachable: []string{"n2", "n3"}},
			"", caprv1.MachineRemediationEtcdUnreachableReason},
		{"3 members, one unreachable, quorum proven: the unreachable victim counts as unhealthy, remove first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 2, Unreachable: 1, QuorumProven: true}, Victim: VictimUnhealthy}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"3 members, two reachable but not up (alarmed without a leader), quorum proven: not lost, not safe", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 1, QuorumProven: true}, Victim: VictimUnhealthy}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"node-local list, two unreachable: the reachable member has no quorum, nothing done", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 0, Unreachable: 2, Serializable: true}, Victim: VictimUnhealthy}, "", caprv1.MachineRemediationQuorumLostReason},
		{"node-local list, every member answered, none has quorum: quorum lost", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 0, Serializable: true}, Victim: VictimUnhealthy}, "", caprv1.MachineRemediationQuorumLostReason},
		{"node-local list claiming full health is still not acted on", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3, Serializable: true}, Victim: VictimHealthy}, "", caprv1.MachineRemediationQuorumLostReason},
		{"5 members, victim dead: adding a voter first is safe but drops the margin to 0 until it starts (4 of 6); removing first keeps 1", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 4}, Victim: VictimUnhealthy}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"5 members, victim dead, surge of two Machines: delete first, one Machine", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 4}, Victim: VictimUnhealthy, SurgeMachines: 2}, caprv1.ControlPlaneOrderDeleteFirst, ""},
		{"3 members, victim dead, surge of two Machines: delete first, one Machine (KCP without returning replicas at the first)", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 2}, Victim: VictimUnhealthy, SurgeMachines: 2}, caprv1.ControlPlaneOrderDeleteFirst, ""},
		{"5 members, victim dead, adding first safe, removal refused by the provider after: scale up first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 4}, Victim: VictimUnhealthy, ProviderRefusesScaleUpAfterRemoval: "x"}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"5 members, two dead, victim dead: remove first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 3}, Victim: VictimUnhealthy}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"5 members, two dead, victim healthy: neither is safe", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 3}, Victim: VictimHealthy}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"3 members, another dead, victim healthy: wait", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 2}, Victim: VictimHealthy}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"3 members, two dead: quorum lost", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 1}, Victim: VictimUnhealthy}, "", caprv1.MachineRemediationQuorumLostReason},
		{"victim member missing: nothing to remove, then the replacement is added", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 2, Healthy: 2}, Victim: VictimMissing}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"victim member missing, surge of two Machines: delete first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 2, Healthy: 2}, Victim: VictimMissing, SurgeMachines: 2}, caprv1.ControlPlaneOrderDeleteFirst, ""},
		{"learner pending: wait", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3, Learners: 1}, Victim: VictimHealthy}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"victim is the only learner: removed first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3, Learners: 1}, Victim: VictimLearner}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"victim is the only learner, provider adds learners: etcd takes one learner at a time, remove first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3, Learners: 1}, Victim: VictimLearner, AddsLearners: true}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"policy RemoveMemberFirst with healthy victim", OrderInput{Policy: caprv1.ControlPlaneOrderRemoveMemberFirst, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		// Removing a healthy member first would leave 2 of 2 (no failure margin): wait, unless a person
		// chose RemoveMemberFirst. With 5 members removing one keeps a margin.
		{"provider refuses scale-up now, 3 healthy: removing first would lose the margin, wait", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy, ProviderRefusesScaleUpNow: "KCP preflight"}, "", caprv1.MachineRemediationWouldLoseFailureMarginReason},
		{"provider refuses scale-up now, 3 healthy, policy RemoveMemberFirst: remove first", OrderInput{Policy: caprv1.ControlPlaneOrderRemoveMemberFirst, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy, ProviderRefusesScaleUpNow: "KCP preflight"}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"provider refuses scale-up now, 5 healthy: remove first keeps a margin", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 5}, Victim: VictimHealthy, ProviderRefusesScaleUpNow: "KCP preflight"}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"provider refuses scale-up now, victim dead: remove first (the margin is 0 either way)", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 2}, Victim: VictimUnhealthy, ProviderRefusesScaleUpNow: "KCP preflight"}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"provider refuses both: wait", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy, ProviderRefusesScaleUpNow: "x", ProviderRefusesScaleUpAfterRemoval: "y"}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"single member healthy: adding a voter is not safe, removing the last is refused", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 1, Healthy: 1}, Victim: VictimHealthy}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		// A control plane of one (single.go).
		{"single member healthy, provider adds learners: scale up first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 1, Healthy: 1, QuorumProven: true}, Victim: VictimHealthy, AddsLearners: true}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"single member healthy, policy RemoveMemberFirst: it would remove the last voter, scale up first", OrderInput{Policy: caprv1.ControlPlaneOrderRemoveMemberFirst, Initialized: true,
			Counts: quorum.Counts{Voting: 1, Healthy: 1, QuorumProven: true}, Victim: VictimHealthy, AddsLearners: true}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"single member healthy, provider refuses scale-up now: wait, never remove first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 1, Healthy: 1}, Victim: VictimHealthy, AddsLearners: true, ProviderRefusesScaleUpNow: "KCP preflight"}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"single member healthy, surge of two Machines, provider would not scale down: wait, never delete first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 1, Healthy: 1}, Victim: VictimHealthy, AddsLearners: true, ProviderRefusesScaleDown: "x", SurgeMachines: 2}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"single member healthy, one Machine, provider would not scale down: nothing to scale down, scale up first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 1, Healthy: 1}, Victim: VictimHealthy, AddsLearners: true, ProviderRefusesScaleDown: "x"}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"single member dead: quorum lost", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 1, Healthy: 0}, Victim: VictimUnhealthy, AddsLearners: true}, "", caprv1.MachineRemediationQuorumLostReason},
		{"single member unreachable: quorum lost", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 1, Healthy: 0, Unreachable: 1}, Victim: VictimUnhealthy, AddsLearners: true}, "", caprv1.MachineRemediationQuorumLostReason},
		// The provider would not scale down (KCP with another unhealthy Machine): no surge that leaves
		// a surplus Machine; one replacement leaves none (CAPR deletes the victim itself).
		{"5 members, two dead, surge of two Machines, provider would not scale down: delete first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 3}, Victim: VictimUnhealthy, ProviderRefusesScaleDown: "KCP: d unhealthy", SurgeMachines: 2}, caprv1.ControlPlaneOrderDeleteFirst, ""},
		{"5 members, two dead, one Machine, provider would not scale down: remove first, the replacement provisioned before the delete", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 3}, Victim: VictimUnhealthy, ProviderRefusesScaleDown: "KCP: d unhealthy", SurgeMachines: 1}, caprv1.ControlPlaneOrderRemoveMemberFirst, ""},
		{"3 healthy, victim healthy, surge of two Machines, provider would not scale down: deleting first would lose the margin, wait", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy, ProviderRefusesScaleDown: "x", SurgeMachines: 2}, "", caprv1.MachineRemediationWouldLoseFailureMarginReason},
		{"3 healthy, victim healthy, one Machine, provider would not scale down: scale up first, nothing to scale down", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy, ProviderRefusesScaleDown: "x", SurgeMachines: 1}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"3 healthy, victim healthy, surge of two Machines: scale up first, the margin before the Machines", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy, SurgeMachines: 2}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"4 healthy, victim healthy, learner joins, surge of two Machines: removing first keeps the margin (3 of 3), delete first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 4, Healthy: 4}, Victim: VictimHealthy, AddsLearners: true, SurgeMachines: 2}, caprv1.ControlPlaneOrderDeleteFirst, ""},
		{"4 healthy, victim healthy, voting joins, surge of two Machines: a voter added after the removal would leave no margin until it starts, scale up first", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 4, Healthy: 4}, Victim: VictimHealthy, SurgeMachines: 2}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"3 healthy, victim healthy, surge of two Machines, provider would not scale down, policy RemoveMemberFirst: delete first", OrderInput{Policy: caprv1.ControlPlaneOrderRemoveMemberFirst, Initialized: true,
			Counts: quorum.Counts{Voting: 3, Healthy: 3}, Victim: VictimHealthy, ProviderRefusesScaleDown: "x", SurgeMachines: 2}, caprv1.ControlPlaneOrderDeleteFirst, ""},
		{"provider would not scale down nor scale up after removal: wait", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 3}, Victim: VictimUnhealthy, ProviderRefusesScaleDown: "x", ProviderRefusesScaleUpAfterRemoval: "y"}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"provider would not scale down, removal unsafe: wait", OrderInput{Policy: auto, Initialized: true,
			Counts: quorum.Counts{Voting: 5, Healthy: 3}, Victim: VictimHealthy, ProviderRefusesScaleDown: "x"}, "", caprv1.MachineRemediationNotQuorumSafeReason},
		{"not initialized, provider would not scale down: still replace", OrderInput{Policy: auto, ProviderRefusesScaleDown: "x"}, caprv1.ControlPlaneOrderReplace, ""},
		// External etcd (chooseExternalEtcdOrder): no member, no quorum; a Machine serving the API is kept.
		{"external etcd: two others serve: scale up first", OrderInput{Policy: auto, Initialized: true, ExternalEtcd: true, ServingOthers: 2},
			caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"external etcd: etcd counts are not looked at: a zero member list does not mean quorum lost", OrderInput{Policy: auto, Initialized: true, ExternalEtcd: true,
			ServingOthers: 1, Counts: quorum.Counts{}}, caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"external etcd: RemoveMemberFirst has no member to remove: scale up first", OrderInput{Policy: caprv1.ControlPlaneOrderRemoveMemberFirst, Initialized: true, ExternalEtcd: true, ServingOthers: 2},
			caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"external etcd: a single Machine whose API still serves: scale up first", OrderInput{Policy: auto, Initialized: true, ExternalEtcd: true, VictimServes: true},
			caprv1.ControlPlaneOrderScaleUpFirst, ""},
		{"external etcd: nothing serves: wait", OrderInput{Policy: auto, Initialized: true, ExternalEtcd: true},
			"", caprv1.MachineRemediationNoServingControlPlaneReason},
		{"external etcd: provider refuses to scale up: wait with its reason", OrderInput{Policy: auto, Initialized: true, ExternalEtcd: true, ServingOthers: 2,
			ProviderRefusesScaleUpNow: "no certificates", ProviderRefusesScaleUpAfterRemoval: "no certificates"}, "", caprv1.MachineRemediationWaitingForPreconditionsReason},
		{"external etcd: provider would not scale down (another unhealthy): delete first", OrderInput{Policy: auto, Initialized: true, ExternalEtcd: true, ServingOthers: 1,
			ProviderRefusesScaleDown: "b is not healthy"}, caprv1.ControlPlaneOrderDeleteFirst, ""},
		{"external etcd: would not scale down and no other serves: deleting first would leave none, wait", OrderInput{Policy: auto, Initialized: true, ExternalEtcd: true,
			VictimServes: true, ProviderRefusesScaleDown: "b is not healthy"}, "", caprv1.MachineRemediationNoServingControlPlaneReason},
		{"external etcd: would not scale down, nor create after the delete: wait", OrderInput{Policy: auto, Initialized: true, ExternalEtcd: true, ServingOthers: 1,
			ProviderRefusesScaleDown: "b", ProviderRefusesScaleUpAfterRemoval: "c"}, "", caprv1.MachineRemediationWaitingForPreconditionsReason},
		{"external etcd: not initialized: replace, as with stacked etcd", OrderInput{Policy: auto, ExternalEtcd: true}, caprv1.ControlPlaneOrderReplace, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			d := ChooseOrder(tt.in)
			g.Expect(d.Order).To(Equal(tt.order), d.WaitMessage)
			g.Expect(d.WaitReason).To(Equal(tt.waitReason), d.Reason)
			if tt.in.Counts.Voting == 1 {
				singleMemberExpectations(g, tt.in, d)
			}
			if tt.waitReason != "" {
				g.Expect(d.WaitMessage).NotTo(BeEmpty())
				for _, n := range tt.in.Unreachable {
					g.Expect(d.WaitMessage).To(ContainSubstring(n))
				}
				if tt.in.Counts.QuorumProven {
					g.Expect(d.WaitMessage).NotTo(ContainSubstring("disaster recovery"))
					g.Expect(d.WaitMessage).To(ContainSubstring("quorum exists"))
				}
			} else {
				g.Expect(d.Reason).NotTo(BeEmpty())
			}
		})
	}
}

// singleMemberExpectations are what a cluster of one voting member must get (single.go): never an
// order that removes the last voter, the recovery named when quorum is lost, the annotation named
// when the provider's voting joins are what blocks, and the one safe order when it is possible.
func singleMemberExpectations(g Gomega, in OrderInput, d OrderDecision) {
	if in.Victim == VictimHealthy || in.Victim == VictimUnhealthy {
		// The victim's member is the only voter (a missing or learner victim removes no voter).
		g.Expect(d.Order).NotTo(BeElementOf(caprv1.ControlPlaneOrderRemoveMemberFirst, caprv1.ControlPlaneOrderDeleteFirst), d.Reason)
	}
	if d.WaitReason == caprv1.MachineRemediationQuorumLostReason {
		g.Expect(d.WaitMessage).To(ContainSubstring("etcdutl snapshot restore"))
		g.Expect(d.WaitMessage).To(ContainSubstring("runbook.md#single-member-etcd-recovery"))
	}
	c := in.Counts
	if in.Victim != VictimHealthy || c.Healthy != 1 || c.Learners != 0 || c.Serializable {
		return
	}
	if !in.AddsLearners {
		g.Expect(d.WaitMessage).To(ContainSubstring(caprv1.EtcdLearnerJoinsAnnotation))
		return
	}
	if in.ProviderRefusesScaleUpNow == "" && in.SurgeRefused == "" && (in.ProviderRefusesScaleDown == "" || in.SurgeMachines < 2) {
		g.Expect(d.Order).To(Equal(caprv1.ControlPlaneOrderScaleUpFirst), d.WaitMessage)
	}
}

// simCluster is an independent model of an etcd cluster for TestChosenOrdersNeverLoseQuorum: one
// entry per member, and etcd 3.6's own reconfiguration checks written from its source
// (go.etcd.io/etcd/server/v3 etcdserver/server.go mayAddMember, mayPromoteMember, mayRemoveMember;
// etcdserver/util.go numConnectedSince; membership/cluster.go IsReadyTo*, ValidateConfigurationChange).
// It does not use package quorum: the oracle must not be the code under test.
type simCluster []simMember

type simMember struct {
	name  string
	voter bool
	// up is a running member connected to the leader; a member that is not up is still "started"
	// (it has a name) in etcd's sense.
	up bool
}

func (s simCluster) voters() (all, up int) {
	for _, m := range s {
		if m.voter {
			all++
			if m.up {
				up++
			}
		}
	}
	return all, up
}

func (s simCluster) learners() int {
	n := 0
	for _, m := range s {
		if !m.voter {
			n++
		}
	}
	return n
}

// hasQuorum: the up voters are a strict majority of the voters.
func (s simCluster) hasQuorum() bool {
	all, up := s.voters()
	return all > 0 && 2*up > all
}

// acceptsAdd is mayAddMember: the leader (itself up) must be connected to a majority of V+1 voters,
// the new one counted as not connected, except in a single-voter cluster; a voting add also needs a
// majority of V+1 started members (all voters here are started). A learner is refused while the
// cluster has --max-learners (default 1) learners already (ValidateConfigurationChange,
// ErrTooManyLearners).
func (s simCluster) acceptsAdd(learner bool) bool {
	if learner && s.learners() >= 1 {
		return false
	}
	all, up := s.voters()
	if all == 1 {
		return true
	}
	return 2*up > all+1
}

// acceptsPromote is IsReadyToPromoteMember: started voters plus the learner are a majority of V+1.
func (s simCluster) acceptsPromote() bool {
	all, _ := s.voters()
	return 2*(all+1) > all+1
}

// acceptsRemove is mayRemoveMember.
func (s simCluster) acceptsRemove(name string) bool {
	all, up := s.voters()
	var victim simMember
	for _, m := range s {
		if m.name == name {
			victim = m
		}
	}
	if !victim.voter {
		return true
	}
	// IsReadyToRemoveVotingMember: the other (started) voters are a majority of themselves: always.
	if !victim.up {
		return true // a member the leader is not connected to is not part of the active quorum
	}
	return 2*(up-1) > all-1 && up-1 >= 1
}

func (s simCluster) without(name string) simCluster {
	var out simCluster
	for _, m := range s {
		if m.name != name {
			out = append(out, m)
		}
	}
	return out
}

func (s simCluster) set(name string, voter, up bool) simCluster {
	out := append(simCluster(nil), s...)
	for i := range out {
		if out[i].name == name {
			out[i].voter, out[i].up = voter, up
		}
	}
	return out
}

// orderCase is one input of TestChosenOrdersNeverLoseQuorum: v voters of which h healthy (the
// others may be dead or running; u of them unreachable), a number of learners (the victim among
// them when it is one), and what the provider would refuse.
type orderCase struct {
	policy                                 caprv1.ControlPlaneOrder
	v, h, u, learners                      int
	proven, serializable                   bool
	victim                                 VictimMember
	addsLearners                           bool
	surge                                  int
	refuseUpNow, refuseDown, refuseUpAfter bool
	refuseSurge                            bool
	waitsForDeletion                       bool
	removedOnDelete                        bool
	victimUnreachable                      bool
}

func (oc orderCase) String() string {
	return fmt.Sprintf("%s V%d H%d U%d L%d proven=%t serializable=%t victim=%s addsLearners=%t surge=%d refuseUpNow=%t refuseDown=%t refuseUpAfter=%t refuseSurge=%t waitsForDeletion=%t removedOnDelete=%t victimUnreachable=%t",
		oc.policy, oc.v, oc.h, oc.u, oc.learners, oc.proven, oc.serializable, oc.victim, oc.addsLearners, oc.surge, oc.refuseUpNow, oc.refuseDown, oc.refuseUpAfter, oc.refuseSurge, oc.waitsForDeletion, oc.removedOnDelete, oc.victimUnreachable)
}

func (oc orderCase) input() OrderInput {
	refuse := func(b bool, why string) string {
		if b {
			return why
		}
		return ""
	}
	return OrderInput{
		Policy: oc.policy, Initialized: true, Victim: oc.victim, AddsLearners: oc.addsLearners,
		Counts: quorum.Counts{Voting: oc.v, Healthy: oc.h, Learners: oc.learners, Unreachable: oc.u,
			QuorumProven: oc.proven, Serializable: oc.serializable},
		ProviderRefusesScaleUpNow:          refuse(oc.refuseUpNow, "preflight"),
		ProviderRefusesScaleDown:           refuse(oc.refuseDown, "another Machine is unhealthy"),
		ProviderRefusesScaleUpAfterRemoval: refuse(oc.refuseUpAfter, "no capacity"),
		SurgeRefused:                       refuse(oc.refuseSurge, "the Cluster topology owns the replicas"),
		SurgeMachines:                      int32(oc.surge),
		SurgeWaitsForDeletion:              refuse(oc.waitsForDeletion, "KCP creates no Machine while another is deleting"),
		MemberRemovedOnDelete:              refuse(oc.removedOnDelete, "KCP's kcp-cleanup hook removes the member"),
		VictimUnreachable:                  oc.victimUnreachable,
	}
}

// TestChosenOrdersNeverLoseQuorum runs every order ChooseOrder allows through the simulated cluster,
// for every cluster up to 7 voters: victim healthy, unhealthy, missing or a learner; learners
// pending; the provider adding learners or voters, its surge creating one Machine or two, refusing to
// scale up now, to scale down, or to scale up after the removal; both policies; quorum proven by a
// linearizable read, counts without proof, or a node-local (serializable) view; members unreachable.
// A voting member that is not healthy may be dead or running: the order runs in every such world
// (those where fewer than a majority run are ruled out by a proof of quorum), and every membership
// change must be accepted by etcd's own checks, every provider action must be one the provider
// accepts, and quorum must hold after each change. ChooseOrder must never say quorum is lost when
// it is proven, and never act on a node-local view. Under the Auto policy the chosen order must also
// be the best of the orders that run in every world (bestOrderProblem): the highest failure margin,
// then the fewest Machines created.
func TestChosenOrdersNeverLoseQuorum(t *testing.T) {
	const shown = 20
	cases, failures := 0, 0
	chosen := map[caprv1.ControlPlaneOrder]int{}
	for _, policy := range []caprv1.ControlPlaneOrder{caprv1.ControlPlaneOrderAuto, caprv1.ControlPlaneOrderRemoveMemberFirst} {
		for v := 1; v <= 7; v++ {
			for h := 0; h <= v; h++ {
				for u := 0; u <= v-h; u++ {
					for _, flags := range [][2]bool{{false, false}, {true, false}, {false, true}} {
						for _, victim := range []VictimMember{VictimHealthy, VictimUnhealthy, VictimMissing, VictimLearner} {
							for learners := 0; learners <= 2; learners++ {
								if victim == VictimHealthy && h == 0 || victim == VictimUnhealthy && h == v || victim == VictimLearner && learners == 0 {
									continue
								}
								for bits := range 1 << 9 {
									oc := orderCase{policy: policy, v: v, h: h, u: u, learners: learners, proven: flags[0], serializable: flags[1],
										victim: victim, addsLearners: bits&1 != 0, surge: 1 + bits>>1&1,
										refuseUpNow: bits&4 != 0, refuseDown: bits&8 != 0, refuseUpAfter: bits&16 != 0, refuseSurge: bits&32 != 0, waitsForDeletion: bits&64 != 0,
										removedOnDelete: bits&128 != 0, victimUnreachable: bits&256 != 0}
									if oc.victimUnreachable && victim == VictimMissing {
										continue // only a listed member is reached or not
									}
									cases++
									chosen[ChooseOrder(oc.input()).Order]++
									if msg := checkChosenOrder(oc); msg != "" {
										failures++
										if failures <= shown {
											t.Errorf("%s: %s", oc, msg)
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
	if failures > shown {
		t.Errorf("... and %d more failing cases", failures-shown)
	}
	t.Logf("%d cases, %d failing; orders chosen: %v", cases, failures, chosen)
	for _, order := range []caprv1.ControlPlaneOrder{caprv1.ControlPlaneOrderScaleUpFirst, caprv1.ControlPlaneOrderRemoveMemberFirst,
		caprv1.ControlPlaneOrderDeleteFirst, caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval} {
		if chosen[order] == 0 {
			t.Errorf("order %s never chosen: the simulation never ran it", order)
		}
	}
}

// checkChosenOrder says what is wrong with the order chosen for oc ("" when nothing is).
func checkChosenOrder(oc orderCase) string {
	d := ChooseOrder(oc.input())
	if oc.v == 1 {
		if msg := singleMemberProblem(oc, d); msg != "" {
			return msg
		}
	}
	switch {
	case oc.proven && d.WaitReason == caprv1.MachineRemediationQuorumLostReason:
		return "quorum said lost while proven: " + d.WaitMessage
	case d.WaitReason != "" && d.WaitMessage == "":
		return "a wait without a message"
	case d.WaitReason != "":
		return ""
	case oc.serializable:
		return fmt.Sprintf("order %s chosen on a node-local view", d.Order)
	}
	// The members: m0..m(h-1) healthy voters; the other voters unknown (up or not per world); the
	// learners l0...; the victim m0 when healthy, the last voter when unhealthy, l0 when a learner.
	victimName := ""
	switch oc.victim {
	case VictimHealthy:
		victimName = "m0"
	case VictimUnhealthy:
		victimName = fmt.Sprintf("m%d", oc.v-1)
	case VictimLearner:
		victimName = "l0"
	}
	if msg := runInEveryWorld(oc, d.Order, victimName); msg != "" {
		return msg
	}
	if oc.policy == caprv1.ControlPlaneOrderAuto {
		return bestOrderProblem(oc, d.Order, victimName)
	}
	return ""
}

// worlds returns every cluster oc's counts allow: m0..m(h-1) healthy voters, the other voters up or
// down (the first world has them all down: what the counts say), the learners l0...; worlds where
// fewer than a majority run are left out when a linearizable read proved quorum.
func worlds(oc orderCase) []simCluster {
	var out []simCluster
	unknown := oc.v - oc.h
	for world := range 1 << unknown {
		s := make(simCluster, 0, oc.v+oc.learners)
		for i := range oc.v {
			s = append(s, simMember{name: fmt.Sprintf("m%d", i), voter: true, up: i < oc.h || world&(1<<(i-oc.h)) != 0})
		}
		for i := range oc.learners {
			s = append(s, simMember{name: fmt.Sprintf("l%d", i), up: true})
		}
		if oc.proven && !s.hasQuorum() {
			continue // etcd could not have answered the linearizable read
		}
		out = append(out, s)
	}
	return out
}

// runInEveryWorld runs order in every world of oc ("" when it runs in all of them).
func runInEveryWorld(oc orderCase, order caprv1.ControlPlaneOrder, victimName string) string {
	for _, s := range worlds(oc) {
		if msg, _ := runOrder(oc, order, s, victimName); msg != "" {
			return fmt.Sprintf("order %s, world %s: %s", order, s.String(), msg)
		}
	}
	return ""
}

// simValue is what an order costs in the world the counts describe (every member not counted
// healthy down): its lowest failure margin (up voters minus a majority of the voters) while it waits
// for something (the start, each Machine's provisioning, each change done), its lowest margin at all
// (also while a voter was added and has not started), and the Machines it has the provider create.
type simValue struct {
	settled, transient, machines int
	// afterDeletion is 1 when the replacement is provisioned only after the victim's deletion
	// (DeleteFirst; RemoveMemberFirst with a provider that creates no Machine while one is deleting),
	// 0 when meanwhile: the order restores full strength later by the deletion's time.
	afterDeletion int
	// replicasChanges counts the writes to the replicas (a surge raises them and returns them).
	replicasChanges int
}

// better reports whether v is better than w: a higher settled margin, then a higher transient one,
// then fewer Machines, then a replacement provisioned during the victim's deletion rather than after,
// then fewer replicas changes.
func (v simValue) better(w simValue) bool {
	if v.settled != w.settled {
		return v.settled > w.settled
	}
	if v.transient != w.transient {
		return v.transient > w.transient
	}
	if v.machines != w.machines {
		return v.machines < w.machines
	}
	if v.afterDeletion != w.afterDeletion {
		return v.afterDeletion < w.afterDeletion
	}
	return v.replicasChanges < w.replicasChanges
}

// bestOrderProblem says what is wrong when ChooseOrder's order under the Auto policy is not the best
// of the orders that run in every world of oc (keep the margin first, then create
// the fewest Machines, then provision the replacement while the victim is deleted rather than after,
// which RemoveMemberFirst does unless the provider creates no Machine while one is deleting, then
// change the replicas least). Orders of equal value are equally good.
func bestOrderProblem(oc orderCase, chosen caprv1.ControlPlaneOrder, victimName string) string {
	value := func(order caprv1.ControlPlaneOrder) (simValue, bool) {
		if runInEveryWorld(oc, order, victimName) != "" {
			return simValue{}, false
		}
		_, v := runOrder(oc, order, worlds(oc)[0], victimName)
		return v, true
	}
	got, _ := value(chosen)
	for _, other := range []caprv1.ControlPlaneOrder{caprv1.ControlPlaneOrderScaleUpFirst, caprv1.ControlPlaneOrderRemoveMemberFirst, caprv1.ControlPlaneOrderDeleteFirst, caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval} {
		if v, ok := value(other); ok && v.better(got) {
			return fmt.Sprintf("order %s %+v chosen, but %s %+v is better", chosen, got, other, v)
		}
	}
	return ""
}

// singleMemberProblem is singleMemberExpectations for the exhaustive test.
func singleMemberProblem(oc orderCase, d OrderDecision) string {
	g := NewGomega(func(message string, _ ...int) { panic(message) })
	var msg string
	func() {
		defer func() {
			if r := recover(); r != nil {
				msg = fmt.Sprint(r)
			}
		}()
		singleMemberExpectations(g, oc.input(), d)
	}()
	return msg
}

func (s simCluster) String() string {
	parts := make([]string, 0, len(s))
	for _, m := range s {
		state := "down"
		if m.up {
			state = "up"
		}
		if !m.voter {
			state += ",learner"
		}
		parts = append(parts, m.name+"("+state+")")
	}
	return strings.Join(parts, " ")
}

// runOrder applies an order's membership changes and provider actions to s: ScaleUpFirst adds the
// surge then removes the victim, RemoveMemberFirst removes then adds the surge, DeleteFirst removes
// the victim and the provider adds one replacement (no surge); after a surge of two Machines the
// provider scales the surplus one down again, which it may refuse, and its member leaves etcd (with
// one, CAPR deletes the victim itself and the provider has nothing to remove). It returns what went
// wrong ("" when nothing did) and the order's value in s.
func runOrder(oc orderCase, order caprv1.ControlPlaneOrder, s simCluster, victimName string) (string, simValue) {
	if !s.hasQuorum() {
		return "an order was chosen without quorum", simValue{}
	}
	_, upBefore := s.voters()
	var err string
	margin := func() int {
		all, up := s.voters()
		return up - (all/2 + 1)
	}
	value := simValue{settled: margin(), transient: margin()}
	settled := func() {
		value.settled = min(value.settled, margin())
		value.transient = min(value.transient, margin())
	}
	// With one voter, the up voters never drop below what they were before the fault.
	keepVoters := func(what string) {
		if _, up := s.voters(); err == "" && oc.v == 1 && up < upBefore {
			err = fmt.Sprintf("%d up voters after %s, %d before", up, what, upBefore)
		}
	}
	add := func(name string, afterRemoval bool) {
		switch {
		case err != "":
			return
		case !afterRemoval && oc.refuseUpNow:
			err = "the provider refuses to scale up now"
			return
		case afterRemoval && oc.refuseUpAfter:
			err = "the provider refuses to scale up after the removal"
			return
		case !s.acceptsAdd(oc.addsLearners):
			err = "etcd refuses adding " + name
			return
		}
		value.machines++
		s = append(s, simMember{name: name, voter: !oc.addsLearners})
		value.transient = min(value.transient, margin())
		if !s.hasQuorum() {
			err = "quorum lost while " + name + " joins"
			return
		}
		s = s.set(name, !oc.addsLearners, true)
		if oc.addsLearners {
			if !s.acceptsPromote() {
				err = "etcd refuses promoting " + name
				return
			}
			s = s.set(name, true, true)
		}
		if !s.hasQuorum() {
			err = "quorum lost after " + name + " joined"
		}
		settled()
		keepVoters("adding " + name)
	}
	remove := func(name string) {
		if err != "" || name == "" {
			return
		}
		if !s.acceptsRemove(name) {
			err = "etcd refuses removing " + name
			return
		}
		s = s.without(name)
		if !s.hasQuorum() {
			err = "quorum lost by removing " + name
		}
		settled()
		keepVoters("removing " + name)
	}
	scaleDown := func() {
		if err != "" || oc.surge < 2 {
			return
		}
		if oc.refuseDown {
			err = "the provider refuses to scale the surplus Machine down"
			return
		}
		remove("new2")
	}
	surge := func(afterRemoval bool) {
		if err == "" && oc.refuseSurge {
			err = "CAPR may not raise the replicas"
			return
		}
		add("new1", afterRemoval)
		if oc.surge == 2 {
			add("new2", afterRemoval)
		}
	}
	switch order {
	case caprv1.ControlPlaneOrderScaleUpFirst:
		surge(false)
		remove(victimName)
		scaleDown()
		value.replicasChanges = 2
	case caprv1.ControlPlaneOrderRemoveMemberFirst:
		remove(victimName)
		surge(true)
		scaleDown()
		value.replicasChanges = 2
		if oc.waitsForDeletion {
			value.afterDeletion = 1
		}
	case caprv1.ControlPlaneOrderDeleteFirst:
		remove(victimName)
		add("new1", true)
		value.afterDeletion = 1
	case caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval:
		// The provider's deletion removes the member before the Machine is gone, and creates the
		// replacement only after; a provider whose deletion removes none would leave a dead member
		// listed while it adds the replacement's.
		if !oc.removedOnDelete {
			return "the provider's deletion does not remove the member", value
		}
		// KCP's hook asks the leader to hand leadership over before it removes a member, through the
		// leader's own node; for a leader it cannot reach it retries for ever (CAPI #8465). A
		// healthy voter may lead, or come to lead before the hook runs.
		if oc.victimUnreachable && oc.victim == VictimHealthy {
			return "the provider's deletion must reach the victim's member through its node, which does not answer", value
		}
		remove(victimName)
		add("new1", true)
		value.afterDeletion = 1
	default:
		return fmt.Sprintf("unexpected order %q", order), value
	}
	return err, value
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
		{Name: "asked", Requested: true, Member: VictimHealthy, Created: t0.Add(-time.Hour)},
		{Name: "dead", Member: VictimUnhealthy, Created: t0},
	})).To(Equal("dead"), "a dead member goes before an explicit request for a healthy one")
	g.Expect(FirstCandidate([]Candidate{
		{Name: "old", Member: VictimHealthy, Created: t0.Add(-time.Hour)},
		{Name: "asked", Requested: true, Member: VictimHealthy, Created: t0},
	})).To(Equal("asked"), "among equally broken, explicit requests first")
	g.Expect(FirstCandidate([]Candidate{
		{Name: "b", Member: VictimMissing, Created: t0},
		{Name: "a", Member: VictimUnhealthy, Created: t0},
	})).To(Equal("a"))
}

func TestYieldTo(t *testing.T) {
	t0 := time.Now()
	healthy := Candidate{Name: "running", Member: VictimHealthy, Created: t0.Add(-time.Hour)}
	tests := []struct {
		name    string
		running Candidate
		waiting []Candidate
		want    string
	}{
		{name: "nobody waits", running: healthy},
		{name: "only healthy victims wait", running: healthy,
			waiting: []Candidate{{Name: "h", Member: VictimHealthy, Requested: true, Created: t0}}},
		{name: "a dead member waits", running: healthy,
			waiting: []Candidate{{Name: "h", Member: VictimHealthy, Created: t0}, {Name: "dead", Member: VictimUnhealthy, Created: t0}},
			want:    "dead"},
		{name: "a missing member waits", running: healthy,
			waiting: []Candidate{{Name: "gone", Member: VictimMissing, Created: t0}}, want: "gone"},
		{name: "a learner waits", running: healthy,
			waiting: []Candidate{{Name: "learner", Member: VictimLearner, Created: t0}}, want: "learner"},
		{name: "several broken: the explicit request, then the oldest", running: healthy,
			waiting: []Candidate{
				{Name: "dead-new", Member: VictimUnhealthy, Created: t0},
				{Name: "dead-old", Member: VictimUnhealthy, Created: t0.Add(-time.Minute)},
				{Name: "dead-asked", Member: VictimUnhealthy, Requested: true, Created: t0.Add(time.Minute)},
			},
			want: "dead-asked"},
		{name: "the running victim is itself down: it keeps going",
			running: Candidate{Name: "running", Member: VictimUnhealthy},
			waiting: []Candidate{{Name: "dead", Member: VictimUnhealthy, Created: t0}}},
		{name: "the running victim's member is already gone: it keeps going",
			running: Candidate{Name: "running", Member: VictimMissing},
			waiting: []Candidate{{Name: "dead", Member: VictimUnhealthy, Created: t0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(YieldTo(tt.running, tt.waiting)).To(Equal(tt.want))
		})
	}
}

// Every route to a deletion without a surge, for a live member on KCP: the provider's deletion
// removes a member it can reach, and CAPR removes one it cannot (KCP's hook would have to move
// leadership through the victim's node, CAPI #8465).
func TestUnreachableMemberIsNeverLeftToTheProvidersDeletion(t *testing.T) {
	routes := map[string]func(*OrderInput){
		"policy RemoveMemberFirst": func(in *OrderInput) { in.Policy = caprv1.ControlPlaneOrderRemoveMemberFirst },
		"the Cluster topology owns replicas": func(in *OrderInput) {
			in.Policy, in.SurgeRefused = caprv1.ControlPlaneOrderRemoveMemberFirst, "the Cluster topology owns the replicas"
		},
		"a surge of two Machines": func(in *OrderInput) { in.Policy, in.SurgeMachines = caprv1.ControlPlaneOrderRemoveMemberFirst, 2 },
	}
	for name, route := range routes {
		for _, unreachable := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, unreachable=%t", name, unreachable), func(t *testing.T) {
				g := NewWithT(t)
				in := OrderInput{Policy: caprv1.ControlPlaneOrderAuto, Initialized: true, Victim: VictimHealthy,
					Counts:                quorum.Counts{Voting: 3, Healthy: 3, QuorumProven: true},
					MemberRemovedOnDelete: "KCP's kcp-cleanup hook removes the member", VictimUnreachable: unreachable,
					SurgeWaitsForDeletion: "KCP creates no Machine while another is deleting"}
				route(&in)
				d := ChooseOrder(in)
				g.Expect(d.WaitReason).To(BeEmpty(), d.WaitMessage)
				if unreachable {
					g.Expect(d.Order).To(Equal(caprv1.ControlPlaneOrderDeleteFirst))
					g.Expect(d.Reason).To(ContainSubstring("cannot be reached"))
				} else {
					g.Expect(d.Order).To(Equal(caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval))
				}
			})
		}
	}
}
