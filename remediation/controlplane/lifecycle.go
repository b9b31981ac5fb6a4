package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation/fencing"
)

// This file holds the life cycle around the step sequence: who holds the control plane, what an
// abort (deleting the request) and a timeout do, and how a Failed request is retried.
//
// The point of no return is the removal of the victim's etcd member (or the Delete step): before
// it, everything CAPR did can be undone (replicas back to N, provider annotations and the lock
// cleared); after it, the victim has no member and must be replaced, so an abort finishes the
// sequence and a timeout keeps trying, visibly, holding the lock and the N+1 replicas it owns.

// Default step timeouts (ControlPlaneRemediationSpec.replacementTimeoutSeconds, stepTimeoutSeconds).
const (
	DefaultReplacementTimeout = 30 * time.Minute
	DefaultStepTimeout        = 10 * time.Minute
)

// terminal is true for Succeeded and Failed requests.
func terminal(mr *caprv1.MachineRemediation) bool {
	return mr.Status.Phase == caprv1.MachineRemediationPhaseSucceeded || mr.Status.Phase == caprv1.MachineRemediationPhaseFailed
}

// reconcileTerminal handles finished requests: a deleted one lets go of its finalizer, a Failed one
// with the retry annotation starts again from Pending. A finished request holds nothing (succeed and
// fail release the lock before they record the phase).
func (r *Reconciler) reconcileTerminal(ctx context.Context, s *scope) ctrl.Result {
	mr := s.mr
	if !mr.DeletionTimestamp.IsZero() {
		controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer)
		return ctrl.Result{}
	}
	if _, ok := mr.Annotations[caprv1.RetryAnnotation]; ok && mr.Status.Phase == caprv1.MachineRemediationPhaseFailed {
		delete(mr.Annotations, caprv1.RetryAnnotation)
		previous := conditions.GetMessage(mr, caprv1.MachineRemediationSucceededCondition)
		mr.Status = caprv1.MachineRemediationStatus{Phase: caprv1.MachineRemediationPhasePending}
		setWaiting(mr, caprv1.MachineRemediationWaitingForPreconditionsReason, "retry requested with annotation "+caprv1.RetryAnnotation)
		msg := fmt.Sprintf("Retry requested: the remediation starts again (it had failed: %s)", previous)
		r.event(mr, corev1.EventTypeNormal, EventRemediationRetried, msg)
		ctrl.LoggerFrom(ctx).Info("Failed control-plane remediation retried on request")
		return ctrl.Result{RequeueAfter: time.Millisecond}
	}
	return ctrl.Result{}
}

// reconcileDelete aborts: undo before the point of no return, finish after it. A deletion of the
// victim held by the hook is fenced first; a fence left is undone last, while the finalizer holds
// the request (the undo has already let the control plane go).
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	mr := s.mr
	if done, res, err := r.fenceHeldFirst(ctx, s); !done || err != nil {
		return res, err
	}
	if mr.Status.Phase == caprv1.MachineRemediationPhaseRunning {
		if r.pastPointOfNoReturn(ctx, s) {
			if !isWaitingFor(mr, caprv1.MachineRemediationAbortedReason) {
				r.event(mr, corev1.EventTypeWarning, EventRemediationAborted,
					"Deletion requested, but "+noReturn(s)+": the remediation is finished first, then the request goes")
			}
			if s.machineGone {
				return r.reconcileMachineGone(ctx, s)
			}
			return r.reconcileRunning(ctx, s)
		}
		undone, err := r.undo(ctx, s)
		if err != nil {
			return ctrl.Result{}, err
		}
		msg := "Remediation aborted (the request was deleted): " + undone
		r.event(mr, corev1.EventTypeNormal, EventRemediationAborted, msg)
		metrics.RemediationFinished(metrics.KindControlPlane, metrics.ResultAborted)
		ctrl.LoggerFrom(ctx).Info("Control-plane remediation aborted", "undone", undone)
		// It holds nothing any more; only its fence may be left to undo.
		backToPending(s, caprv1.MachineRemediationAbortedReason, msg)
	}
	if err := r.releaseLock(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if done, res, err := r.unfenceEnded(ctx, s, "Remediation aborted (the request was deleted); its fence is undone before it goes: "); !done || err != nil {
		return res, err
	}
	controllerutil.RemoveFinalizer(mr, caprv1.MachineRemediationFinalizer)
	return ctrl.Result{}, nil
}

