package controlplane

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation/escalation"
	"github.com/capr-io/capr/remediation/fencing"
)

// stepResult is what one attempt at a step found.
type stepResult struct {
	// done: the step's effect is visible (or the step is not needed: skipped).
	done    bool
	skipped bool
	// failed: done without effect (an escalation step that timed out); the next step follows.
	failed bool
	// recovered: the Machine is healthy again during the escalation; the remediation ends, nothing
	// replaced.
	recovered bool
	message   string
	// waitReason, when set, is the Progressing reason while the step cannot proceed.
	waitReason string
	// giveWay: the step waits because its membership change (adding the replacement's member,
	// moving leadership, removing the victim's member) is not quorum-safe now. If nothing
	// irreversible was done and no member joined since the start, after giveWayAfter of such waiting
	// the remediation is undone and goes back to Pending (mayGiveWay and giveWay in
	// controlplane_lifecycle.go) instead of holding the control plane until its step timeout.
	giveWay bool
	requeue time.Duration
}

// currentStep is the first step of the plan that is not finished (StepFinished).
func currentStep(mr *caprv1.MachineRemediation) caprv1.StepName {
	if mr.Status.ControlPlane == nil {
		return ""
	}
	for _, step := range PlanSteps(mr) {
		if !StepFinished(findStep(mr, step)) {
			return step
		}
	}
	return ""
}

func findStep(mr *caprv1.MachineRemediation, name caprv1.StepName) *caprv1.RemediationStep {
	for i := range mr.Status.Steps {
		if mr.Status.Steps[i].Name == name {
			return &mr.Status.Steps[i]
		}
	}
	return nil
}

// runSteps works on the current step: it records the step as started (persisted before anything is
// issued), observes whether its effect is visible, and otherwise issues it again (every step is
// idempotent). One step transition per reconcile keeps every transition observable from the API.
func (r *Reconciler) runSteps(ctx context.Context, s *scope) (ctrl.Result, error) {
	step := currentStep(s.mr)
	if step == "" {
		return r.succeed(ctx, s)
	}
	rec := findStep(s.mr, step)
	replanned := ""
	if rec == nil && mustReplan(s.mr, step) {
		// The escalation did not help, and it took time: the order chosen at the start was chosen
		// on an etcd state that may be gone. Choose again before the first membership step.
		w, msg, err := r.replan(ctx, s)
		if err != nil {
			return ctrl.Result{}, err
		}
		if w != nil {
			return r.waitAfterEscalation(ctx, s, w)
		}
		replanned = msg
		step = currentStep(s.mr)
		rec = findStep(s.mr, step)
	}
	if rec == nil {
		s.mr.Status.Steps = append(s.mr.Status.Steps, caprv1.RemediationStep{
			Name: step, StartTime: ptr.To(metav1.Now()), Outcome: caprv1.StepOutcomeInProgress,
		})
		s.mr.Status.CurrentStep = step
		conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionTrue,
			Reason: caprv1.MachineRemediationStepInProgressReason, Message: "step " + string(step)})
		if err := r.persist(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
		if replanned != "" {
			r.event(s.mr, corev1.EventTypeNormal, EventOrderReplanned, replanned)
		}
		r.event(s.mr, corev1.EventTypeNormal, EventStepStarted, "Step "+string(step)+" started")
		r.observe(s, step, false)
		rec = findStep(s.mr, step)
	}

	res, err := r.runStep(ctx, s, step, rec)
	rec = findStep(s.mr, step)
	if err != nil {
		s.mr.Status.LastError = err.Error()
		rec.Message = err.Error()
		return ctrl.Result{RequeueAfter: waitShort}, nil //nolint:nilerr // recorded in the status (lastError, step message); the step is retried
	}
	rec.Message = res.message
	if res.recovered {
		return r.recovered(ctx, s, rec, res.message)
	}
	if !res.done {
		if res.giveWay && r.mayGiveWay(ctx, s, res.waitReason) {
			return r.giveWay(ctx, s, step, res.message)
		}
		if res.waitReason != "" {
			msg := fmt.Sprintf("step %s: %s", step, res.message)
			if !isWaitingFor(s.mr, res.waitReason) {
				// Said once, when the wait starts (the condition carries the latest word).
				eventType, reason := corev1.EventTypeNormal, EventRemediationWaiting
				if res.waitReason == caprv1.MachineRemediationStepTimedOutReason {
					eventType, reason = corev1.EventTypeWarning, EventStepTimedOut
				}
				r.event(s.mr, eventType, reason, msg)
			}
			setWaiting(s.mr, res.waitReason, msg)
		} else {
			conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionTrue,
				Reason: caprv1.MachineRemediationStepInProgressReason, Message: fmt.Sprintf("step %s: %s", step, res.message)})
		}
		return ctrl.Result{RequeueAfter: max(res.requeue, 100*time.Millisecond)}, nil
	}
	rec.FinishTime = ptr.To(metav1.Now())
	rec.Outcome = caprv1.StepOutcomeSucceeded
	switch {
	case res.skipped:
		rec.Outcome = caprv1.StepOutcomeSkipped
	case res.failed:
		rec.Outcome = caprv1.StepOutcomeFailed
	}
	s.mr.Status.LastError = ""
	metrics.StepFinished(metrics.KindControlPlane, string(step), string(rec.Outcome), rec.FinishTime.Sub(rec.StartTime.Time))
	r.observe(s, step, true)
	r.event(s.mr, corev1.EventTypeNormal, EventStepFinished, fmt.Sprintf("Step %s %s: %s", step, rec.Outcome, res.message))
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation step finished", "step", step, "outcome", rec.Outcome, "message", res.message)
	return ctrl.Result{RequeueAfter: time.Millisecond}, nil
}

