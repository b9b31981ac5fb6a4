package controlplane

import (
	"fmt"
	"sort"
	"strings"
	"time"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil/quorum"
	"github.com/capr-io/capr/remediation/escalation"
)

// This file holds the pure decisions of a control-plane remediation: which order to
// follow, which steps that order has, whether retry limits allow the remediation, and which of several
// waiting remediations goes first. The controller only gathers inputs and applies outputs.

// StepsFor returns the steps of an order, in execution order.
func StepsFor(order caprv1.ControlPlaneOrder) []caprv1.StepName {
	switch order {
	case caprv1.ControlPlaneOrderScaleUpFirst:
		return []caprv1.StepName{caprv1.StepScaleUp, caprv1.StepWaitForReplacement, caprv1.StepMoveLeader, caprv1.StepRemoveMember, caprv1.StepFence, caprv1.StepDelete}
	case caprv1.ControlPlaneOrderRemoveMemberFirst:
		// Once the victim's member is removed its Machine serves nothing (a stacked kube-apiserver
		// reads its local member): it is fenced and deleted while the replacement is provisioned, not
		// after (the deletion after the vote was the last 5-10 s to full strength).
		return []caprv1.StepName{caprv1.StepMoveLeader, caprv1.StepRemoveMember, caprv1.StepScaleUp, caprv1.StepFence, caprv1.StepDelete, caprv1.StepWaitForReplacement}
	case caprv1.ControlPlaneOrderDeleteFirst:
		return []caprv1.StepName{caprv1.StepMoveLeader, caprv1.StepRemoveMember, caprv1.StepFence, caprv1.StepDelete, caprv1.StepWaitForReplacement}
	case caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval:
		// The member votes until the provider's deletion removes it at its pre-terminate point
		// (Adapter.MemberRemovedOnDelete); RemoveMember after the Delete step finds it gone, or removes
		// it should it still be listed.
		return []caprv1.StepName{caprv1.StepMoveLeader, caprv1.StepFence, caprv1.StepDelete, caprv1.StepRemoveMember, caprv1.StepWaitForReplacement}
	case caprv1.ControlPlaneOrderReplace:
		return []caprv1.StepName{caprv1.StepFence, caprv1.StepDelete}
	default:
		return nil
	}
}

// Surges reports whether an order raises the replicas for its replacement (ScaleUpFirst,
// RemoveMemberFirst); the others delete the victim at the replicas the provider has and let it
// create the replacement.
func Surges(order caprv1.ControlPlaneOrder) bool {
	switch order {
	case caprv1.ControlPlaneOrderReplace, caprv1.ControlPlaneOrderDeleteFirst, caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval:
		return false
	}
	return true
}

// StepsWithEtcd returns the steps of an order for an etcd placement: with external etcd the
// control-plane Machines have no members, so MoveLeader and RemoveMember are left out.
func StepsWithEtcd(order caprv1.ControlPlaneOrder, placement caprv1.EtcdPlacement) []caprv1.StepName {
	steps := StepsFor(order)
	if placement != caprv1.EtcdPlacementExternal {
		return steps
	}
	out := make([]caprv1.StepName, 0, len(steps))
	for _, step := range steps {
		if step != caprv1.StepMoveLeader && step != caprv1.StepRemoveMember {
			out = append(out, step)
		}
	}
	return out
}

// PlanSteps returns every step of a running remediation, in execution order: its escalation steps
// (spec.escalation, run before any membership change), then the steps of its order.
func PlanSteps(mr *caprv1.MachineRemediation) []caprv1.StepName {
	steps := escalation.Steps(mr)
	if cp := mr.Status.ControlPlane; cp != nil {
		steps = append(steps, StepsWithEtcd(cp.Order, cp.Etcd)...)
	}
	return steps
}

// StepFinished reports whether a step record is final: succeeded, skipped, or failed (an escalation
// step that timed out; the next step follows).
func StepFinished(rec *caprv1.RemediationStep) bool {
	return rec != nil && (rec.Outcome == caprv1.StepOutcomeSucceeded || rec.Outcome == caprv1.StepOutcomeSkipped || rec.Outcome == caprv1.StepOutcomeFailed)
}

// VictimMember is the state of the victim's etcd member.
type VictimMember int

const (
	// VictimHealthy is a voting member that runs and follows a leader (etcdutil.MemberStatus.Up): only
	// the kubelet or the node is broken, or the member carries an etcd alarm (NOSPACE, CORRUPT), which
	// stops requests but not its vote (OrderInput.VictimProblem says which).
	VictimHealthy VictimMember = iota
	// VictimUnhealthy is a voting member that is down, unreachable and not known alive
	// (etcdutil.MemberStatus.Note), or has no leader.
	VictimUnhealthy
	// VictimMissing means the member is not in the member list.
	VictimMissing
	// VictimLearner means the member is a learner (it never became a voter).
	VictimLearner
)

