package controlplane

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/fencing"
)

func (r *Reconciler) stepFence(ctx context.Context, s *scope, rec *caprv1.RemediationStep) (stepResult, error) {
	if s.machineGone {
		// Deleted by someone else past the point of no return: its deletion was held by the hook until
		// fenceDeletingVictim's fence was final (recorded in status.fencing, unfenced when the
		// remediation ends). Nothing is left to fence before a delete.
		return stepResult{StepResult: remediation.StepResult{Done: true, Message: fmt.Sprintf("Machine %s is gone, deleted by someone else (a deletion held by the fence hook is fenced first)", s.mr.Name)}}, nil
	}
	res, err := fencing.FenceRecorded(ctx, r.Fencer, s.mr, fencing.Request{
		Cluster: s.cluster, Machine: s.machine, Node: s.victimNode(), Spec: fencing.SpecOf(s.mr), Started: rec.StartTime.Time,
	}, time.Now(), r.persistFunc(s))
	if err != nil {
		return stepResult{}, err
	}
	v := fencing.Judge(res, fencing.SpecOf(s.mr), rec.StartTime.Time, time.Now())
	if !v.Done {
		reason := caprv1.MachineRemediationWaitingForFencingReason
		if v.TimedOut {
			reason = caprv1.MachineRemediationStepTimedOutReason
		}
		return stepResult{StepResult: remediation.StepResult{WaitReason: reason, Message: v.Message, Requeue: v.Requeue}}, nil
	}
	// Whoever deletes the victim now may: the fence is confirmed (or the policy lets it go).
	if err := r.removeFenceHook(ctx, s); err != nil {
		return stepResult{}, err
	}
	if v.GaveUp {
		r.event(s.mr, corev1.EventTypeWarning, remediation.EventFencingGaveUp, v.Message)
	}
	metrics.Fenced(metrics.KindControlPlane, v.Outcome(), time.Since(rec.StartTime.Time))
	return stepResult{StepResult: remediation.StepResult{Done: true, Skipped: v.Skipped, Message: v.Message}}, nil
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
		if Surges(s.mr.Status.ControlPlane.Order) {
			if note, err = r.replicasBack(ctx, s); err != nil {
				return stepResult{}, err
			}
		}
		res, err := r.waitForDesiredMachines(ctx, s)
		res.Message += note
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
	surged := Surges(cps.Order)
	skip, why := drainSkipped(s, m)
	if !m.DeletionTimestamp.IsZero() {
		// Being deleted: by this step before a crash (held by the replicas-back hook until the
		// replicas are back), or by someone else (a rollout, a person). The surge still has to go.
		// A drain that started before the Node went silent is skipped from now on.
		if err := r.skipDrain(ctx, s, m, skip, why); err != nil {
			return stepResult{}, err
		}
		note := ""
		if surged {
			var err error
			if note, err = r.replicasBack(ctx, s); err != nil {
				return stepResult{}, err
			}
		}
		held, err := r.releaseReplicasBackHook(ctx, s, note != "")
		if err != nil {
			return stepResult{}, err
		}
		if held == "" {
			if held, err = r.releaseQuorumSafeHook(ctx, s, m); err != nil {
				return stepResult{}, err
			}
		}
		return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("Machine %s is being deleted%s%s", m.Name, note, held), Requeue: heldRequeue(held)}}, nil
	}
	want := map[string]string{clusterv1.DeleteMachineAnnotation: "capr"}
	if surged {
		want[caprv1.ReplicasBackHookAnnotation] = s.mr.Name
	}
	if holdsMemberRemoval(s) {
		want[caprv1.QuorumSafeHookAnnotation] = s.mr.Name
	}
	if base := m.DeepCopy(); annotations.AddAnnotations(m, want) {
		if err := r.Client.Patch(ctx, m, client.MergeFrom(base)); err != nil {
			return stepResult{}, fmt.Errorf("annotating Machine %s for deletion: %w", m.Name, err)
		}
	}
	// Before the delete, so that CAPI never starts a drain that cannot finish.
	if err := r.skipDrain(ctx, s, m, skip, why); err != nil {
		return stepResult{}, err
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
	// Machines), and the replicas-back hook keeps it deleting, not gone, until the replicas are
	// back to N, even if this controller dies between the two writes (TestCrashSafety's "victim
	// deleted" point): gone at the surged replicas, the provider would replace it, then scale a healthy
	// Machine down, unfenced, when the replicas came back.
	if err := r.Client.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
		return stepResult{}, fmt.Errorf("deleting Machine %s: %w", m.Name, err)
	}
	if !surged {
		// Nothing was scaled (Replace: not initialized; DeleteFirst, DeleteBeforeMemberRemoval: no
		// surge): the provider creates a new Machine.
		return stepResult{StepResult: remediation.StepResult{Message: "deleted the Machine; the provider creates a new one", Requeue: waitShort}}, nil
	}
	note, err := r.replicasBack(ctx, s)
	if err != nil {
		return stepResult{}, err
	}
	held, err := r.releaseReplicasBackHook(ctx, s, note != "")
	if err != nil {
		return stepResult{}, err
	}
	if note != "" {
		return stepResult{StepResult: remediation.StepResult{Message: "deleting Machine " + m.Name + note, Requeue: waitShort}}, nil
	}
	return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("deleting Machine %s; replicas back to %d%s%s",
		m.Name, ptr.Deref(cps.DesiredReplicas, 0), held, s.adapter.Explain(s.cp)), Requeue: heldRequeue(held)}}, nil
}