func (r *Reconciler) observe(s *scope, step caprv1.StepName, done bool) {
	if r.StepObserver != nil {
		r.StepObserver(StepEvent{Remediation: types.NamespacedName{Namespace: s.mr.Namespace, Name: s.mr.Name}, Step: step, Done: done, Time: time.Now()})
	}
}

func (r *Reconciler) runStep(ctx context.Context, s *scope, step caprv1.StepName, rec *caprv1.RemediationStep) (stepResult, error) {
	switch step {
	case caprv1.StepScaleUp:
		return r.stepScaleUp(ctx, s)
	case caprv1.StepWaitForReplacement:
		return r.stepWaitForReplacement(ctx, s)
	case caprv1.StepMoveLeader, caprv1.StepRemoveMember:
		if s.externalEtcd() {
			// Only a record written before the placement was recorded can list these steps.
			return stepResult{done: true, skipped: true, message: "etcd is external: the victim has no etcd member"}, nil
		}
		if step == caprv1.StepMoveLeader {
			return r.stepMoveLeader(ctx, s, rec)
		}
		return r.stepRemoveMember(ctx, s)
	case caprv1.StepFence:
		return r.stepFence(ctx, s, rec)
	case caprv1.StepDelete:
		return r.stepDelete(ctx, s)
	}
	if escalation.Index(s.mr, step) >= 0 {
		return r.stepEscalate(ctx, s, rec)
	}
	return stepResult{}, fmt.Errorf("unknown step %q", step)
}

// etcdOrWait returns the etcd state, or the wait result that says etcd cannot be read (a step never
// guesses without it).
func (r *Reconciler) etcdOrWait(ctx context.Context, s *scope) (*etcdutil.State, *stepResult) {
	state, err := r.inspectEtcd(ctx, s)
	if err != nil {
		return nil, &stepResult{waitReason: caprv1.MachineRemediationEtcdUnreachableReason, message: "cannot read etcd state: " + err.Error(), requeue: waitShort}
	}
	return state, nil
}

