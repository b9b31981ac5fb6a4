package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/remediation"
)

func (r *Reconciler) stepMoveLeader(ctx context.Context, s *scope, rec *caprv1.RemediationStep) (stepResult, error) {
	state, wait := r.etcdOrWait(ctx, s)
	if wait != nil {
		return *wait, nil
	}
	victim := state.ByName(s.victimNode())
	switch {
	case victim == nil:
		return stepResult{StepResult: remediation.StepResult{Done: true, Skipped: true, Message: "the victim's etcd member is not in the member list"}}, nil
	case state.LeaderID != victim.ID:
		leader := state.ByID(state.LeaderID)
		name := "none"
		if leader != nil {
			name = leader.Name
		}
		if strings.HasPrefix(rec.Message, movingLeadership) {
			return stepResult{StepResult: remediation.StepResult{Done: true, Message: fmt.Sprintf("leadership moved, the leader is now %s", name)}}, nil
		}
		return stepResult{StepResult: remediation.StepResult{Done: true, Skipped: true, Message: fmt.Sprintf("the leader is %s, not the victim", name)}}, nil
	case !victim.Reachable && s.mr.Status.ControlPlane.Order == caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval:
		// The provider's deletion removes the member, and KCP's hook first asks the leader to hand
		// over, through the leader's node: it would retry for ever (CAPI #8465, #12711). The order was
		// chosen while the node answered (deleteFirst never hands an unreachable member to the
		// provider); nothing is changed yet, so the step waits for the node, within its timeout, after
		// which the remediation fails undone and the next one removes the member itself (DeleteFirst).
		return stepResult{StepResult: remediation.StepResult{WaitReason: caprv1.MachineRemediationEtcdUnreachableReason, Requeue: waitLong, Message: fmt.Sprintf(
			"the victim's member leads but its node %s stopped answering since the order was chosen; the provider's deletion would have to move leadership through it, so nothing is done until it answers again", victim.Name)}}, nil
	case !victim.Reachable:
		// The case that stalls KCP (#8465, #12711): MoveLeader must be sent to the leader, which
		// cannot be reached. Removing it from another member is safe: etcd steps the leader down once
		// the configuration change commits.
		return stepResult{StepResult: remediation.StepResult{Done: true, Skipped: true, Message: "the victim's member leads but its node cannot be reached; it is removed from another member and etcd steps the leader down"}}, nil
	}
	target := leadershipTarget(state, s)
	if target == nil {
		return stepResult{StepResult: remediation.StepResult{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, Message: "no healthy voting member to move leadership to", Requeue: waitShort}, notQuorumSafe: true}, nil
	}
	if err := s.etcd.MoveLeader(ctx, victim.Name, target.ID); err != nil {
		return stepResult{}, err
	}
	return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("%s from %s to %s", movingLeadership, victim.Name, target.Name), Requeue: 200 * time.Millisecond}}, nil
}

const movingLeadership = "moving leadership"

// leadershipTarget prefers the replacement's member, then any other healthy voter.
func leadershipTarget(state *etcdutil.State, s *scope) *etcdutil.MemberStatus {
	if name := s.mr.Status.ControlPlane.Replacement; name != "" {
		for _, m := range s.machines {
			if m.Name == name {
				if member := state.ByName(m.Status.NodeRef.Name); member != nil && member.Healthy && !member.IsLearner {
					return member
				}
			}
		}
	}
	for i := range state.Members {
		m := &state.Members[i]
		if m.Name != s.victimNode() && m.Healthy && !m.IsLearner {
			return m
		}
	}
	return nil
}

func (r *Reconciler) stepRemoveMember(ctx context.Context, s *scope) (stepResult, error) {
	state, wait := r.etcdOrWait(ctx, s)
	if wait != nil {
		return *wait, nil
	}
	victim := victimMemberOf(s, state)
	if victim == nil {
		c := state.Counts()
		return stepResult{StepResult: remediation.StepResult{Done: true, Message: fmt.Sprintf("the victim's member is not in the member list (%d voting, %d healthy)", c.Voting, c.Healthy)}}, nil
	}
	if s.mr.Status.ControlPlane.MemberID == "" {
		// Recorded once, never overwritten: from here on only this ID is the victim's (victimMemberOf).
		s.mr.Status.ControlPlane.MemberID = fmt.Sprintf("%x", victim.ID)
	}
	c := state.Counts()
	if !etcdutil.CanRemoveMember(c, etcdutil.Victim{Healthy: victim.Up(), Learner: victim.IsLearner}) {
		return stepResult{StepResult: remediation.StepResult{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, Requeue: waitShort, Message: fmt.Sprintf(
			"removing the member now is not quorum-safe (%d/%d voting members healthy, %d learners, victim %s)",
			c.Healthy, c.Voting, c.Learners, map[bool]string{true: "healthy", false: "unhealthy"}[victim.Up()])}, notQuorumSafe: true}, nil
	}
	var via []string
	for _, m := range state.Members {
		if m.ID != victim.ID && m.Healthy && !m.IsLearner {
			via = append(via, m.Name)
		}
	}
	if err := s.etcd.RemoveMember(ctx, victim.ID, via); err != nil {
		// e.g. "unhealthy cluster" from every member asked (Cluster.RemoveMember asks the others when
		// one refuses): etcd counts the voters each has been connected to for 5 s, a moment no watch
		// reports.
		return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("etcd refused the removal for now: %v", err), Requeue: pollUnwatched}}, nil
	}
	return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("removing member %s (%x) through %v", victim.Name, victim.ID, via), Requeue: 200 * time.Millisecond}}, nil
}