func (v VictimMember) String() string {
	return [...]string{"healthy", "unhealthy", "missing", "a learner"}[v]
}

// OrderInput is everything the order decision depends on.
type OrderInput struct {
	Policy      caprv1.ControlPlaneOrder
	Initialized bool
	// Counts are the etcd cluster's counts, victim included (etcdutil.State.Counts).
	Counts quorum.Counts
	// Unreachable names the voting members that could not be reached (etcdutil.State.UnreachableNames),
	// for the messages; optional.
	Unreachable []string
	Victim      VictimMember
	// VictimProblem is what is wrong with a VictimHealthy member although it votes (its alarms, e.g.
	// "alarmed (NOSPACE)"), for the messages; "" when it is healthy.
	VictimProblem string
	// AddsLearners is true when the control-plane provider joins new members as learners.
	AddsLearners bool
	// LearnerJoinsProblem says why the control-plane object's EtcdLearnerJoinsAnnotation was not
	// understood (learnerJoins), for the messages; optional.
	LearnerJoinsProblem string
	// ProviderRefusesScaleUpNow is why the provider would not create a replacement now ("" = it would).
	ProviderRefusesScaleUpNow string
	// ProviderRefusesScaleUpAfterRemoval is why it would not once the victim's member is removed.
	ProviderRefusesScaleUpAfterRemoval string
	// ProviderRefusesScaleDown is why the provider would not remove a Machine now other than the
	// victim (e.g. KCP's scale-down preflight while another control-plane Machine is unhealthy). It
	// matters where a surge creates a surplus Machine that the provider must scale down again
	// (SurgeMachines > 1): no surge order is taken then. (With one replacement CAPR deletes the victim
	// itself and the provider has nothing to remove.)
	ProviderRefusesScaleDown string
	// SurgeRefused is why CAPR does not raise the replicas for this victim although the provider
	// would scale up (Adapter.SurgeRefusal: the Cluster topology owns them). No surge order
	// (ScaleUpFirst, RemoveMemberFirst) is taken then; a victim whose member is removed first is
	// deleted first (DeleteFirst), and the provider replaces it at the replicas it has.
	SurgeRefused string
	// SurgeMachines is how many Machines the orders that surge (ScaleUpFirst, RemoveMemberFirst) have
	// the provider create (Adapter.Surge, SurgePlan.Machines; 0 is taken as 1). It is their cost:
	// with more than one, DeleteFirst creates fewer.
	SurgeMachines int32
	// SurgeWaitsForDeletion is why the provider creates no replacement while the victim is deleting
	// (SurgePlan.WaitsForDeletion; "" when it does). RemoveMemberFirst raises the replicas before the
	// victim is fenced and deleted so that the replacement is provisioned meanwhile; such a provider
	// provisions it only after the deletion, as with DeleteFirst, which is then taken instead: the
	// same margin and Machines without two replicas changes.
	SurgeWaitsForDeletion string
	// MemberRemovedOnDelete is how the provider's own deletion removes a Machine's etcd member at its
	// pre-terminate point (Adapter.MemberRemovedOnDelete; "" when it does not). Where DeleteFirst is
	// taken for a victim whose member votes and can be reached (VictimUnreachable),
	// DeleteBeforeMemberRemoval is taken instead: the member keeps voting through the first stages of
	// the deletion, as under KCP's own remediation.
	MemberRemovedOnDelete string
	// VictimUnreachable is true when the victim's member is in the member list but did not answer
	// through its own node (etcdutil.MemberStatus.Reachable false: its kubelet or node is down), even
	// if etcd shows it alive (etcdutil markAlive).
	VictimUnreachable bool
	// ExternalEtcd is true when etcd runs outside the control-plane Machines: Counts, Unreachable,
	// Victim and AddsLearners are then unused, and ServingOthers and VictimServes decide.
	ExternalEtcd bool
	// ServingOthers is how many control-plane Machines other than the victim serve the API
	// (Adapter.ServesAPI), and VictimServes whether the victim does.
	ServingOthers int
	VictimServes  bool
}