// replacements returns the control-plane Machines created since the remediation started, oldest
// first (a surge of two creates two).
func replacements(s *scope) []*clusterv1.Machine {
	before := map[string]bool{}
	for _, n := range s.mr.Status.ControlPlane.MachinesBefore {
		before[n] = true
	}
	var out []*clusterv1.Machine
	for _, m := range s.machines {
		if !before[m.Name] && m.Name != s.mr.Name && m.DeletionTimestamp.IsZero() {
			out = append(out, m)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].CreationTimestamp.Equal(&out[j].CreationTimestamp) {
			return out[i].CreationTimestamp.Before(&out[j].CreationTimestamp)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// machineNames returns the names of machines, in order.
func machineNames(machines []*clusterv1.Machine) []string {
	out := make([]string, 0, len(machines))
	for _, m := range machines {
		out = append(out, m.Name)
	}
	return out
}

// replacement returns the first replacement Machine, or nil.
func replacement(s *scope) *clusterv1.Machine {
	if reps := replacements(s); len(reps) > 0 {
		return reps[0]
	}
	return nil
}

// surplusReplacement is, after a surge of two, the replacement that is not the recorded one: the
// Machine that has to go again when the control plane returns to N (nil otherwise).
func surplusReplacement(s *scope) *clusterv1.Machine {
	reps := replacements(s)
	if surge(s) < 2 || len(reps) < 2 {
		return nil
	}
	surplus := reps[len(reps)-1]
	if surplus.Name == s.mr.Status.ControlPlane.Replacement {
		surplus = reps[len(reps)-2]
	}
	return surplus
}

// surge is the number of Machines the remediation adds (recorded at start; 1 for records without it).
func surge(s *scope) int32 {
	return max(s.mr.Status.ControlPlane.Surge, 1)
}

func (r *Reconciler) stepScaleUp(ctx context.Context, s *scope) (stepResult, error) {
	cps := s.mr.Status.ControlPlane
	desired := ptr.Deref(cps.DesiredReplicas, 0)
	current, err := Replicas(s.cp)
	if err != nil {
		return stepResult{}, err
	}
	target := desired + surge(s)
	if rep := replacement(s); rep != nil || current >= target {
		msg := fmt.Sprintf("%s %s replicas %d → %d", s.cp.GetKind(), s.cp.GetName(), desired, target)
		if rep != nil {
			msg += ", replacement Machine " + rep.Name
		}
		return stepResult{done: true, message: msg}, nil
	}
	var state *etcdutil.State // stays nil with external etcd: no member is added
	afterRemoval := false
	if !s.externalEtcd() {
		var wait *stepResult
		if state, wait = r.etcdOrWait(ctx, s); wait != nil {
			return *wait, nil
		}
		// Quorum safety is re-checked against the state of now, not the state when the order was chosen.
		if !etcdutil.CanAddMember(state.Counts(), s.adapter.AddsLearners()) {
			c := state.Counts()
			return stepResult{waitReason: caprv1.MachineRemediationNotQuorumSafeReason, requeue: waitShort,
				giveWay: true,
				message: fmt.Sprintf("adding a member is not quorum-safe now (%d/%d healthy, %d learners)", c.Healthy, c.Voting, c.Learners)}, nil
		}
		afterRemoval = state.ByName(s.victimNode()) == nil
	}
	if refusal := s.adapter.ScaleUpRefusal(ProviderView{ControlPlane: s.cp, Machines: s.machines, Victim: s.machine, Etcd: state}, afterRemoval); refusal != "" {
		return stepResult{waitReason: caprv1.MachineRemediationNotQuorumSafeReason, message: refusal, requeue: waitShort}, nil
	}
	started := s.mr.Status.StartTime.Time
	// Raised only from the replicas the remediation started at; a conflicting write (the provider's
	// status, a hand edit) is decided again at once from a live read.
	current, _, err = r.setReplicasDecided(ctx, s, func(current int32) (int32, bool) {
		return target, current == desired
	}, func(cp *unstructured.Unstructured) error {
		return s.adapter.BeforeScaleUp(cp, s.mr.Name, started, cps.RetryCount)
	})
	switch {
	case err != nil:
		return stepResult{}, err
	case current != desired && current < target:
		return stepResult{waitReason: caprv1.MachineRemediationWaitingForPreconditionsReason, requeue: waitShort, message: fmt.Sprintf(
			"%s %s replicas are %d, %s before the surge (it was to raise them from %d to %d); waiting until they are %d again",
			s.cp.GetKind(), s.cp.GetName(), current, replicasChangedElsewhere, desired, target, desired)}, nil
	}
	return stepResult{message: fmt.Sprintf("raised replicas to %d", target), requeue: 200 * time.Millisecond}, nil
}

func (r *Reconciler) stepWaitForReplacement(ctx context.Context, s *scope) (stepResult, error) {
	reps := replacements(s)
	if len(reps) == 0 {
		if s.mr.Status.ControlPlane.Order == caprv1.ControlPlaneOrderDeleteFirst {
			// The victim is gone and replicas unchanged: the provider replaces it on its own, with
			// what BeforeScaleUp sets (e.g. KCP's relaxed preflight while another Machine is unhealthy).
			var state *etcdutil.State
			if !s.externalEtcd() {
				var wait *stepResult
				if state, wait = r.etcdOrWait(ctx, s); wait != nil {
					return *wait, nil
				}
			}
			return r.armNextReplacement(ctx, s, state, nil)
		}
		if blocked := r.joinBlocked(ctx, s); blocked != nil {
			return *blocked, nil
		}
		return stepResult{message: "waiting for the control-plane provider to create the replacement Machine" + s.adapter.Explain(s.cp), requeue: waitShort}, nil
	}
	s.mr.Status.ControlPlane.Replacement = reps[0].Name
	for _, rep := range reps {
		if err := r.annotateReplacement(ctx, s, rep); err != nil {
			return stepResult{}, err
		}
	}
	if blocked := r.joinBlocked(ctx, s); blocked != nil {
		return *blocked, nil
	}
	for i, rep := range reps {
		if !rep.Status.NodeRef.IsDefined() { // etcd is not read before there is a member to look for
			return stepResult{message: fmt.Sprintf("replacement %d of %d: waiting for Machine %s to get a Node", i+1, surge(s), rep.Name), requeue: waitShort}, nil
		}
	}
	if s.externalEtcd() {
		return r.waitForServingReplacements(ctx, s, reps)
	}
	state, wait := r.etcdOrWait(ctx, s)
	if wait != nil {
		return *wait, nil
	}
	for i, rep := range reps {
		if res := replacementUp(state, rep); res != "" {
			return stepResult{message: fmt.Sprintf("replacement %d of %d: %s", i+1, surge(s), res), requeue: waitShort}, nil
		}
	}
	if n := int32(len(reps)); n < surge(s) {
		return r.armNextReplacement(ctx, s, state, reps)
	}
	names := make([]string, 0, len(reps))
	for _, rep := range reps {
		names = append(names, fmt.Sprintf("%s (Node %s)", rep.Name, rep.Status.NodeRef.Name))
	}
	return stepResult{done: true, message: fmt.Sprintf("replacement %s up with a healthy voting etcd member", strings.Join(names, " and "))}, nil
}

// joinBlocked returns the wait of a scale-up-first remediation whose replacement cannot join: no
// member has joined since the start (membersJoined) and adding one is not quorum-safe now (etcd's own
// add rule, which the replacement's join would meet). Nil when the replacement may still join, when
// a member already joined (undoing would then remove a member: the step waits as before), when etcd
// cannot be read (the later checks of the step say so), or with external etcd.
func (r *Reconciler) joinBlocked(ctx context.Context, s *scope) *stepResult {
	if s.externalEtcd() || s.mr.Status.ControlPlane.Order != caprv1.ControlPlaneOrderScaleUpFirst {
		return nil
	}
	state, err := r.inspectEtcd(ctx, s)
	if err != nil || etcdutil.CanAddMember(state.Counts(), s.adapter.AddsLearners()) || membersJoined(s, state) {
		return nil
	}
	c := state.Counts()
	return &stepResult{waitReason: caprv1.MachineRemediationNotQuorumSafeReason, requeue: waitShort, giveWay: true, message: fmt.Sprintf(
		"the replacement cannot join: adding a member is not quorum-safe now (%d/%d healthy, %d learners)", c.Healthy, c.Voting, c.Learners)}
}

// membersJoined reports whether etcd lists a member that is not one of the control-plane Machines
// of the start (a replacement's, or one added and not started yet, which has no name).
func membersJoined(s *scope, state *etcdutil.State) bool {
	before := map[string]bool{s.victimNode(): true}
	for _, name := range s.mr.Status.ControlPlane.MachinesBefore {
		if node := machineNode(s.machines, name); node != "" {
			before[node] = true
		}
	}
	for _, m := range state.Members {
		if !before[m.Name] {
			return true
		}
	}
	return false
}

// waitForServingReplacements is WaitForReplacement with external etcd: a replacement is up when it
// serves the API (Adapter.ServesAPI); there is no member to wait for.
func (r *Reconciler) waitForServingReplacements(ctx context.Context, s *scope, reps []*clusterv1.Machine) (stepResult, error) {
	for i, rep := range reps {
		if missing := s.adapter.ServesAPI(rep); missing != "" {
			return stepResult{message: fmt.Sprintf("replacement %d of %d: %s", i+1, surge(s), missing), requeue: waitShort}, nil
		}
	}
	if n := int32(len(reps)); n < surge(s) {
		return r.armNextReplacement(ctx, s, nil, reps)
	}
	return stepResult{done: true, message: fmt.Sprintf("replacement %s up and serving the API (etcd is external)", strings.Join(machineNames(reps), " and "))}, nil
}

// replacementUp says what a replacement still lacks ("" when it has a Node and a healthy voting member).
func replacementUp(state *etcdutil.State, rep *clusterv1.Machine) string {
	if !rep.Status.NodeRef.IsDefined() {
		return fmt.Sprintf("waiting for Machine %s to get a Node", rep.Name)
	}
	member := state.ByName(rep.Status.NodeRef.Name)
	switch {
	case member == nil:
		return fmt.Sprintf("waiting for the etcd member of %s to join", rep.Name)
	case member.IsLearner:
		return fmt.Sprintf("the etcd member of %s is a learner, waiting for its promotion", rep.Name)
	case !member.Healthy:
		return fmt.Sprintf("the etcd member of %s is %s", rep.Name, member.Problem)
	}
	return ""
}

// armNextReplacement prepares the provider to create the next Machine of a surge once the previous
// ones vote: it re-checks that adding a member is quorum-safe now (state; nil with external etcd,
// where no member is added) and calls BeforeScaleUp again, stamped after the newest replacement (KCP
// removed its annotation when it created the previous one).
func (r *Reconciler) armNextReplacement(ctx context.Context, s *scope, state *etcdutil.State, reps []*clusterv1.Machine) (stepResult, error) {
	next := len(reps) + 1
	if !s.externalEtcd() && !etcdutil.CanAddMember(state.Counts(), s.adapter.AddsLearners()) {
		c := state.Counts()
		return stepResult{waitReason: caprv1.MachineRemediationNotQuorumSafeReason, requeue: waitShort,
			message: fmt.Sprintf("replacement %d of %d: adding a member is not quorum-safe now (%d/%d healthy, %d learners)", next, surge(s), c.Healthy, c.Voting, c.Learners)}, nil
	}
	at := now()
	for _, rep := range reps {
		if rep.CreationTimestamp.After(at) {
			at = rep.CreationTimestamp.Time
		}
	}
	current, err := Replicas(s.cp)
	if err != nil {
		return stepResult{}, err
	}
	live := 0
	for _, m := range s.machines {
		if m.DeletionTimestamp.IsZero() {
			live++
		}
	}
	if live >= int(current) {
		// The provider has created every Machine its replicas ask for; the newest is not visible
		// to this reconcile yet. Arming again would leave an annotation nobody consumes.
		return stepResult{message: fmt.Sprintf("waiting for replacement %d of %d to appear", next, surge(s)), requeue: waitShort}, nil
	}
	probe := s.cp.DeepCopy()
	if err := s.adapter.BeforeScaleUp(probe, s.mr.Name, at, s.mr.Status.ControlPlane.RetryCount); err != nil {
		return stepResult{}, err
	}
	if !equality.Semantic.DeepEqual(probe.GetAnnotations(), s.cp.GetAnnotations()) {
		if _, _, err := r.setReplicasDecided(ctx, s, func(current int32) (int32, bool) { return current, true }, func(cp *unstructured.Unstructured) error {
			return s.adapter.BeforeScaleUp(cp, s.mr.Name, at, s.mr.Status.ControlPlane.RetryCount)
		}); err != nil {
			return stepResult{}, err
		}
	}
	return stepResult{message: fmt.Sprintf("waiting for the %s to create replacement %d of %d%s", s.adapter.Name(), next, surge(s), s.adapter.Explain(s.cp)), requeue: waitShort}, nil
}

// annotateReplacement records on the replacement which Machine it replaced, for retry limits.
func (r *Reconciler) annotateReplacement(ctx context.Context, s *scope, rep *clusterv1.Machine) error {
	if _, ok := rep.Annotations[caprv1.RemediationRecordAnnotation]; ok {
		return nil
	}
	value, err := (&caprv1.RemediationRecord{
		Machine:    s.mr.Name,
		Timestamp:  metav1.NewTime(s.mr.Status.StartTime.UTC().Truncate(time.Second)),
		RetryCount: s.mr.Status.ControlPlane.RetryCount,
	}).Marshal()
	if err != nil {
		return err
	}
	base := rep.DeepCopy()
	annotations.AddAnnotations(rep, map[string]string{caprv1.RemediationRecordAnnotation: value})
	if err := r.Client.Patch(ctx, rep, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("annotating replacement Machine %s: %w", rep.Name, err)
	}
	return nil
}

func (r *Reconciler) stepMoveLeader(ctx context.Context, s *scope, rec *caprv1.RemediationStep) (stepResult, error) {
	state, wait := r.etcdOrWait(ctx, s)
	if wait != nil {
		return *wait, nil
	}
	victim := state.ByName(s.victimNode())
	switch {
	case victim == nil:
		return stepResult{done: true, skipped: true, message: "the victim's etcd member is not in the member list"}, nil
	case state.LeaderID != victim.ID:
		leader := state.ByID(state.LeaderID)
		name := "none"
		if leader != nil {
			name = leader.Name
		}
		if strings.HasPrefix(rec.Message, movingLeadership) {
			return stepResult{done: true, message: fmt.Sprintf("leadership moved, the leader is now %s", name)}, nil
		}
		return stepResult{done: true, skipped: true, message: fmt.Sprintf("the leader is %s, not the victim", name)}, nil
	case !victim.Reachable:
		// The case that stalls KCP (#8465, #12711): MoveLeader must be sent to the leader, which
		// cannot be reached. Removing it from another member is safe: etcd steps the leader down once
		// the configuration change commits.
		return stepResult{done: true, skipped: true, message: "the victim's member leads but its node cannot be reached; it is removed from another member and etcd steps the leader down"}, nil
	}
	target := leadershipTarget(state, s)
	if target == nil {
		return stepResult{waitReason: caprv1.MachineRemediationNotQuorumSafeReason, message: "no healthy voting member to move leadership to", requeue: waitShort, giveWay: true}, nil
	}
	if err := s.etcd.MoveLeader(ctx, victim.Name, target.ID); err != nil {
		return stepResult{}, err
	}
	return stepResult{message: fmt.Sprintf("%s from %s to %s", movingLeadership, victim.Name, target.Name), requeue: 200 * time.Millisecond}, nil
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
		return stepResult{done: true, message: fmt.Sprintf("the victim's member is not in the member list (%d voting, %d healthy)", c.Voting, c.Healthy)}, nil
	}
	s.mr.Status.ControlPlane.MemberID = fmt.Sprintf("%x", victim.ID)
	c := state.Counts()
	if !etcdutil.CanRemoveMember(c, etcdutil.Victim{Healthy: victim.Healthy, Learner: victim.IsLearner}) {
		return stepResult{waitReason: caprv1.MachineRemediationNotQuorumSafeReason, requeue: waitShort, giveWay: true, message: fmt.Sprintf(
			"removing the member now is not quorum-safe (%d/%d voting members healthy, %d learners, victim %s)",
			c.Healthy, c.Voting, c.Learners, map[bool]string{true: "healthy", false: "unhealthy"}[victim.Healthy])}, nil
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
		return stepResult{message: fmt.Sprintf("etcd refused the removal for now: %v", err), requeue: waitShort}, nil
	}
	return stepResult{message: fmt.Sprintf("removing member %s (%x) through %v", victim.Name, victim.ID, via), requeue: 200 * time.Millisecond}, nil
}

func (r *Reconciler) stepFence(ctx context.Context, s *scope, rec *caprv1.RemediationStep) (stepResult, error) {
	if s.machineGone {
		// Deleted by someone else past the point of no return: its deletion was held by the hook until
		// fenceDeletingVictim's fence was final (recorded in status.fencing, unfenced when the
		// remediation ends). Nothing is left to fence before a delete.
		return stepResult{done: true, message: fmt.Sprintf("Machine %s is gone, deleted by someone else (a deletion held by the fence hook is fenced first)", s.mr.Name)}, nil
	}
	res, err := fencing.FenceRecorded(ctx, r.Fencer, s.mr, fencing.Request{
		Cluster: s.cluster, Machine: s.machine, Node: s.victimNode(), Spec: s.mr.Spec.Fencing, Started: rec.StartTime.Time,
	}, time.Now(), r.persistFunc(s))
	if err != nil {
		return stepResult{}, err
	}
	v := fencing.Judge(res, s.mr.Spec.Fencing, rec.StartTime.Time, time.Now())
	if !v.Done {
		reason := caprv1.MachineRemediationWaitingForFencingReason
		if v.TimedOut {
			reason = caprv1.MachineRemediationStepTimedOutReason
		}
		return stepResult{waitReason: reason, message: v.Message, requeue: v.Requeue}, nil
	}
	// Whoever deletes the victim now may: the fence is confirmed (or the policy lets it go).
	if err := r.removeFenceHook(ctx, s); err != nil {
		return stepResult{}, err
	}
	if v.GaveUp {
		r.event(s.mr, corev1.EventTypeWarning, EventFencingGaveUp, v.Message)
	}
	metrics.Fenced(metrics.KindControlPlane, v.Outcome(), time.Since(rec.StartTime.Time))
	return stepResult{done: true, skipped: v.Skipped, message: v.Message}, nil
}

// stepDelete deletes the victim and, after a surge, returns replicas to N (the victim also carries
// cluster.x-k8s.io/delete-machine, the provider's first choice should it scale down first). It is
// the only place the victim is deleted, and it refuses unless the Fence step finished (fence before
// delete).
func (r *Reconciler) stepDelete(ctx context.Context, s *scope) (stepResult, error) {
	fence := findStep(s.mr, caprv1.StepFence)
	if fence == nil || (fence.Outcome != caprv1.StepOutcomeSucceeded && fence.Outcome != caprv1.StepOutcomeSkipped) {
		return stepResult{}, fmt.Errorf("refusing to delete Machine %s: the Fence step has not finished", s.mr.Name)
	}
	m := &clusterv1.Machine{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.mr.Namespace, Name: s.mr.Name}, m); err != nil {
		if client.IgnoreNotFound(err) != nil {
			return stepResult{}, err
		}
		// Gone, possibly deleted by someone else before the replicas came back: the surge must go
		// too, or the provider replaces the victim and stays above N.
		note := ""
		if o := s.mr.Status.ControlPlane.Order; o != caprv1.ControlPlaneOrderReplace && o != caprv1.ControlPlaneOrderDeleteFirst {
			if note, err = r.replicasBack(ctx, s); err != nil {
				return stepResult{}, err
			}
		}
		res, err := r.waitForDesiredMachines(ctx, s)
		res.message += note
		return res, err
	}
	if _, ok := m.Annotations[caprv1.FenceBeforeDeleteHookAnnotation]; ok {
		// Fenced (checked above), so the hook must not hold the deletion; it can be back only
		// through a crash between a re-added hook and the Fence step's record.
		if err := r.removeFenceHook(ctx, s); err != nil {
			return stepResult{}, err
		}
	}
	cps := s.mr.Status.ControlPlane
	if !m.DeletionTimestamp.IsZero() {
		// Being deleted, possibly by someone else (a rollout, a person): the surge still has to go.
		note := ""
		if cps.Order != caprv1.ControlPlaneOrderReplace && cps.Order != caprv1.ControlPlaneOrderDeleteFirst {
			var err error
			if note, err = r.replicasBack(ctx, s); err != nil {
				return stepResult{}, err
			}
		}
		return stepResult{message: fmt.Sprintf("Machine %s is being deleted%s", m.Name, note), requeue: waitShort}, nil
	}
	if _, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]; !ok {
		base := m.DeepCopy()
		annotations.AddAnnotations(m, map[string]string{clusterv1.DeleteMachineAnnotation: "capr"})
		if err := r.Client.Patch(ctx, m, client.MergeFrom(base)); err != nil {
			return stepResult{}, fmt.Errorf("annotating Machine %s for deletion: %w", m.Name, err)
		}
	}
	// After a surge of two the provider removes one more Machine when it returns to N: it is to be
	// the surplus replacement, not the provider's default (the oldest), which may be the Machine of
	// another request waiting for the lock and would go unfenced.
	if surplus := surplusReplacement(s); surplus != nil {
		if err := r.markForDeletion(ctx, []*clusterv1.Machine{surplus}); err != nil {
			return stepResult{}, err
		}
	}
	// The victim is deleted here, not left to the provider's scale-down: a provider picks the Machine
	// to scale down from its own caches, where the new replicas can arrive before the annotation above
	// (two informers), and would then delete a healthy Machine, taking a voting member out of the
	// failure margin and leaving the victim in place (the fault suite saw it). While the victim is
	// being deleted neither KCP nor the sandbox's provider scales (KCP's preflight waits for deleting
	// Machines), and the replicas are back to N before it is gone.
	if err := r.Client.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
		return stepResult{}, fmt.Errorf("deleting Machine %s: %w", m.Name, err)
	}
	if cps.Order == caprv1.ControlPlaneOrderReplace || cps.Order == caprv1.ControlPlaneOrderDeleteFirst {
		// Nothing was scaled (Replace: not initialized; DeleteFirst: the provider would not scale
		// down): the provider creates a new Machine.
		return stepResult{message: "deleted the Machine; the provider creates a new one", requeue: waitShort}, nil
	}
	note, err := r.replicasBack(ctx, s)
	if err != nil {
		return stepResult{}, err
	}
	if note != "" {
		return stepResult{message: "deleting Machine " + m.Name + note, requeue: waitShort}, nil
	}
	return stepResult{message: fmt.Sprintf("deleting Machine %s; replicas back to %d%s",
		m.Name, ptr.Deref(cps.DesiredReplicas, 0), s.adapter.Explain(s.cp)), requeue: waitShort}, nil
}