// drainSkipped tells whether CAPI must not drain the victim: its Node is unreachable (the Machine's
// NodeReady condition is Unknown: the kubelet is silent, or CAPI cannot reach the workload cluster)
// and its etcd member was removed before this delete (the RemoveMember step finished). The victim's
// kube-apiserver then still runs, as nothing restarts it without its kubelet, but it cannot serve:
// kubeadm's stacked API server talks only to its local etcd member, which has left the cluster. A
// connection CAPI's ClusterCache holds to it through the load balancer stays on it, because the
// cache's health probe (GET /) is answered without etcd, and every cordon and eviction sent on it
// times out; CAPI retries the drain for ever, so the Machine is never deleted (seen on kind when the
// etcd leader's kubelet stopped: docs/developer/kind.md). The drain gains nothing on an unreachable
// Node anyway: CAPI waits only a second for its pods and does not wait for its volumes there
// (core/reconcilers/machine: drainNode and shouldWaitForNodeVolumes check
// noderefutil.IsNodeUnreachable). A reachable Node is drained: its kubelet restarts an API server that
// cannot serve, which closes the connections it held. why says so, for the step's message and event.
func drainSkipped(s *scope, m *clusterv1.Machine) (skip bool, why string) {
	removed := findStep(s.mr, caprv1.StepRemoveMember)
	if removed == nil || (removed.Outcome != caprv1.StepOutcomeSucceeded && removed.Outcome != caprv1.StepOutcomeSkipped) {
		return false, ""
	}
	ready := conditions.Get(m, clusterv1.MachineNodeReadyCondition)
	if ready == nil || ready.Status != metav1.ConditionUnknown {
		return false, ""
	}
	return true, fmt.Sprintf("CAPI skips the drain of Machine %s and the wait for its volumes: its Node is unreachable (%s: %s) and its etcd member is gone, so its API server cannot serve a drain",
		m.Name, clusterv1.MachineNodeReadyCondition, ready.Reason)
}

// skipDrain puts CAPI's annotations that skip the drain and the wait for volume detachment on the
// victim when drainSkipped says so, with a Normal event the first time.
func (r *Reconciler) skipDrain(ctx context.Context, s *scope, m *clusterv1.Machine, skip bool, why string) error {
	if !skip {
		return nil
	}
	base := m.DeepCopy()
	if !annotations.AddAnnotations(m, map[string]string{clusterv1.ExcludeNodeDrainingAnnotation: "capr", clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation: "capr"}) {
		return nil
	}
	if err := r.Client.Patch(ctx, m, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("annotating Machine %s to skip its drain: %w", m.Name, err)
	}
	r.event(s.mr, corev1.EventTypeNormal, EventDrainSkipped, why)
	return nil
}

// heldRequeue is the Delete step's requeue: while the replicas-back hook holds the victim, the step
// waits for the Cluster topology to bring the replicas to the control-plane object, which is read
// live and not watched, so it looks again soon; otherwise the victim's deletion is watched.
func heldRequeue(held string) time.Duration {
	if held != "" {
		return pollUnwatched
	}
	return waitShort
}