// removeWaitingDownMembers removes, once the victim's own member is gone, the members of the other
// Machines of the cluster whose remediation waits for this one and whose member is down
// (downMembersOfWaiting), and says so on both requests. runSteps calls it after every step of a pass
// that read etcd (RemoveMember's last pass, WaitForReplacement's): a request marked after this one
// removed its victim's member is found at the next such pass. The removed members are taken out of
// the pass's etcd state, which later steps of the same pass act on. Removing a member that does not vote never
// lowers the failure margin (V shrinks, H stays: quorum.CanRemoveMember decides each removal, as for
// the victim's), and the waiting request would remove it first thing at its own start (an unhealthy
// member is removed before anything else). Doing it now, under this remediation's lock, raises the
// margin a whole remediation earlier (two of five members dead: from 0 to 1 within a second of the
// first removal instead of after the first replacement votes), and KCP's next look sees that
// Machine's member gone (EtcdMemberHealthy False) instead of trying to reach a listed member first
// and waiting for its dial timeout (controlplane/kubeadm/pkg getNodeNamesSortedByLastKnownEtcdHealth;
// docs/design/kcp-comparison.md). It is best effort: a removal etcd refuses is left to the waiting
// request, and this remediation goes on.
func (r *Reconciler) removeWaitingDownMembers(ctx context.Context, s *scope) (string, error) {
	state := s.etcdState
	if state == nil || victimMemberOf(s, state) != nil { // etcd not read in this pass (or unreadable), or the victim first
		return "", nil
	}
	list := &caprv1.MachineRemediationList{}
	if err := r.Client.List(ctx, list, client.InNamespace(s.mr.Namespace)); err != nil {
		return "", fmt.Errorf("listing MachineRemediations: %w", err)
	}
	removed := r.removeDownMembers(ctx, s, state, downMembersOfWaiting(state, s.mr.Name, list.Items, s.machines, now()))
	if len(removed) == 0 {
		return "", nil
	}
	r.event(s.mr, corev1.EventTypeNormal, EventDownMemberRemoved, "removed the down etcd members of waiting remediations too: "+strings.Join(removed, ", "))
	return "removed the down members of waiting remediations too: " + strings.Join(removed, ", "), nil
}

// removeDownMembers removes the members chosen, one at a time through the healthy voters, and takes
// each out of state; it stops at the first removal etcd refuses (its member and those after it are
// left as they are). It says so on the waiting request of each (when it has one) and returns what it
// removed, for the holder's event and message.
func (r *Reconciler) removeDownMembers(ctx context.Context, s *scope, state *etcdutil.State, members []waitingDownMember) []string {
	var removed []string
	for _, w := range members {
		var via []string
		for _, m := range state.Members {
			if m.Healthy && !m.IsLearner {
				via = append(via, m.Name)
			}
		}
		if err := s.etcd.RemoveMember(ctx, w.member.ID, via); err != nil {
			ctrl.LoggerFrom(ctx).Info("Leaving a down etcd member: etcd refused its removal",
				"Machine", klog.KObj(w.machine), "member", w.member.Name, "error", err.Error())
			break
		}
		state.Members = slices.DeleteFunc(state.Members, func(m etcdutil.MemberStatus) bool { return m.ID == w.member.ID })
		ctrl.LoggerFrom(ctx).Info("Removed the down etcd member of another Machine", "Machine", klog.KObj(w.machine), "member", w.member.Name)
		if w.request == nil {
			removed = append(removed, fmt.Sprintf("%s (%x) of Machine %s", w.member.Name, w.member.ID, w.machine.Name))
			continue
		}
		removed = append(removed, fmt.Sprintf("%s (%x) of waiting %s", w.member.Name, w.member.ID, w.request.Name))
		r.event(w.request, corev1.EventTypeNormal, EventDownMemberRemoved, fmt.Sprintf(
			"etcd member %s (%x) of Machine %s is down and was removed by the remediation of %s, which holds the control plane: a member that does not vote is removed without lowering the failure margin, and this request would have removed it first at its start",
			w.member.Name, w.member.ID, w.machine.Name, s.mr.Name))
	}
	return removed
}