// replicasBack returns the control plane's replicas to what they were before the surge, when they
// are still what the surge set. Replicas someone else changed since (a person, GitOps, an
// autoscaler) are theirs: they are left as they are, and the note returned says so (for the step's
// message; a Warning event the first time).
//
// It runs right after the victim's delete: a provider that sees the victim gone while the replicas
// still ask for the surge creates a Machine too many (and then scales an old one down). So a write
// that conflicts (the provider wrote the object meanwhile, e.g. its status) is decided again at once
// from a live read, not at the step's next pass.
func (r *Reconciler) replicasBack(ctx context.Context, s *scope) (note string, err error) {
	cps := s.mr.Status.ControlPlane
	desired := ptr.Deref(cps.DesiredReplicas, 0)
	current, _, err := r.setReplicasDecided(ctx, s, func(current int32) (int32, bool) {
		return desired, current == desired+surge(s)
	}, nil)
	if err != nil || current == desired || current == desired+surge(s) {
		return "", err
	}
	note = fmt.Sprintf("; %s %s replicas are %d, %s (it set %d, from %d), so CAPR leaves them",
		s.cp.GetKind(), s.cp.GetName(), current, replicasChangedElsewhere, desired+surge(s), desired)
	if rec := findStep(s.mr, caprv1.StepDelete); rec == nil || !strings.Contains(rec.Message, replicasChangedElsewhere) {
		r.event(s.mr, corev1.EventTypeWarning, EventReplicasChangedElsewhere, strings.TrimPrefix(note, "; "))
	}
	return note, nil
}