// releaseReplicasBackHook takes caprv1.ReplicasBackHookAnnotation off the victim once the provider
// sees the replicas back (or left is true: they were left to whoever changed them): CAPI may then
// finish deleting it. With the Cluster topology's field, replicasBack wrote the Cluster and the
// topology controller brings the value to the control-plane object later; until the live object no
// longer asks for the surge the victim stays held, and held says so for the step's message. The
// Machine is read live, as the hook may have been added a moment ago by a controller that has since
// died.
func (r *Reconciler) releaseReplicasBackHook(ctx context.Context, s *scope, left bool) (held string, err error) {
	key := client.ObjectKey{Namespace: s.mr.Namespace, Name: s.mr.Name}
	if !left && s.replicasField() == caprv1.ReplicasFieldClusterTopology {
		m := &clusterv1.Machine{}
		if err := r.APIReader.Get(ctx, key, m); err != nil {
			return "", client.IgnoreNotFound(err)
		}
		if _, ok := m.Annotations[caprv1.ReplicasBackHookAnnotation]; !ok {
			return "", nil
		}
		cp := s.cp.DeepCopy()
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
			return "", fmt.Errorf("reading %s %s: %w", cp.GetKind(), cp.GetName(), err)
		}
		surged := ptr.Deref(s.mr.Status.ControlPlane.DesiredReplicas, 0) + surge(s)
		if n, err := Replicas(cp); err != nil || n == surged {
			return fmt.Sprintf("; held by %s until the Cluster topology brings the replicas to %s %s (%d now)",
				caprv1.ReplicasBackHookAnnotation, cp.GetKind(), cp.GetName(), n), err
		}
	}
	_, _, err = remediation.RemoveMachineAnnotations(ctx, r.Client, r.APIReader, key, caprv1.ReplicasBackHookAnnotation)
	return "", err
}

// holdsMemberRemoval reports whether the victim's deletion is held by QuorumSafeHookAnnotation: the
// provider removes its member during the deletion (DeleteBeforeMemberRemoval), which stacked etcd
// needs.
func holdsMemberRemoval(s *scope) bool {
	return s.mr.Status.ControlPlane.Order == caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval && !s.externalEtcd()
}

// releaseQuorumSafeHook removes QuorumSafeHookAnnotation from the victim m, being deleted, once CAPR's
// own reading of etcd says that removing its member keeps quorum (quorum.CanRemoveMember), or the
// member is gone; until then it returns why the hook holds. Where the removal is not quorum-safe
// because other Machines' members are down (a second failure during the deletion), those of them
// CAPR's health check marks for their member are removed first (downMarkedMembers): a member that
// does not vote goes without lowering the failure margin, and it is what the removal of the victim's
// waits for. KCP's hook judges from its Machine conditions, which show a member whose process died
// healthy for minutes: it asks etcd to remove the victim's member, etcd refuses (its strict
// reconfiguration check: the voters left would lack a healthy quorum) on every retry, and the
// deletion never ends (test/kubeadm/more TestKCPSecondFailureWhileTheProviderHoldsTheMember).
func (r *Reconciler) releaseQuorumSafeHook(ctx context.Context, s *scope, m *clusterv1.Machine) (held string, err error) {
	if _, ok := m.Annotations[caprv1.QuorumSafeHookAnnotation]; !ok {
		return "", nil
	}
	state, err := r.inspectEtcd(ctx, s)
	if err != nil {
		return fmt.Sprintf("; held by %s: etcd cannot be read to tell whether removing its member keeps quorum (%v)", caprv1.QuorumSafeHookAnnotation, err), nil
	}
	removed := ""
	if victim := victimMemberOf(s, state); victim != nil {
		safe := func() bool {
			return etcdutil.CanRemoveMember(state.Counts(), etcdutil.Victim{Healthy: victim.Up(), Learner: victim.IsLearner})
		}
		if !safe() {
			if gone := r.removeDownMembers(ctx, s, state, downMarkedMembers(state, s.mr.Name, s.machines)); len(gone) > 0 {
				removed = "; removed the down members of other Machines first: " + strings.Join(gone, ", ")
				r.event(s.mr, corev1.EventTypeNormal, EventDownMemberRemoved, "removed the down etcd members of other Machines, which kept the provider from removing the victim's: "+strings.Join(gone, ", "))
			}
		}
		if !safe() {
			c := state.Counts()
			return fmt.Sprintf("%s; held by %s: removing its member now would not keep quorum (%d/%d voting members healthy, %d learners)",
				removed, caprv1.QuorumSafeHookAnnotation, c.Healthy, c.Voting, c.Learners), nil
		}
	}
	if _, _, err := remediation.RemoveMachineAnnotations(ctx, r.Client, r.APIReader, client.ObjectKeyFromObject(m), caprv1.QuorumSafeHookAnnotation); err != nil {
		return "", err
	}
	return removed, nil
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
	theirs := false
	current, _, err := r.setReplicasDecided(ctx, s, func(src replicasSource) (int32, bool) {
		// The Cluster topology's field is taken back only while CAPR's field manager owns it.
		theirs = src.theirs && src.current != desired
		return desired, src.current == desired+surge(s) && !theirs
	}, nil)
	left, removed := topologyReplicasLeft(s, err)
	switch {
	case removed:
		// Past the point of no return the victim is deleted whatever the replicas: they are the
		// provider's now, and the hook holding the victim goes (releaseReplicasBackHook, left).
	case err != nil || current == desired || (current == desired+surge(s) && !theirs):
		return "", err
	default:
		owners := ""
		if s.replicasField() == caprv1.ReplicasFieldClusterTopology && s.liveCluster != nil {
			owners = " by " + topologyReplicasOwners(s.liveCluster)
		}
		left = fmt.Sprintf("%s replicas are %d, %s%s (it set %d, from %d), so CAPR leaves them",
			replicasFieldName(s), current, replicasChangedElsewhere, owners, desired+surge(s), desired)
	}
	if rec := findStep(s.mr, caprv1.StepDelete); rec == nil || !strings.Contains(rec.Message, replicasChangedElsewhere) {
		r.event(s.mr, corev1.EventTypeWarning, EventReplicasChangedElsewhere, left)
	}
	return "; " + left, nil
}