// waitingDownMember is a down member removeDownMembers removes, with its Machine and the request
// that waits for it (nil when none does).
type waitingDownMember struct {
	machine *clusterv1.Machine
	request *caprv1.MachineRemediation
	member  etcdutil.MemberStatus
}

// downMembersOfWaiting chooses the members removeWaitingDownMembers removes for the running
// remediation holder: those of the other requests that wait to start (Pending, not being deleted,
// not paused, not held back by their retry limits or period) and were made for the etcd member
// (mayRemoveEarly), whose Machine may be remediated (has
// its Node, is not deleting, carries neither skip-remediation nor paused), and whose member is a
// voter that is down (not Up: it neither answers nor is proven to lead, etcdutil.MemberStatus.Up)
// and not the leader, each only while its removal is quorum-safe on the counts the removals before
// it leave. In the order of the requests' names.
func downMembersOfWaiting(state *etcdutil.State, holder string, requests []caprv1.MachineRemediation, machines []*clusterv1.Machine, at time.Time) []waitingDownMember {
	if state == nil {
		return nil
	}
	byName := map[string]*clusterv1.Machine{}
	for _, m := range machines {
		byName[m.Name] = m
	}
	sorted := make([]*caprv1.MachineRemediation, 0, len(requests))
	for i := range requests {
		sorted = append(sorted, &requests[i])
	}
	slices.SortFunc(sorted, func(a, b *caprv1.MachineRemediation) int { return strings.Compare(a.Name, b.Name) })
	var candidates []waitingDownMember
	for _, mr := range sorted {
		if m, ok := byName[mr.Name]; ok && mr.Name != holder && mayRemoveEarly(mr, m, at) {
			candidates = append(candidates, waitingDownMember{machine: m, request: mr})
		}
	}
	return downVoters(state, candidates)
}

// downMarkedMembers chooses the members of the other Machines, requested or not, that the holder of
// a DeleteBeforeMemberRemoval removes when they keep the provider from removing the victim's
// (releaseQuorumSafeHook): Machines CAPR's health check marks for their etcd member
// (markedForEtcdMember) and that may be remediated (a Node, not deleting, neither skip-remediation
// nor paused), whose member is a down voter (downVoters). A Machine whose request the health check's
// limits hold back is among them: its member votes no more, and the check keeps marking it, so it is
// requested once the limits allow. In the order of the Machines' names.
func downMarkedMembers(state *etcdutil.State, victim string, machines []*clusterv1.Machine) []waitingDownMember {
	var candidates []waitingDownMember
	for _, m := range machines {
		if m.Name != victim && markedForEtcdMember(m) && m.DeletionTimestamp.IsZero() && m.Status.NodeRef.IsDefined() &&
			!annotations.HasSkipRemediation(m) && !annotations.HasPaused(m) {
			candidates = append(candidates, waitingDownMember{machine: m})
		}
	}
	slices.SortFunc(candidates, func(a, b waitingDownMember) int { return strings.Compare(a.machine.Name, b.machine.Name) })
	return downVoters(state, candidates)
}

// downVoters keeps, of the candidates in their order, those whose member is a voter that is down
// (not Up: it neither answers nor is proven to lead, etcdutil.MemberStatus.Up) and not the leader,
// each only while its removal is quorum-safe on the counts the removals before it leave: a member
// that does not vote is removed without lowering the failure margin.
func downVoters(state *etcdutil.State, candidates []waitingDownMember) []waitingDownMember {
	if state == nil {
		return nil
	}
	c := state.Counts()
	var out []waitingDownMember
	for _, w := range candidates {
		member := state.ByName(w.machine.Status.NodeRef.Name)
		if member == nil || member.Name == "" || member.IsLearner || member.Up() || member.ID == state.LeaderID {
			continue
		}
		if !etcdutil.CanRemoveMember(c, etcdutil.Victim{Healthy: false}) {
			continue
		}
		w.member = *member
		out = append(out, w)
		c.Voting--
		if !member.Reachable {
			c.Unreachable--
		}
	}
	return out
}