// replicasChangedElsewhere is how a step's message says that the replicas were changed by someone
// other than CAPR during the remediation.
const replicasChangedElsewhere = "changed by someone else during the remediation"

// waitForDesiredMachines finishes the Delete step once the victim is gone and the provider is back
// at desiredReplicas Machines, none deleting (after a surge of two it also removes a second Machine).
func (r *Reconciler) waitForDesiredMachines(ctx context.Context, s *scope) (stepResult, error) {
	cps := s.mr.Status.ControlPlane
	desired := ptr.Deref(cps.DesiredReplicas, 0)
	if current, err := Replicas(s.cp); err == nil && current != desired && current != desired+surge(s) {
		desired = current // changed by someone else (replicasBack left them): the provider scales to theirs
	}
	if cps.Order != caprv1.ControlPlaneOrderReplace && cps.Order != caprv1.ControlPlaneOrderDeleteFirst {
		live, deleting := 0, 0
		for _, m := range s.machines {
			if m.Name == s.mr.Name {
				continue
			}
			if m.DeletionTimestamp.IsZero() {
				live++
			} else {
				deleting++
			}
		}
		if live > int(desired) && deleting == 0 {
			if res, ok, err := r.deleteSurplusReplacement(ctx, s); ok {
				return res, err
			}
		}
		if live != int(desired) || deleting > 0 {
			return stepResult{message: fmt.Sprintf("Machine %s deleted; waiting for the %s to scale to %d Machines (%d, %d deleting)%s",
				s.mr.Name, s.adapter.Name(), desired, live, deleting, s.adapter.Explain(s.cp)), requeue: waitShort}, nil
		}
	}
	return stepResult{done: true, message: fmt.Sprintf("Machine %s deleted; the %s is at %d Machines", s.mr.Name, s.adapter.Name(), desired)}, nil
}