// setProvider fills in what the control-plane provider would do, from its adapter.
func (in *OrderInput) setProvider(adapter Adapter, view ProviderView) {
	in.ProviderRefusesScaleUpNow = adapter.ScaleUpRefusal(view, false)
	in.ProviderRefusesScaleUpAfterRemoval = adapter.ScaleUpRefusal(view, true)
	in.ProviderRefusesScaleDown = adapter.ScaleDownRefusal(view)
	in.SurgeRefused = adapter.SurgeRefusal(view)
	surge := adapter.Surge(view.ControlPlane)
	in.SurgeMachines, in.SurgeWaitsForDeletion = surge.Machines, surge.WaitsForDeletion
	in.MemberRemovedOnDelete = adapter.MemberRemovedOnDelete(view.ControlPlane)
}

// OrderDecision is the chosen order, or why none can be taken now.
type OrderDecision struct {
	Order  caprv1.ControlPlaneOrder
	Reason string
	// WaitReason is set (a MachineRemediation condition reason) when the remediation must wait;
	// WaitMessage says why.
	WaitReason  string
	WaitMessage string
}

// ChooseOrder picks the order of a control-plane remediation from real etcd state. First the failure
// margin is kept: a healthy victim's member is removed only after its replacement votes (scale up
// first), unless removing it first keeps a margin (marginWait); a victim whose member is down,
// unreachable, missing or a learner is removed first, which never lowers the margin, while adding a
// voter first would (V+1 needs a larger quorum until the new member runs). Among the orders that keep
// it, the one that creates the fewest Machines and restores full strength soonest, by what the
// provider's surge costs (OrderInput.SurgeMachines): with one Machine, RemoveMemberFirst, whose
// replacement is created before the victim is fenced and deleted and provisioned meanwhile; with two
// (a surplus to scale down again), DeleteFirst, which has the provider create one after the delete. Otherwise wait. Before the control plane is
// initialized there is nothing to keep: replace. With external etcd there is no member to keep either
// (chooseExternalEtcdOrder).
func ChooseOrder(in OrderInput) OrderDecision {
	if in.ExternalEtcd && in.Initialized {
		return chooseExternalEtcdOrder(in)
	}
	if !in.Initialized {
		return OrderDecision{Order: caprv1.ControlPlaneOrderReplace,
			Reason: "the control plane is not initialized yet: the Machine is replaced without scaling up (as KCP does for the first Machine)"}
	}
	c := in.Counts
	if wait, msg := quorumWait(in); wait != "" {
		return OrderDecision{WaitReason: wait, WaitMessage: msg}
	}
	learnerVictim := in.Victim == VictimLearner
	if c.Learners > 0 && (!learnerVictim || c.Learners != 1) {
		return OrderDecision{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason,
			WaitMessage: "an etcd learner is pending promotion; membership changes wait until it is promoted"}
	}
	if d, ok := chooseSingleMemberOrder(in); ok {
		return d
	}

	after := countsAfterRemoval(c, in.Victim)
	how := "as a voting member"
	if in.AddsLearners {
		how = "as a learner"
	}
	machines := in.surgeMachines()
	// Why no order that adds the replacement first can be taken ("" when one can).
	var upFirstWhy string
	switch {
	case in.Policy == caprv1.ControlPlaneOrderRemoveMemberFirst:
		upFirstWhy = "the ordering policy is RemoveMemberFirst"
	case !quorum.CanAddMember(c, in.AddsLearners):
		upFirstWhy = fmt.Sprintf("adding a member %s first is not quorum-safe (%d/%d healthy, %d needed after the add)",
			how, c.Healthy, c.Voting, quorum.Of(c.Voting+1))
	case in.ProviderRefusesScaleUpNow != "":
		upFirstWhy = "the control-plane provider would not scale up now: " + in.ProviderRefusesScaleUpNow
	case in.SurgeRefused != "":
		upFirstWhy = in.SurgeRefused
	case machines > 1 && in.ProviderRefusesScaleDown != "":
		// A surge of two ends with the provider scaling the surplus Machine down again.
		upFirstWhy = fmt.Sprintf("a surge creates %d Machines and the control-plane provider would not scale the surplus one down (%s)", machines, in.ProviderRefusesScaleDown)
	}
	// Why the victim's member cannot be removed first ("" when it can).
	var removeFirstWhy string
	switch {
	case in.Victim != VictimMissing && !quorum.CanRemoveMember(c, quorum.Victim{Healthy: in.Victim == VictimHealthy, Learner: learnerVictim}):
		removeFirstWhy = fmt.Sprintf("removing the %s member of the victim would leave %d of %d voting members healthy", in.Victim, after.Healthy, after.Voting)
	case !quorum.CanAddMember(after, in.AddsLearners):
		removeFirstWhy = "after removing the victim's member the replacement could not be added safely"
	case in.ProviderRefusesScaleUpAfterRemoval != "":
		removeFirstWhy = "after removing the victim's member the control-plane provider would not create a replacement: " + in.ProviderRefusesScaleUpAfterRemoval
	}

	removeOrder := removeFirst("", in).Order
	switch {
	case in.Victim == VictimHealthy && upFirstWhy == "" && removeFirstWhy == "" && in.Policy != caprv1.ControlPlaneOrderRemoveMemberFirst &&
		valueOf(in, removeOrder).better(valueOf(in, caprv1.ControlPlaneOrderScaleUpFirst)):
		// An even number of voters loses no margin with one healthy voter fewer, and learners joining
		// add none while they catch up: where the surge would create two Machines, removing first is
		// as safe and cheaper.
		return removeFirst(fmt.Sprintf("the victim's etcd member %s, but removing it first keeps the failure margin (%d/%d healthy after, adding %s) and the surge would create %d Machines",
			in.victimVotes(), after.Healthy, after.Voting, how, machines), in)
	case in.Victim == VictimHealthy && upFirstWhy == "":
		return OrderDecision{Order: caprv1.ControlPlaneOrderScaleUpFirst, Reason: fmt.Sprintf(
			"the victim's etcd member %s: the replacement joins and votes before it is removed (%d/%d healthy, adding %s is quorum-safe)%s",
			in.victimVotes(), c.Healthy, c.Voting, how, machinesNote(machines))}
	case in.Victim != VictimHealthy && upFirstWhy == "" && removeFirstWhy == "" &&
		valueOf(in, caprv1.ControlPlaneOrderScaleUpFirst).better(valueOf(in, removeOrder)):
		// A victim without a voting member (missing, a learner) loses no margin to a surge either;
		// where the provider would provision the replacement only after the victim's deletion, the
		// surge that comes first is sooner.
		return OrderDecision{Order: caprv1.ControlPlaneOrderScaleUpFirst, Reason: fmt.Sprintf(
			"the victim's etcd member is %s, so adding the replacement first costs no failure margin (%d/%d healthy), and %s: the replacement is created before the victim is deleted%s",
			in.Victim, c.Healthy, c.Voting, in.SurgeWaitsForDeletion, machinesNote(machines))}
	case in.Victim != VictimHealthy && in.Policy != caprv1.ControlPlaneOrderRemoveMemberFirst && removeFirstWhy == "":
		why := fmt.Sprintf("the victim's etcd member is %s, so removing it first costs no failure margin (%d/%d healthy after)", in.Victim, after.Healthy, after.Voting)
		if upFirstWhy != "" {
			why += ", and " + upFirstWhy
		}
		return removeFirst(why, in)
	case upFirstWhy == "":
		return OrderDecision{Order: caprv1.ControlPlaneOrderScaleUpFirst, Reason: fmt.Sprintf(
			"the victim's etcd member is %s and %s, but adding the replacement %s first is quorum-safe (%d/%d healthy)%s",
			in.Victim, removeFirstWhy, how, c.Healthy, c.Voting, machinesNote(machines))}
	case removeFirstWhy != "":
		return OrderDecision{WaitReason: caprv1.MachineRemediationNotQuorumSafeReason, WaitMessage: fmt.Sprintf(
			"cannot proceed safely: %s, and %s", upFirstWhy, removeFirstWhy)}
	}
	if wait := marginWait(in, upFirstWhy); wait != nil {
		return *wait
	}
	member := "is " + in.Victim.String()
	if in.Victim == VictimHealthy {
		member = in.victimVotes()
	}
	return removeFirst(fmt.Sprintf("the victim's etcd member %s and %s: it leaves before the replacement is added (%d/%d healthy after)", member, upFirstWhy, after.Healthy, after.Voting), in)
}