// mayRemoveEarly says whether a request and its Machine allow their member to be removed before
// the request starts: what its own start would check first (reconcilePending, startPreconditions),
// and that the request is CAPR's health check's for the etcd member (reason UnhealthyEtcdMember)
// and the Machine carries that health check's mark for it (markedForEtcdMember): the removal cannot
// be undone, and a request's spec.reason is whatever its writer (a person, a template) put there.
// That check keeps requesting a Machine whose member is missing, so a request withdrawn after the
// removal (the member answering again before it was removed) is made again and the Machine replaced.
// A request from Node conditions alone (CAPI's MachineHealthCheck, a kubelet down while etcd runs:
// its member unreachable, not proven dead) may be withdrawn when the Node recovers, and nothing would
// ever ask again for the Machine left without its member; such a member stays for the request's own
// start to decide.
func mayRemoveEarly(mr *caprv1.MachineRemediation, m *clusterv1.Machine, at time.Time) bool {
	if mr.Spec.Reason != caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason || !markedForEtcdMember(m) ||
		(mr.Status.Phase != "" && mr.Status.Phase != caprv1.MachineRemediationPhasePending) || !mr.DeletionTimestamp.IsZero() ||
		annotations.HasPaused(mr) || !m.DeletionTimestamp.IsZero() || !m.Status.NodeRef.IsDefined() ||
		annotations.HasSkipRemediation(m) || annotations.HasPaused(m) {
		return false
	}
	retry := CheckRetryLimits(remediationRecord(m), mr.Spec.ControlPlane, at)
	return !retry.GiveUp && retry.WaitUntil.IsZero()
}

// victimMemberOf returns the victim's member in the member list; nil when it is not listed.
//
// Before the point of no return it is found by its name (its Node's) or, when no member carries that
// name, by the ID recorded when it was first seen (a member that never started has no name). From the
// point of no return on (memberIDOnly) only the recorded ID identifies it, and nothing is chosen by
// name: once the victim's deletion has begun its Node name can come back with the replacement
// (bare-metal hosts keep their names, and a replacement may join while CAPR is down), and removing
// the member that carries the name would remove the replacement's. KCP keys its removal on the
// member ID too (cluster-api v1.14.2 controlplane/kubeadm/pkg/workload_cluster_etcd.go,
// RemoveEtcdMember takes an *etcd.Member). etcdutil.Cluster.RemoveMember lists the members again,
// linearizably, right before it removes that ID, and removes nothing when it is no longer listed.
func victimMemberOf(s *scope, state *etcdutil.State) *etcdutil.MemberStatus {
	id, recorded := recordedMemberID(s)
	if memberIDOnly(s) {
		switch {
		case recorded:
			return state.ByID(id)
		case victimDeletionBegun(s):
			return nil // no ID was ever recorded: the member that carries the name may be the replacement's
		}
		// RemoveMember's first pass, before the victim's deletion, for a victim without a member at
		// the start: its Node still exists, so its name is still its own. stepRemoveMember records the
		// ID found here, and from then on only that ID is the victim's.
	}
	if m := state.ByName(s.victimNode()); m != nil {
		return m
	}
	if recorded {
		return state.ByID(id)
	}
	return nil
}

// memberIDOnly is true from the point of no return of the victim's member on: the RemoveMember step
// has begun (the removal may have been issued), or the victim's deletion has begun.
func memberIDOnly(s *scope) bool {
	return findStep(s.mr, caprv1.StepRemoveMember) != nil || victimDeletionBegun(s)
}

// victimDeletionBegun is true once the victim Machine's deletion has begun (the Delete step, the
// provider's scale-down, anyone else's deletion) or it is gone: its Node name may then be reused.
func victimDeletionBegun(s *scope) bool {
	return findStep(s.mr, caprv1.StepDelete) != nil || s.machineGone || s.machine != nil && !s.machine.DeletionTimestamp.IsZero()
}

// recordedMemberID is the victim's member ID recorded in status.controlPlane.memberID.
func recordedMemberID(s *scope) (uint64, bool) {
	if s.mr.Status.ControlPlane == nil || s.mr.Status.ControlPlane.MemberID == "" {
		return 0, false
	}
	id, err := strconv.ParseUint(s.mr.Status.ControlPlane.MemberID, 16, 64)
	return id, err == nil
}

// markedForEtcdMember reports whether one of CAPR's health checks marks the Machine for its etcd
// member: an entry with reason UnhealthyEtcdMember in the mark condition (controllers/machinehealthcheck
// mark.go), which only the health checker writes, on the Machine's status.
func markedForEtcdMember(m *clusterv1.Machine) bool {
	c := conditions.Get(m, caprv1.MachineCAPRHealthCheckSucceededCondition)
	if c == nil || c.Status != metav1.ConditionFalse {
		return false
	}
	entries, err := caprv1.MarkEntriesFromMessage(c.Message)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(entries, func(e caprv1.MarkEntry) bool {
		return e.Reason == caprv1.MachineCAPRHealthCheckUnhealthyEtcdMemberReason
	})
}