// deleteSurplusReplacement deletes, after a surge of two, the newer replacement when the provider
// refuses to scale down to N itself (KCP while another control-plane Machine is unhealthy, e.g. one
// that failed after this remediation's point of no return): otherwise the control plane stays above
// its replicas and the next remediation, which starts only on a quiet control plane, waits forever.
// With N odd (KCP's stacked etcd), N+1 members with one unhealthy keep the same failure margin
// when a healthy one goes: (h-1) - (N/2+1) = h - ((N+1)/2+1). KCP's own deletion path (its
// pre-terminate hook) removes the Machine's etcd member. ok is false when there is nothing to do.
func (r *Reconciler) deleteSurplusReplacement(ctx context.Context, s *scope) (res stepResult, ok bool, err error) {
	surplus := surplusReplacement(s)
	if surplus == nil {
		return stepResult{}, false, nil
	}
	refusal := s.adapter.ScaleDownRefusal(ProviderView{ControlPlane: s.cp, Machines: s.machines, Victim: surplus})
	if refusal == "" {
		return stepResult{}, false, nil
	}
	if _, marked := surplus.Annotations[clusterv1.DeleteMachineAnnotation]; !marked {
		// First the provider's own choice is pinned to the surplus (it would otherwise pick the
		// oldest Machine, and may delete it: KCP does when that one is the unhealthy Machine). Only
		// if the provider still refuses at a later pass, with nothing deleting, is it deleted here.
		if err := r.markForDeletion(ctx, []*clusterv1.Machine{surplus}); err != nil {
			return stepResult{}, true, err
		}
		return stepResult{message: fmt.Sprintf("Machine %s deleted; surplus replacement %s marked %s (%s)",
			s.mr.Name, surplus.Name, clusterv1.DeleteMachineAnnotation, refusal), requeue: waitShort}, true, nil
	}
	if err := r.Client.Delete(ctx, surplus); client.IgnoreNotFound(err) != nil {
		return stepResult{}, true, fmt.Errorf("deleting surplus replacement %s: %w", surplus.Name, err)
	}
	msg := fmt.Sprintf("Machine %s deleted; the %s does not scale down (%s), so CAPR deleted the surplus replacement %s itself",
		s.mr.Name, s.adapter.Name(), refusal, surplus.Name)
	r.event(s.mr, corev1.EventTypeNormal, EventSurplusReplacementDeleted, msg)
	return stepResult{message: msg, requeue: waitShort}, true, nil
}