// reconcileFinishedFence undoes the fence a finished (Failed) remediation still owes, then treats it
// as any finished request (retry, deletion): a retry never starts over a fence that is still there.
func (r *Reconciler) reconcileFinishedFence(ctx context.Context, s *scope) (ctrl.Result, error) {
	if done, res, err := r.unfenceEnded(ctx, s, "The remediation ended; its fence is undone: "); !done || err != nil {
		return res, err
	}
	return r.reconcileTerminal(ctx, s), nil
}

// reconcileRunning makes sure this remediation still holds the control plane, applies the step
// timeouts, then works on the current step.
func (r *Reconciler) reconcileRunning(ctx context.Context, s *scope) (ctrl.Result, error) {
	other, err := r.runningRemediation(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	if other != "" {
		// Two requests recorded Running for one cluster (the lock was lost while both started). The
		// one that has done nothing yet goes back to Pending; one that has acted waits.
		if len(s.mr.Status.Steps) == 0 {
			backToPending(s, caprv1.MachineRemediationAnotherRemediationInProgressReason, fmt.Sprintf(
				"the remediation of control-plane Machine %s runs; this one went back to Pending before doing anything", other))
			return ctrl.Result{RequeueAfter: waitLong}, nil
		}
		setWaiting(s.mr, caprv1.MachineRemediationAnotherRemediationInProgressReason, fmt.Sprintf(
			"the control plane is held by %s although this remediation is running; waiting for it", other))
		return ctrl.Result{RequeueAfter: waitLong}, nil
	}
	if l := lockOf(s.cp); l == nil || l.MachineRemediation != s.mr.Name {
		if l != nil {
			active, err := r.lockHolderActive(ctx, s.mr.Namespace, l)
			if err != nil {
				return ctrl.Result{}, err
			}
			if active {
				// A Pending request is between taking the lock and finding that this one runs; it
				// gives the lock back in the same reconcile.
				setWaiting(s.mr, caprv1.MachineRemediationAnotherRemediationInProgressReason, fmt.Sprintf(
					"the control-plane lock is briefly held by %s; waiting for it to give it back", l.MachineRemediation))
				return ctrl.Result{RequeueAfter: waitShort}, nil
			}
		}
		// Lost (a hand edit, a GitOps replace), stale, or a crash between releasing and recording:
		// the durable state says this remediation runs, so it takes the lock back.
		if err := r.takeLock(ctx, s, ptr.Deref(s.mr.Status.ControlPlane.DesiredReplicas, 0)); err != nil {
			return ctrl.Result{}, err
		}
	}
	if res, done, err := r.checkStepTimeout(ctx, s); done || err != nil {
		return res, err
	}
	if yielded, err := r.yieldToMoreBroken(ctx, s); yielded || err != nil {
		return ctrl.Result{RequeueAfter: waitLong}, err
	}
	if err := r.ensureFenceHook(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if _, _, err := r.fenceDeletingVictim(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	return r.runSteps(ctx, s)
}

// yieldToMoreBroken gives the control plane to a waiting remediation whose victim's etcd member is
// down while this one's is healthy (YieldTo), as long as this one can still be undone: replicas back,
// lock released, Pending again. Without it the running remediation would wait for its timeout at the
// quorum check and the broken member would wait behind it.
func (r *Reconciler) yieldToMoreBroken(ctx context.Context, s *scope) (bool, error) {
	if s.machineGone {
		return false, nil
	}
	list := &caprv1.MachineRemediationList{}
	if err := r.Client.List(ctx, list, client.InNamespace(s.mr.Namespace)); err != nil {
		return false, fmt.Errorf("listing MachineRemediations: %w", err)
	}
	othersWait := false
	for _, other := range list.Items {
		if other.Name != s.mr.Name && (other.Status.Phase == "" || other.Status.Phase == caprv1.MachineRemediationPhasePending) {
			othersWait = true
		}
	}
	if !othersWait || s.externalEtcd() || fencing.Owed(s.mr) || fencing.HeldDeletion(s.machine) || r.pastPointOfNoReturn(ctx, s) {
		// With external etcd no victim is more broken than another: first come, first served. A
		// remediation that fenced its victim, or whose victim someone else deletes, finishes: the
		// victim is about to go.
		return false, nil
	}
	state, err := r.inspectEtcd(ctx, s)
	if err != nil {
		return false, nil //nolint:nilerr // without etcd state nobody can be judged more broken: the steps say why they wait
	}
	waiting, err := r.waitingCandidates(ctx, s, state)
	if err != nil {
		return false, err
	}
	other := YieldTo(candidate(s.mr, s.machine, state), waiting)
	if other == "" {
		return false, nil
	}
	undone, err := r.undo(ctx, s)
	if err != nil {
		return false, err
	}
	msg := fmt.Sprintf("the etcd member of control-plane Machine %s is %s and this one's is healthy: removing a healthy member now would not be quorum-safe, so this remediation gave way before its point of no return (%s) and waits for that one",
		other, victimMember(state, machineNode(s.machines, other)), undone)
	backToPending(s, caprv1.MachineRemediationAnotherRemediationInProgressReason, msg)
	r.event(s.mr, corev1.EventTypeNormal, EventRemediationYielded, msg)
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation gave way to a more broken Machine", "other", other, "undone", undone)
	return true, nil
}

// giveWayAfter is how long a step waits for a quorum-safe membership change before the remediation
// gives way: long enough that a member's brief unhealthiness does not undo a surge, short enough that
// the control plane is not held for the step timeout by a remediation that cannot go on.
const giveWayAfter = 30 * time.Second

// mayGiveWay reports whether a remediation whose step asks to give way (stepResult.giveWay) does so
// now: the step has been waiting for the same reason for giveWayAfter (the Progressing condition's
// reason and last transition, so a restart does not reset it), nothing irreversible was done, and no
// member joined etcd since the start (membersJoined). Undoing after a replacement joined would remove
// a healthy member, which is no safer than the step the remediation waits to take: it keeps waiting.
// With external etcd no step waits on quorum.
func (r *Reconciler) mayGiveWay(ctx context.Context, s *scope, reason string) bool {
	c := conditions.Get(s.mr, caprv1.MachineRemediationProgressingCondition)
	if s.machineGone || s.externalEtcd() || fencing.Owed(s.mr) || fencing.HeldDeletion(s.machine) || c == nil || c.Status != metav1.ConditionFalse || c.Reason != reason ||
		now().Sub(c.LastTransitionTime.Time) < giveWayAfter || r.pastPointOfNoReturn(ctx, s) {
		return false
	}
	state, err := r.inspectEtcd(ctx, s)
	return err == nil && !membersJoined(s, state)
}

// giveWay undoes a remediation whose next membership change cannot be made quorum-safe (another
// member went down after the start) and returns it to Pending, where the order is chosen again on the
// etcd state of now. Holding the control plane would only wait for the step timeout: the lock would
// keep every other remediation of the cluster out, and a surge (a replacement that cannot join)
// would stay. Before its point of no return and before any member joined, everything can be undone.
func (r *Reconciler) giveWay(ctx context.Context, s *scope, step caprv1.StepName, why string) (ctrl.Result, error) {
	undone, err := r.undo(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	msg := fmt.Sprintf("step %s: %s for %s; nothing irreversible was done, so this remediation gave way (%s) and chooses its order again",
		step, why, giveWayAfter, undone)
	backToPending(s, caprv1.MachineRemediationNotQuorumSafeReason, msg)
	r.event(s.mr, corev1.EventTypeWarning, EventRemediationYielded, msg)
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation gave way: its membership change cannot be made quorum-safe", "step", step, "undone", undone)
	return ctrl.Result{RequeueAfter: waitLong}, nil
}

// machineNode returns the Node name of the named Machine among machines ("" if unknown).
func machineNode(machines []*clusterv1.Machine, name string) string {
	for _, m := range machines {
		if m.Name == name {
			return m.Status.NodeRef.Name
		}
	}
	return ""
}

// backToPending returns a remediation that did nothing irreversible to Pending: its run is forgotten
// (steps, start, control-plane record) and it is owned by its Machine again, like a request that never
// started, so that it goes with the Machine.
func backToPending(s *scope, reason, msg string) {
	s.mr.Status.Phase = caprv1.MachineRemediationPhasePending
	s.mr.Status.ControlPlane = nil
	s.mr.Status.StartTime = nil
	s.mr.Status.Steps = nil
	s.mr.Status.CurrentStep = ""
	if !s.machineGone {
		s.mr.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: s.machine.Name, UID: s.machine.UID,
		}}
	}
	setWaiting(s.mr, reason, msg)
}

// runningRemediation returns another Running request of the same cluster, read live: the durable
// state that says who holds the control plane, whatever happened to the lock annotation.
func (r *Reconciler) runningRemediation(ctx context.Context, s *scope) (string, error) {
	list := &caprv1.MachineRemediationList{}
	if err := r.APIReader.List(ctx, list, client.InNamespace(s.mr.Namespace)); err != nil {
		return "", fmt.Errorf("listing MachineRemediations: %w", err)
	}
	for _, other := range list.Items {
		if other.Name == s.mr.Name || other.Status.Phase != caprv1.MachineRemediationPhaseRunning || other.Status.ControlPlane == nil {
			continue
		}
		if other.Status.ControlPlane.ClusterName == s.cluster.Name {
			return other.Name, nil
		}
	}
	return "", nil
}

// stepTimeout is how long a step may take (0: no timeout of its own).
func stepTimeout(mr *caprv1.MachineRemediation, step caprv1.StepName) time.Duration {
	spec := mr.Spec.ControlPlane
	if spec == nil {
		spec = &caprv1.ControlPlaneRemediationSpec{}
	}
	switch step {
	case caprv1.StepScaleUp, caprv1.StepWaitForReplacement:
		if spec.ReplacementTimeoutSeconds != nil {
			return time.Duration(*spec.ReplacementTimeoutSeconds) * time.Second
		}
		return DefaultReplacementTimeout
	case caprv1.StepMoveLeader, caprv1.StepRemoveMember, caprv1.StepDelete:
		if spec.StepTimeoutSeconds != nil {
			return time.Duration(*spec.StepTimeoutSeconds) * time.Second
		}
		return DefaultStepTimeout
	default:
		// Fence has the fencing policy's own timeout (spec.fencing.timeoutSeconds).
		return 0
	}
}

// checkStepTimeout fails (and undoes) a remediation whose current step ran out of time before the
// point of no return; after it, the remediation keeps trying and says so.
func (r *Reconciler) checkStepTimeout(ctx context.Context, s *scope) (ctrl.Result, bool, error) {
	step := currentStep(s.mr)
	rec := findStep(s.mr, step)
	limit := stepTimeout(s.mr, step)
	if rec == nil || rec.StartTime == nil || limit == 0 {
		return ctrl.Result{}, false, nil
	}
	deadline := rec.StartTime.Add(limit)
	if now().Before(deadline) {
		return ctrl.Result{}, false, nil
	}
	if r.pastPointOfNoReturn(ctx, s) {
		msg := fmt.Sprintf("step %s did not finish within %s; %s, so the remediation cannot be undone: it keeps trying, holding the control plane at %s (desired %d). Last: %s",
			step, limit, noReturn(s), replicasString(s), ptr.Deref(s.mr.Status.ControlPlane.DesiredReplicas, 0), rec.Message)
		if !isWaitingFor(s.mr, caprv1.MachineRemediationStepTimedOutReason) {
			r.event(s.mr, corev1.EventTypeWarning, EventStepTimedOut, msg)
		}
		res, err := r.runSteps(ctx, s)
		if !currentStepDone(s.mr, step) {
			setWaiting(s.mr, caprv1.MachineRemediationStepTimedOutReason, msg)
		}
		return res, true, err
	}
	res, err := r.fail(ctx, s, caprv1.MachineRemediationStepTimedOutReason, fmt.Sprintf(
		"step %s did not finish within %s (last: %s)", step, limit, rec.Message))
	return res, true, err
}

func currentStepDone(mr *caprv1.MachineRemediation, step caprv1.StepName) bool {
	return StepFinished(findStep(mr, step))
}

func replicasString(s *scope) string {
	if n, err := Replicas(s.cp); err == nil {
		return fmt.Sprintf("%d replicas", n)
	}
	return "unknown replicas"
}

// noReturn says why a remediation past its point of no return cannot be undone.
func noReturn(s *scope) string {
	if findStep(s.mr, caprv1.StepDelete) != nil {
		return "the victim's deletion has started"
	}
	return "the victim's etcd member was already removed"
}

// pastPointOfNoReturn is true once the victim's etcd member may have been removed or the Delete step
// started. When etcd cannot be read after RemoveMember started, the answer is yes (the safe side:
// nothing is undone that cannot be).
func (r *Reconciler) pastPointOfNoReturn(ctx context.Context, s *scope) bool {
	if findStep(s.mr, caprv1.StepDelete) != nil {
		return true
	}
	if findStep(s.mr, caprv1.StepRemoveMember) == nil {
		return false
	}
	state, err := r.inspectEtcd(ctx, s)
	if err != nil {
		return true
	}
	if state.ByName(s.victimNode()) != nil {
		return false
	}
	if id, perr := strconv.ParseUint(ptr.Deref(s.mr.Status.ControlPlane, caprv1.ControlPlaneRemediationStatus{}).MemberID, 16, 64); perr == nil && state.ByID(id) != nil {
		return false
	}
	return true
}

// undo returns the control plane to how the remediation found it: replicas back to N, the
// provider's annotations (KCP's remediation-in-progress naming the victim) removed, the lock released.
// It says what it did.
func (r *Reconciler) undo(ctx context.Context, s *scope) (string, error) {
	var did []string
	if cp := s.mr.Status.ControlPlane; cp != nil && cp.DesiredReplicas != nil && s.cp != nil {
		// Before the point of no return every control-plane Machine created since the start is this
		// remediation's surge: the provider is to remove those when it scales back, not an old one.
		reps := replacements(s)
		if err := r.markForDeletion(ctx, reps); err != nil {
			return "", err
		}
		if len(reps) > 0 {
			did = append(did, fmt.Sprintf("replacement %v marked %s", machineNames(reps), clusterv1.DeleteMachineAnnotation))
		}
		cleared := false
		current, target, err := r.setReplicasDecided(ctx, s, func(current int32) (int32, bool) {
			if current != *cp.DesiredReplicas && current != *cp.DesiredReplicas+surge(s) {
				return current, true // changed by someone else since the surge: theirs, not undone
			}
			return *cp.DesiredReplicas, true
		}, func(u *unstructured.Unstructured) error {
			cleared = s.adapter.ClearScaleUp(u, s.mr.Name)
			return nil
		})
		if err != nil {
			return "", err
		}
		switch {
		case current != *cp.DesiredReplicas && current == target:
			did = append(did, fmt.Sprintf("replicas left at %d (%s)", current, replicasChangedElsewhere))
		case current != target:
			did = append(did, fmt.Sprintf("replicas back from %d to %d", current, target))
		}
		if cleared {
			did = append(did, "the provider's remediation annotation removed")
		}
		// A surge the provider created after this reconcile's cached read (it acts on the replicas
		// as soon as they change) would be an unmarked Machine too many once replicas are back: the
		// provider would then scale down an old Machine, possibly the victim, unfenced (fault-suite
		// seed 500014). The Machines are read again live, after the replicas went back.
		late, err := r.lateReplacements(ctx, s, reps)
		if err != nil {
			return "", err
		}
		if err := r.markForDeletion(ctx, late); err != nil {
			return "", err
		}
		if len(late) > 0 {
			did = append(did, fmt.Sprintf("replacement %v, created meanwhile, marked %s", machineNames(late), clusterv1.DeleteMachineAnnotation))
		}
		did = append(did, r.deleteLeftBehind(ctx, s, append(reps, late...))...)
	}
	if findStep(s.mr, caprv1.EscalationStepName(0)) != nil {
		if err := r.escalationRunner().DeleteStarted(ctx, s.mr); err != nil {
			return "", err
		}
		did = append(did, "the escalation's objects deleted")
	}
	if !fencing.Owed(s.mr) { // a fenced victim keeps the hook until it is unfenced (unfenceEnded)
		if err := r.removeFenceHook(ctx, s); err != nil {
			return "", err
		}
	}
	if l := lockOf(s.cp); l != nil && l.MachineRemediation == s.mr.Name {
		did = append(did, "the control-plane lock released")
	}
	if err := r.releaseLock(ctx, s); err != nil {
		return "", err
	}
	if len(did) == 0 {
		return "nothing had been changed", nil
	}
	return strings.Join(did, ", "), nil
}

// lateReplacements reads the cluster's control-plane Machines live and returns the replacements
// (Machines created since the start) that known does not have.
func (r *Reconciler) lateReplacements(ctx context.Context, s *scope, known []*clusterv1.Machine) ([]*clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := r.APIReader.List(ctx, list, client.InNamespace(s.cluster.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: s.cluster.Name}, client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
		return nil, fmt.Errorf("listing control-plane Machines: %w", err)
	}
	seen := map[string]bool{}
	for _, m := range known {
		seen[m.Name] = true
	}
	live := &scope{mr: s.mr}
	for i := range list.Items {
		live.machines = append(live.machines, &list.Items[i])
	}
	var out []*clusterv1.Machine
	for _, m := range replacements(live) {
		if !seen[m.Name] {
			out = append(out, m)
		}
	}
	return out, nil
}

// markForDeletion annotates Machines with cluster.x-k8s.io/delete-machine, which CAPI's
// control-plane providers delete first on scale-down.
func (r *Reconciler) markForDeletion(ctx context.Context, machines []*clusterv1.Machine) error {
	for _, m := range machines {
		if _, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]; ok {
			continue
		}
		base := m.DeepCopy()
		annotations.AddAnnotations(m, map[string]string{clusterv1.DeleteMachineAnnotation: "capr"})
		if err := r.Client.Patch(ctx, m, client.MergeFrom(base)); err != nil {
			return fmt.Errorf("annotating replacement Machine %s for deletion: %w", m.Name, err)
		}
	}
	return nil
}

// deleteLeftBehind deletes, once replicas are back to N, the replacements the provider would not
// remove by scaling down: one without a Node yet (KCP and the sandbox's provider scale down only when
// nothing is provisioning, and a replacement that cannot join — etcd refuses a new member while
// another is down — never finishes), and any while the provider's scale-down preflight refuses
// (KCP while another control-plane Machine is unhealthy). The provider's own deletion path removes
// whatever etcd member the replacement got. Best effort: it says what it could not delete, and the
// marked Machine is still the provider's first choice.
func (r *Reconciler) deleteLeftBehind(ctx context.Context, s *scope, reps []*clusterv1.Machine) []string {
	var did []string
	for _, m := range reps {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		why := ""
		if !m.Status.NodeRef.IsDefined() {
			why = "it had no Node yet"
		} else if refusal := s.adapter.ScaleDownRefusal(ProviderView{ControlPlane: s.cp, Machines: s.machines, Victim: m}); refusal != "" {
			why = refusal
		}
		if why == "" {
			continue
		}
		if err := r.Client.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Deleting a replacement the provider would not remove", "replacement", klog.KObj(m))
			did = append(did, fmt.Sprintf("replacement %s could not be deleted (%v): the provider removes it when it scales down", m.Name, err))
			continue
		}
		did = append(did, fmt.Sprintf("replacement %s deleted (%s)", m.Name, why))
	}
	return did
}