// replicasChangedElsewhere is how a step's message says that the replicas were changed by someone
// other than CAPR during the remediation.
const replicasChangedElsewhere = "changed by someone else during the remediation"

// waitForDesiredMachines finishes the Delete step once the victim is gone and the provider is back
// at desiredReplicas Machines, none deleting (after a surge of two it also removes a second Machine).
func (r *Reconciler) waitForDesiredMachines(ctx context.Context, s *scope) (stepResult, error) {
	cps := s.mr.Status.ControlPlane
	desired := ptr.Deref(cps.DesiredReplicas, 0)
	if current, err := Replicas(s.cp); err == nil && current != desired && (current != desired+surge(s) || topologyReplicasRemoved(s)) {
		desired = current // changed by someone else (replicasBack left them): the provider scales to theirs
	}
	if Surges(cps.Order) {
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
			return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("Machine %s deleted; waiting for the %s to scale to %d Machines (%d, %d deleting)%s",
				s.mr.Name, s.adapter.Name(), desired, live, deleting, s.adapter.Explain(s.cp)), Requeue: waitShort}}, nil
		}
	}
	return stepResult{StepResult: remediation.StepResult{Done: true, Message: fmt.Sprintf("Machine %s deleted; the %s is at %d Machines", s.mr.Name, s.adapter.Name(), desired)}}, nil
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
		return stepResult{StepResult: remediation.StepResult{Message: fmt.Sprintf("Machine %s deleted; surplus replacement %s marked %s (%s)",
			s.mr.Name, surplus.Name, clusterv1.DeleteMachineAnnotation, refusal), Requeue: waitShort}}, true, nil
	}
	if err := r.Client.Delete(ctx, surplus); client.IgnoreNotFound(err) != nil {
		return stepResult{}, true, fmt.Errorf("deleting surplus replacement %s: %w", surplus.Name, err)
	}
	msg := fmt.Sprintf("Machine %s deleted; the %s does not scale down (%s), so CAPR deleted the surplus replacement %s itself",
		s.mr.Name, s.adapter.Name(), refusal, surplus.Name)
	r.event(s.mr, corev1.EventTypeNormal, EventSurplusReplacementDeleted, msg)
	return stepResult{StepResult: remediation.StepResult{Message: msg, Requeue: waitShort}}, true, nil
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
	r.event(s.mr, corev1.EventTypeNormal, remediation.EventRemediationSucceeded, msg)
	metrics.RemediationFinished(metrics.KindControlPlane, string(caprv1.MachineRemediationPhaseSucceeded))
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation succeeded", "replacement", s.mr.Status.ControlPlane.Replacement)
	return ctrl.Result{}, nil
}
