package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/fencing"
)

// Default step timeouts (ControlPlaneRemediationSpec.replacementTimeoutSeconds, stepTimeoutSeconds).
const (
	DefaultReplacementTimeout = 30 * time.Minute
	DefaultStepTimeout        = 10 * time.Minute
)

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
		remediation.SetWaiting(s.mr, caprv1.MachineRemediationAnotherRemediationInProgressReason, fmt.Sprintf(
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
				remediation.SetWaiting(s.mr, caprv1.MachineRemediationAnotherRemediationInProgressReason, fmt.Sprintf(
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
	if s.mr.Status.ControlPlane.Undo != nil {
		// Being undone (it waits for the provider): nothing else is done meanwhile.
		_, res, err := r.continueUndo(ctx, s)
		return res, err
	}
	if stopped, err := r.stopForSkipRemediation(ctx, s); stopped || err != nil {
		return ctrl.Result{}, err
	}
	if done, err := r.replacementWaitEnds(ctx, s); done || err != nil {
		return ctrl.Result{}, err
	}
	if res, done, err := r.checkStepTimeout(ctx, s); done || err != nil {
		return res, err
	}
	if yielded, res, err := r.yieldToMoreBroken(ctx, s); yielded || err != nil {
		return res, err
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
// down while this one's is healthy (YieldTo), as long as this one may still give way (mayGiveWay):
// replicas back, lock released, Pending again (undoThen). Without it the running remediation would wait for its
// timeout at the quorum check and the broken member would wait behind it. yielded reports that it
// gives way (res then says when to look again).
func (r *Reconciler) yieldToMoreBroken(ctx context.Context, s *scope) (yielded bool, res ctrl.Result, err error) {
	if s.machineGone {
		return false, ctrl.Result{}, nil
	}
	list := &caprv1.MachineRemediationList{}
	if err := r.Client.List(ctx, list, client.InNamespace(s.mr.Namespace)); err != nil {
		return false, ctrl.Result{}, fmt.Errorf("listing MachineRemediations: %w", err)
	}
	othersWait := false
	for _, other := range list.Items {
		if other.Name != s.mr.Name && (other.Status.Phase == "" || other.Status.Phase == caprv1.MachineRemediationPhasePending) {
			othersWait = true
		}
	}
	if !othersWait || !r.mayGiveWay(ctx, s) {
		// Nobody waits, or this one may not give way any more (with external etcd no victim is more
		// broken than another: first come, first served).
		return false, ctrl.Result{}, nil
	}
	state, err := r.inspectEtcd(ctx, s) // once per reconcile: the state mayGiveWay read
	if err != nil {
		return false, ctrl.Result{}, nil //nolint:nilerr // without etcd state nobody can be judged more broken: the steps say why they wait
	}
	waiting, err := r.waitingCandidates(ctx, s, state)
	if err != nil {
		return false, ctrl.Result{}, err
	}
	other := YieldTo(candidate(s.mr, s.machine, state), waiting)
	if other == "" {
		return false, ctrl.Result{}, nil
	}
	why := victimMember(state, machineNode(s.machines, other))
	_, res, err = r.undoThen(ctx, s, caprv1.MachineRemediationPhasePending, caprv1.MachineRemediationAnotherRemediationInProgressReason, func(undone string) string {
		return fmt.Sprintf("the etcd member of control-plane Machine %s is %s and this one's is healthy: removing a healthy member now would not be quorum-safe, so this remediation gave way before its point of no return (%s) and waits for that one",
			other, why, undone)
	})
	return true, res, err
}

// notQuorumSafeUndoAfter is how long a step waits for a quorum-safe membership change before the remediation
// gives way: long enough that a member's brief unhealthiness does not undo a surge, short enough that
// the control plane is not held for the step timeout by a remediation that cannot go on.
const notQuorumSafeUndoAfter = 30 * time.Second

// mayUndoNotQuorumSafe reports whether a remediation whose step asks to give way (stepResult.notQuorumSafe) does so
// now: the step has been waiting for the same reason for notQuorumSafeUndoAfter (the Progressing condition's
// reason and last transition, so a restart does not reset it), and it may still give way (mayGiveWay).
func (r *Reconciler) mayUndoNotQuorumSafe(ctx context.Context, s *scope, reason string) bool {
	c := conditions.Get(s.mr, caprv1.MachineRemediationProgressingCondition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reason || now().Sub(c.LastTransitionTime.Time) < notQuorumSafeUndoAfter {
		return false
	}
	return r.mayGiveWay(ctx, s)
}

// mayGiveWay reports whether a running remediation may still be undone to give way (to a more broken
// Machine, yieldToMoreBroken, or because its membership change cannot be made quorum-safe,
// mayUndoNotQuorumSafe): every way of giving way asks it, so that the rule is in one place.
//
// It may not once its victim is about to go (the Machine gone, a fence owed, a deletion held by the
// fence hook), past the point of no return (pastPointOfNoReturn), with external etcd (no membership
// change waits on quorum, and no victim is more broken than another), when etcd cannot be read, or
// when a member joined etcd since the start (membersJoined): undoing then would remove the
// replacement's member, a healthy one once it votes, and keep the broken victim, which is no safer
// than going on and costs a whole further remediation at margin 0.
func (r *Reconciler) mayGiveWay(ctx context.Context, s *scope) bool {
	if s.machineGone || s.externalEtcd() || fencing.Owed(s.mr) || fencing.HeldDeletion(s.machine) || r.pastPointOfNoReturn(ctx, s) {
		return false
	}
	state, err := r.inspectEtcd(ctx, s)
	return err == nil && !membersJoined(s, state)
}

// undoNotQuorumSafe undoes a remediation whose next membership change cannot be made quorum-safe (another
// member went down after the start) and returns it to Pending, where the order is chosen again on the
// etcd state of now. Holding the control plane would only wait for the step timeout: the lock would
// keep every other remediation of the cluster out, and a surge (a replacement that cannot join)
// would stay. Before its point of no return and before any member joined, everything can be undone.
func (r *Reconciler) undoNotQuorumSafe(ctx context.Context, s *scope, step caprv1.StepName, why string) (ctrl.Result, error) {
	_, res, err := r.undoThen(ctx, s, caprv1.MachineRemediationPhasePending, caprv1.MachineRemediationNotQuorumSafeReason, func(undone string) string {
		return fmt.Sprintf("step %s: %s for %s; nothing irreversible was done, so this remediation gave way (%s) and chooses its order again",
			step, why, notQuorumSafeUndoAfter, undone)
	})
	return res, err
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
			step, limit, whyIrreversible(s), replicasString(s), ptr.Deref(s.mr.Status.ControlPlane.DesiredReplicas, 0), rec.Message)
		if !isWaitingFor(s.mr, caprv1.MachineRemediationStepTimedOutReason) {
			r.event(s.mr, corev1.EventTypeWarning, remediation.EventStepTimedOut, msg)
		}
		res, err := r.runSteps(ctx, s)
		if !currentStepDone(s.mr, step) {
			remediation.SetWaiting(s.mr, caprv1.MachineRemediationStepTimedOutReason, msg)
		}
		return res, true, err
	}
	res, err := r.fail(ctx, s, caprv1.MachineRemediationStepTimedOutReason, fmt.Sprintf(
		"step %s did not finish within %s (last: %s)", step, limit, rec.Message))
	return res, true, err
}

// endWithoutReplacement ends, Failed, a remediation whose victim is deleted (its member removed)
// while its replacement does not come up. Nothing is left to undo, and waiting on would hold the
// control-plane lock, and every other request of the cluster with it, for as long as the replacement
// stays down: the replacement's own request among them, should a health check mark it, so that its
// retry limits could never apply. KCP's remediation ends the same way, once the Machine is deleted.
// The provider keeps its replicas and its replacement; a fence still owed is undone as at any end
// (reconcileFinishedFence).
func (r *Reconciler) endWithoutReplacement(ctx context.Context, s *scope, why string) error {
	if err := r.releaseLock(ctx, s); err != nil {
		return err
	}
	rep := "its replacement"
	if name := s.mr.Status.ControlPlane.Replacement; name != "" {
		rep = "its replacement " + name
	}
	r.failed(ctx, s, caprv1.MachineRemediationStepTimedOutReason, fmt.Sprintf(
		"%s; Machine %s is deleted and its etcd member removed, so nothing is undone: the remediation ends and releases the control plane, "+
			"which its provider keeps at %s with %s. A health check that marks the replacement starts its remediation next",
		why, s.mr.Name, replicasString(s), rep))
	return nil
}

// replacementWaitEnds bounds the wait for the replacement of a victim already deleted
// (WaitForReplacement after Delete, where the victim's Machine is usually gone and nothing is left to
// undo): it ends the remediation (endWithoutReplacement) once the step's timeout has passed, or at
// once when a replacement is itself to be remediated (a request for it exists, from a health check
// or a person), since that request waits for the lock this one holds. done reports that it ended.
func (r *Reconciler) replacementWaitEnds(ctx context.Context, s *scope) (done bool, err error) {
	rec := findStep(s.mr, caprv1.StepWaitForReplacement)
	if currentStep(s.mr) != caprv1.StepWaitForReplacement || rec == nil || !StepFinished(findStep(s.mr, caprv1.StepDelete)) {
		return false, nil
	}
	for _, rep := range replacements(s) {
		other := &caprv1.MachineRemediation{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.mr.Namespace, Name: rep.Name}, other); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return false, fmt.Errorf("reading the MachineRemediation of replacement %s: %w", rep.Name, err)
		}
		if !other.DeletionTimestamp.IsZero() || remediation.Terminal(other) {
			continue
		}
		return true, r.endWithoutReplacement(ctx, s, fmt.Sprintf("the replacement %s is itself to be remediated (MachineRemediation %s, reason %q)",
			rep.Name, other.Name, other.Spec.Reason))
	}
	limit := stepTimeout(s.mr, caprv1.StepWaitForReplacement)
	if rec.StartTime == nil || limit == 0 || now().Before(rec.StartTime.Add(limit)) {
		return false, nil
	}
	return true, r.endWithoutReplacement(ctx, s, fmt.Sprintf("step %s did not finish within %s (last: %s)", caprv1.StepWaitForReplacement, limit, rec.Message))
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

// stopForSkipRemediation withdraws a running request whose Machine was given CAPI's
// cluster.x-k8s.io/skip-remediation (a moment before the start, or since), while stopping is still
// safe: the request is deleted, and its deletion undoes what was done (reconcileDelete: replicas
// back, lock released). Past the point of no return the remediation goes on, as a deleted request's
// does. stopped reports that the request was withdrawn.
func (r *Reconciler) stopForSkipRemediation(ctx context.Context, s *scope) (stopped bool, err error) {
	if s.machineGone || !s.mr.DeletionTimestamp.IsZero() || !annotations.HasSkipRemediation(s.machine) || r.pastPointOfNoReturn(ctx, s) {
		return false, nil
	}
	msg := fmt.Sprintf("Machine %s has annotation %s and the remediation can still be undone: the request is withdrawn, and what was done is undone",
		s.machine.Name, clusterv1.MachineSkipRemediationAnnotation)
	if err := r.Client.Delete(ctx, s.mr, client.Preconditions{UID: &s.mr.UID}); client.IgnoreNotFound(err) != nil {
		return false, fmt.Errorf("withdrawing the request of skipped Machine %s: %w", s.machine.Name, err)
	}
	r.event(s.mr, corev1.EventTypeNormal, EventRemediationWithdrawn, msg)
	ctrl.LoggerFrom(ctx).Info("Running remediation withdrawn: the Machine skips remediation")
	return true, nil
}