// succeed ends the remediation: the victim is gone and the control plane back to N Machines. Its
// fence is undone first, once its Node is gone too.
func (r *Reconciler) succeed(ctx context.Context, s *scope) (ctrl.Result, error) {
	if done, res, err := r.unfence(ctx, s, true, fmt.Sprintf("Machine %s is gone; ", s.mr.Name)); !done || err != nil {
		return res, err
	}
	if err := r.releaseLock(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	s.mr.Status.Phase = caprv1.MachineRemediationPhaseSucceeded
	s.mr.Status.CurrentStep = ""
	s.mr.Status.CompletionTime = ptr.To(metav1.Now())
	msg := fmt.Sprintf("Machine %s replaced", s.mr.Name)
	if rep := s.mr.Status.ControlPlane.Replacement; rep != "" {
		msg += " by " + rep
	}
	conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse, Reason: caprv1.MachineRemediationSucceededReason, Message: msg})
	conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationSucceededCondition, Status: metav1.ConditionTrue, Reason: caprv1.MachineRemediationSucceededReason, Message: msg})
	r.event(s.mr, corev1.EventTypeNormal, EventRemediationSucceeded, msg)
	metrics.RemediationFinished(metrics.KindControlPlane, string(caprv1.MachineRemediationPhaseSucceeded))
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation succeeded", "replacement", s.mr.Status.ControlPlane.Replacement)
	return ctrl.Result{}, nil
}