// victimVotes says how the VictimHealthy member of in stands: healthy, or voting although it is
// alarmed (a NOSPACE member is kept until its replacement votes, as a member under a dead kubelet is).
func (in OrderInput) victimVotes() string {
	if in.VictimProblem == "" {
		return "is healthy"
	}
	return "is " + in.VictimProblem + " but still votes (an etcd alarm stops requests, not raft)"
}

// orderValue is what an order keeps and costs, from the counts (a member not counted healthy taken
// as down): its lowest failure margin while it waits (at the start, while a replacement is
// provisioned, after each change), its lowest at all (also while a voter has been added and has not
// started: etcd counts it in the quorum at once), and the Machines it has the provider create.
type orderValue struct {
	settled, transient, machines int
	// afterDeletion is 1 when the replacement is provisioned only once the victim is deleted
	// (DeleteFirst; RemoveMemberFirst when OrderInput.SurgeWaitsForDeletion), which costs the
	// deletion's time before full strength.
	afterDeletion int
	// replicasChanges counts the writes to the replicas (a surge raises them and returns them).
	replicasChanges int
}

// better reports whether v beats w: a higher settled margin, then a higher transient one, then fewer
// Machines, then a replacement provisioned while the victim is deleted rather than after, then fewer
// replicas changes.
func (v orderValue) better(w orderValue) bool {
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

// valueOf is an order's orderValue for in: ScaleUpFirst adds the surge's Machines then removes the
// victim's member, RemoveMemberFirst the other way round, DeleteFirst removes it and adds one; a surge
// of two ends with the surplus Machine's member leaving again.
func valueOf(in OrderInput, order caprv1.ControlPlaneOrder) orderValue {
	voting, healthy := in.Counts.Voting, in.Counts.Healthy
	margin := func() int { return healthy - quorum.Of(voting) }
	v := orderValue{settled: margin(), transient: margin()}
	settle := func() {
		v.settled, v.transient = min(v.settled, margin()), min(v.transient, margin())
	}
	add := func() {
		v.machines++
		voting++
		if !in.AddsLearners {
			v.transient = min(v.transient, margin()) // a learner votes only once promoted
		}
		healthy++
		settle()
	}
	removeVictim := func() {
		switch in.Victim {
		case VictimHealthy:
			voting, healthy = voting-1, healthy-1
		case VictimUnhealthy:
			voting--
		}
		settle()
	}
	surge := func() {
		n := int(in.surgeMachines())
		for range n {
			add()
		}
		if n > 1 {
			voting, healthy = voting-1, healthy-1
			settle()
		}
	}
	switch order {
	case caprv1.ControlPlaneOrderScaleUpFirst:
		surge()
		removeVictim()
		v.replicasChanges = 2
	case caprv1.ControlPlaneOrderRemoveMemberFirst:
		removeVictim()
		surge()
		v.replicasChanges = 2
		if in.SurgeWaitsForDeletion != "" {
			v.afterDeletion = 1
		}
	case caprv1.ControlPlaneOrderDeleteFirst, caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval:
		removeVictim()
		add()
		v.afterDeletion = 1
	}
	return v
}

// surgeMachines is OrderInput.SurgeMachines, 1 when unset.
func (in OrderInput) surgeMachines() int32 { return max(in.SurgeMachines, 1) }

// removeFirst is the order that removes the victim's member first: RemoveMemberFirst, whose
// replacement is created before the victim is fenced and deleted and provisioned meanwhile, when the
// surge creates one Machine; DeleteFirst when it would create more (the provider then creates one, no
// surplus to scale down again; fault → full strength costs the victim's deletion before the
// provisioning instead of a second Machine and its removal), or when no surge may be taken at all
// (OrderInput.SurgeRefused: DeleteFirst changes no replicas), or when the provider would provision the
// replacement only after the victim's deletion anyway (OrderInput.SurgeWaitsForDeletion).
func removeFirst(why string, in OrderInput) OrderDecision {
	switch machines := in.surgeMachines(); {
	case in.SurgeRefused != "":
		if !strings.Contains(why, in.SurgeRefused) {
			why += "; " + in.SurgeRefused
		}
		return deleteFirst(in, why, "the control-plane provider creates the replacement at the replicas it has")
	case machines > 1:
		return deleteFirst(in, fmt.Sprintf("%s; a surge would create %d Machines", why, machines), "the control-plane provider creates the one replacement")
	case in.SurgeWaitsForDeletion != "":
		return deleteFirst(in, why+"; "+in.SurgeWaitsForDeletion, "the control-plane provider creates the replacement at the replicas it has")
	}
	return OrderDecision{Order: caprv1.ControlPlaneOrderRemoveMemberFirst, Reason: why + "; then the replacement is added"}
}

// deleteFirst is the order that deletes the victim without a surge: DeleteFirst, which removes its
// member first, or, for a member that votes where the provider's deletion removes it at its
// pre-terminate point (OrderInput.MemberRemovedOnDelete), DeleteBeforeMemberRemoval: removing it
// earlier would only start the time at the lower failure margin sooner, as the replacement is
// provisioned after the deletion either way (compare-kcp's "etcd member degraded": KCP's own
// remediation removes the member there, docs/design/kcp-comparison.md).
//
// Never for a member that cannot be reached through its node (OrderInput.VictimUnreachable): KCP's
// hook first moves etcd leadership off the member it removes, which it must ask the leader itself
// for, through the leader's node; for an unreachable leader it retries for ever (CAPI #8465, #12711)
// and the deletion never ends. CAPR removes such a member through another member instead (etcd steps a
// removed leader down), which is DeleteFirst.
func deleteFirst(in OrderInput, why, then string) OrderDecision {
	if in.Victim == VictimHealthy && in.MemberRemovedOnDelete != "" && in.VictimUnreachable {
		why += "; its member cannot be reached through its node, and the provider's deletion would have to reach it"
	}
	if in.Victim == VictimHealthy && in.MemberRemovedOnDelete != "" && !in.VictimUnreachable {
		return OrderDecision{Order: caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval, Reason: fmt.Sprintf(
			"%s, so the victim is fenced and deleted while its member still votes: %s, where the member leaves; then %s", why, in.MemberRemovedOnDelete, then)}
	}
	return OrderDecision{Order: caprv1.ControlPlaneOrderDeleteFirst, Reason: fmt.Sprintf("%s, so the victim is deleted after its member and %s", why, then)}
}

// machinesNote says how many Machines a surge order creates when that is not obvious.
func machinesNote(machines int32) string {
	if machines > 1 {
		return fmt.Sprintf("; the surge creates %d Machines", machines)
	}
	return ""
}

// chooseExternalEtcdOrder chooses the order when etcd runs outside the control-plane Machines. No
// etcd member is at stake, so there is no quorum to keep and nothing to remove from etcd; what must
// be kept is a control-plane Machine serving the API, which the replacement joins through (kubeadm
// join reads the cluster's configuration from it). Scale up first (the surge is whatever the provider
// accepts: one, KCP admits any replica count with external etcd); where the provider would not scale
// back down, delete first, which needs another Machine serving while the victim is gone.
func chooseExternalEtcdOrder(in OrderInput) OrderDecision {
	policy := ""
	if in.Policy == caprv1.ControlPlaneOrderRemoveMemberFirst {
		policy = "; the RemoveMemberFirst policy has no member to remove"
	}
	// Why no surge is taken: the provider would not scale back down, or CAPR may not raise the replicas.
	noSurge := ""
	switch {
	case in.ProviderRefusesScaleDown != "":
		noSurge = fmt.Sprintf("the control-plane provider would not scale down (%s)", in.ProviderRefusesScaleDown)
	case in.SurgeRefused != "":
		noSurge = fmt.Sprintf("no surge is taken (%s)", in.SurgeRefused)
	}
	if noSurge == "" {
		switch {
		case in.ServingOthers == 0 && !in.VictimServes:
			return OrderDecision{WaitReason: caprv1.MachineRemediationNoServingControlPlaneReason, WaitMessage: "etcd is external and no control-plane Machine serves the API: a replacement could not join; nothing is done until one does"}
		case in.ProviderRefusesScaleUpNow != "":
			return OrderDecision{WaitReason: caprv1.MachineRemediationWaitingForPreconditionsReason, WaitMessage: "etcd is external; the control-plane provider would not create a replacement now: " + in.ProviderRefusesScaleUpNow}
		}
		return OrderDecision{Order: caprv1.ControlPlaneOrderScaleUpFirst, Reason: fmt.Sprintf(
			"etcd is external, so no etcd member is at stake: the replacement joins (%d other control-plane Machines serve the API) before the victim is fenced and deleted%s",
			in.ServingOthers, policy)}
	}
	switch {
	case in.ServingOthers == 0:
		return OrderDecision{WaitReason: caprv1.MachineRemediationNoServingControlPlaneReason, WaitMessage: fmt.Sprintf(
			"etcd is external, %s, and no other control-plane Machine serves the API: deleting the victim first would leave none", noSurge)}
	case in.ProviderRefusesScaleUpAfterRemoval != "":
		return OrderDecision{WaitReason: caprv1.MachineRemediationWaitingForPreconditionsReason, WaitMessage: fmt.Sprintf(
			"etcd is external; %s, and after the victim is deleted the control-plane provider would not create a replacement: %s", noSurge, in.ProviderRefusesScaleUpAfterRemoval)}
	}
	return OrderDecision{Order: caprv1.ControlPlaneOrderDeleteFirst, Reason: fmt.Sprintf(
		"etcd is external and %s: the victim is fenced and deleted (%d other control-plane Machines serve the API) and the provider creates the replacement without a surge%s",
		noSurge, in.ServingOthers, policy)}
}

// marginWait refuses to remove a healthy member first when that takes the failure margin from one to
// none (quorum.RemovalKeepsMargin), unless a person chose RemoveMemberFirst: the Machine is broken but
// its member votes, so waiting keeps the cluster as safe as it is, while removing it leaves a
// cluster one failure away from losing quorum until the replacement votes.
//
// A member that votes but carries an etcd alarm (OrderInput.VictimProblem) is not waited for: etcd
// already refuses the cluster's requests (NOSPACE its writes, CORRUPT all), so waiting does not keep
// the cluster as it was, and a provider may refuse the surge because of that very member (KCP's
// preflight refuses to scale up while a Machine's EtcdMemberHealthy is False): waiting would never
// end where KCP's own remediation deletes it (compare-kcp, "etcd member degraded").
func marginWait(in OrderInput, notFirst string) *OrderDecision {
	v := quorum.Victim{Healthy: in.Victim == VictimHealthy, Learner: in.Victim == VictimLearner}
	if in.Policy == caprv1.ControlPlaneOrderRemoveMemberFirst || in.VictimProblem != "" || quorum.RemovalKeepsMargin(in.Counts, v) {
		return nil
	}
	after := countsAfterRemoval(in.Counts, in.Victim)
	return &OrderDecision{WaitReason: caprv1.MachineRemediationWouldLoseFailureMarginReason, WaitMessage: fmt.Sprintf(
		"waiting: %s, and the victim's etcd member %s, so removing it first would leave %d of %d voting members healthy, with no failure margin (the next failure would lose quorum); set spec.controlPlane.order to RemoveMemberFirst on this MachineRemediation to accept that",
		notFirst, in.victimVotes(), after.Healthy, after.Voting)}
}

// quorumWait says why nothing may be decided on the counts: quorum lost, or not known. etcd answering a
// linearizable read proves quorum (quorum.Counts.QuorumProven): members that cannot be reached are then
// unknown, not dead, and "quorum lost" or "disaster recovery" is never said; the safety checks below
// count them as unhealthy.
func quorumWait(in OrderInput) (reason, message string) {
	c := in.Counts
	unreachable := fmt.Sprintf("%d voting member(s)", c.Unreachable)
	if len(in.Unreachable) > 0 {
		unreachable = strings.Join(in.Unreachable, ", ")
	}
	switch {
	case c.Serializable:
		// Every member that could be reached answered only from its node-local view: none of them is
		// part of a working quorum. Members that could not be reached may run, but they would have to
		// be partitioned from the reachable ones; nothing is decided on a node-local list.
		return caprv1.MachineRemediationQuorumLostReason, fmt.Sprintf(
			"etcd has lost quorum: no member could serve a linearizable read (%d of %d voting members healthy in one member's local view, %d unreachable and not proven down): nothing is done automatically; if the members are really down, disaster recovery is needed%s",
			c.Healthy, c.Voting, c.Unreachable, singleMemberRecovery(c))
	case quorum.Lost(c):
		return caprv1.MachineRemediationQuorumLostReason, fmt.Sprintf(
			"etcd has lost quorum (%d of %d voting members healthy, %d needed): nothing is done automatically, disaster recovery is needed%s",
			c.Healthy, c.Voting, quorum.Of(c.Voting), singleMemberRecovery(c))
	case c.Healthy < quorum.Of(c.Voting) && c.Unreachable > 0:
		// Quorum is proven but too few members can be seen healthy for any membership change; the
		// checks below would refuse too, this says why.
		return caprv1.MachineRemediationEtcdUnreachableReason, fmt.Sprintf(
			"etcd answered a linearizable read, so quorum exists, but %s cannot be reached (%d of %d voting members seen healthy, %d needed): unreachable members are not proven down, membership changes wait until they can be reached",
			unreachable, c.Healthy, c.Voting, quorum.Of(c.Voting))
	case c.Healthy < quorum.Of(c.Voting):
		return caprv1.MachineRemediationNotQuorumSafeReason, fmt.Sprintf(
			"etcd answered a linearizable read, so quorum exists, but only %d of %d voting members are healthy (%d needed for a membership change)",
			c.Healthy, c.Voting, quorum.Of(c.Voting))
	}
	return "", ""
}

func countsAfterRemoval(c quorum.Counts, v VictimMember) quorum.Counts {
	switch v {
	case VictimHealthy:
		return quorum.Counts{Voting: c.Voting - 1, Healthy: c.Healthy - 1, Learners: c.Learners}
	case VictimUnhealthy:
		return quorum.Counts{Voting: c.Voting - 1, Healthy: c.Healthy, Learners: c.Learners}
	case VictimLearner:
		return quorum.Counts{Voting: c.Voting, Healthy: c.Healthy, Learners: c.Learners - 1}
	default:
		return c
	}
}

// DefaultMinHealthyPeriod is KCP's default minHealthyPeriodSeconds.
const DefaultMinHealthyPeriod = time.Hour

// RetryDecision is the outcome of the retry limits.
type RetryDecision struct {
	Allowed    bool
	RetryCount int32
	// WaitUntil is set when retryPeriodSeconds has not passed yet.
	WaitUntil time.Time
	// GiveUp is true when maxRetry is reached: a person must act.
	GiveUp  bool
	Message string
}

// CheckRetryLimits applies maxRetry, retryPeriodSeconds and minHealthyPeriodSeconds with KCP's meaning.
// record is the victim's remediation-for annotation (nil when it is not a replacement).
func CheckRetryLimits(record *caprv1.RemediationRecord, spec *caprv1.ControlPlaneRemediationSpec, now time.Time) RetryDecision {
	if record == nil {
		return RetryDecision{Allowed: true}
	}
	if spec == nil {
		spec = &caprv1.ControlPlaneRemediationSpec{}
	}
	minHealthy := DefaultMinHealthyPeriod
	if spec.MinHealthyPeriodSeconds != nil {
		minHealthy = time.Duration(*spec.MinHealthyPeriodSeconds) * time.Second
	}
	var retryPeriod time.Duration
	if spec.RetryPeriodSeconds != nil {
		retryPeriod = time.Duration(*spec.RetryPeriodSeconds) * time.Second
	}
	last := record.Timestamp.Time
	if last.IsZero() {
		// An unreadable timestamp is treated as long ago: a new sequence, as KCP does.
		last = now.Add(-2 * max(minHealthy, retryPeriod))
	}
	if !last.Add(minHealthy).After(now) {
		return RetryDecision{Allowed: true}
	}
	if last.Add(retryPeriod).After(now) {
		return RetryDecision{WaitUntil: last.Add(retryPeriod), RetryCount: record.RetryCount, Message: fmt.Sprintf(
			"the Machine replaced %s less than retryPeriodSeconds (%s) ago; waiting until %s",
			record.Machine, retryPeriod, last.Add(retryPeriod).UTC().Format(time.RFC3339))}
	}
	if spec.MaxRetry != nil && record.RetryCount >= *spec.MaxRetry {
		return RetryDecision{GiveUp: true, RetryCount: record.RetryCount, Message: fmt.Sprintf(
			"this Machine replaced %s and remediation already failed %d times in a row within minHealthyPeriodSeconds (%s): maxRetry (%d) reached, a person must act",
			record.Machine, record.RetryCount+1, minHealthy, *spec.MaxRetry)}
	}
	return RetryDecision{Allowed: true, RetryCount: record.RetryCount + 1}
}

// Candidate is one waiting control-plane remediation, for choosing which goes first.
type Candidate struct {
	Name string
	// Requested is true for cluster.x-k8s.io/remediate-machine on the Machine (not spec.source
	// Manual: anyone who may write a request can set that).
	Requested bool
	Member    VictimMember
	Created   time.Time
}

// brokenRank orders victims' etcd members: missing, down or a learner (0) before a healthy voter (1).
func brokenRank(v VictimMember) int {
	switch v {
	case VictimMissing, VictimUnhealthy, VictimLearner:
		return 0
	default:
		return 1
	}
}

// FirstCandidate returns the remediation that should go first: the most broken etcd member (missing
// or down before healthy, so that a dead member is never left behind a healthy one whose removal
// would not be safe — not even behind an explicit request), then explicit requests, then the oldest.
func FirstCandidate(cands []Candidate) string {
	if len(cands) == 0 {
		return ""
	}
	sorted := append([]Candidate(nil), cands...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if brokenRank(a.Member) != brokenRank(b.Member) {
			return brokenRank(a.Member) < brokenRank(b.Member)
		}
		if a.Requested != b.Requested {
			return a.Requested
		}
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.Name < b.Name
	})
	return sorted[0].Name
}

// YieldTo returns the waiting remediation that a running one, not yet past its point of no return,
// must give way to ("" when it keeps going): one whose victim's etcd member is missing, down or a
// learner while the running one's victim is a healthy voter. Removing a healthy member while another
// is down is what the quorum checks refuse, so the running remediation could only wait for its
// timeout while holding the control plane that the broken Machine needs; FirstCandidate then puts
// the broken one first, so the two never take turns.
func YieldTo(running Candidate, waiting []Candidate) string {
	if brokenRank(running.Member) == 0 {
		return ""
	}
	var broken []Candidate
	for _, c := range waiting {
		if brokenRank(c.Member) == 0 {
			broken = append(broken, c)
		}
	}
	return FirstCandidate(broken)
}
