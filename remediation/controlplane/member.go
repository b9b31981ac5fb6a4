package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

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
	victim := state.ByName(s.victimNode())
	if victim == nil && s.mr.Status.ControlPlane.MemberID != "" {
		if id, perr := strconv.ParseUint(s.mr.Status.ControlPlane.MemberID, 16, 64); perr == nil {
			victim = state.ByID(id)
		}
	}
	if victim == nil {
		c := state.Counts()
		return stepResult{StepResult: remediation.StepResult{Done: true, Message: fmt.Sprintf("the victim's member is not in the member list (%d voting, %d healthy)", c.Voting, c.Healthy)}}, nil
	}
	s.mr.Status.ControlPlane.MemberID = fmt.Sprintf("%x", victim.ID)
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
		// e.g. "unhealthy cluster": etcd refuses reconfiguration until every voter has been connected
		// for a few seconds after the previous change. Retried on the next reconcile.
		return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("etcd refused the removal for now: %v", err), Requeue: waitShort}}, nil
	}
	return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("removing member %s (%x) through %v", victim.Name, victim.ID, via), Requeue: 200 * time.Millisecond}}, nil
}