// fail ends the remediation after undoing it: a person (or the retry annotation) starts it again. A
// deletion of the victim held by the hook is fenced first; a fence left is undone afterwards
// (reconcileFinishedFence), so the control plane is not held meanwhile.
func (r *Reconciler) fail(ctx context.Context, s *scope, reason, msg string) (ctrl.Result, error) {
	if done, res, err := r.fenceHeldFirst(ctx, s); !done || err != nil {
		return res, err
	}
	undone, err := r.undo(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	msg = fmt.Sprintf("%s; left as found: %s. Annotate the MachineRemediation with %s to try again", msg, undone, caprv1.RetryAnnotation)
	s.mr.Status.Phase = caprv1.MachineRemediationPhaseFailed
	s.mr.Status.CompletionTime = ptr.To(metav1.Now())
	s.mr.Status.LastError = msg
	conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationSucceededCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	r.event(s.mr, corev1.EventTypeWarning, EventRemediationFailed, msg)
	metrics.RemediationFinished(metrics.KindControlPlane, string(caprv1.MachineRemediationPhaseFailed))
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation failed", "reason", reason, "message", msg)
	return ctrl.Result{}, nil
}

// reconcileMachineGone handles a running remediation whose Machine no longer exists.
func (r *Reconciler) reconcileMachineGone(ctx context.Context, s *scope) (ctrl.Result, error) {
	if current := currentStep(s.mr); current == caprv1.StepDelete || current == "" {
		return r.runSteps(ctx, s)
	}
	if r.pastPointOfNoReturn(ctx, s) {
		// The victim lost its member and is gone: what is left is to get the replacement.
		return r.runSteps(ctx, s)
	}
	return r.fail(ctx, s, caprv1.MachineRemediationCannotRemediateReason, fmt.Sprintf(
		"Machine %s was deleted by someone else during step %s", s.mr.Name, currentStep(s.mr)))
}
