package controlplane

import (
	"context"
	"fmt"
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

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/fencing"
)

// This file holds how a remediation is undone (an abort, a timeout, giving way) or failed. The
// running remediation is in running.go, finished and deleted requests in terminal.go.
//
// The point of no return is the removal of the victim's etcd member (or the Delete step): before
// it, everything CAPR did can be undone (replicas back to N, provider annotations and the lock
// cleared); after it, the victim has no member and must be replaced, so an abort finishes the
// sequence and a timeout keeps trying, visibly, holding the lock and the N+1 replicas it owns.

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
	remediation.SetWaiting(s.mr, reason, msg)
}

// whyIrreversible says why a remediation past its point of no return cannot be undone.
func whyIrreversible(s *scope) string {
	if findStep(s.mr, caprv1.StepDelete) != nil {
		return "the victim's deletion has started"
	}
	if scaledDownByProvider(s) {
		return "the victim is being deleted by the provider's scale-down, which the remediation let it do"
	}
	return "the victim's etcd member was already removed"
}

// pastPointOfNoReturn is true once the victim's etcd member may have been removed, the Delete step
// started, or the provider is deleting the victim as the remediation let it (scaledDownByProvider). When etcd cannot be read after RemoveMember started, the answer is yes (the safe side:
// nothing is undone that cannot be).
func (r *Reconciler) pastPointOfNoReturn(ctx context.Context, s *scope) bool {
	if findStep(s.mr, caprv1.StepDelete) != nil || scaledDownByProvider(s) {
		return true
	}
	if findStep(s.mr, caprv1.StepRemoveMember) == nil {
		return false
	}
	state, err := r.inspectEtcd(ctx, s)
	if err != nil {
		return true
	}
	return victimMemberOf(s, state) == nil
}

// undo returns the control plane to how the remediation found it: replicas back to N, the
// provider's annotations (KCP's remediation-in-progress naming the victim) removed, the lock released.
// It says what it did. It does it all at once; undoThen waits between its two parts for the provider
// to observe the replicas set back.
func (r *Reconciler) undo(ctx context.Context, s *scope) (string, error) {
	did, err := r.undoReplicas(ctx, s)
	if err != nil {
		return "", err
	}
	rest, err := r.undoRest(ctx, s)
	if err != nil {
		return "", err
	}
	return undoneString(append(did, rest...)), nil
}

func undoneString(did []string) string {
	if len(did) == 0 {
		return "nothing had been changed"
	}
	return strings.Join(did, ", ")
}

// undoReplicas is the first part of the undo: the remediation's replacements marked for deletion and
// the replicas set back to N (with the provider's annotations for the victim removed). Idempotent.
func (r *Reconciler) undoReplicas(ctx context.Context, s *scope) ([]string, error) {
	cp := s.mr.Status.ControlPlane
	if cp == nil || cp.DesiredReplicas == nil || s.cp == nil {
		return nil, nil
	}
	// A victim marked for the provider's scale-down (one replacement, firstreplacement.go) loses
	// the mark, its replacements deleted first.
	did, err := r.withdrawVictimMark(ctx, s)
	if err != nil {
		return nil, err
	}
	// Before the point of no return every control-plane Machine created since the start is this
	// remediation's surge: the provider is to remove those when it scales back, not an old one.
	reps := replacements(s)
	if err := r.markForDeletion(ctx, reps); err != nil {
		return nil, err
	}
	if len(reps) > 0 {
		did = append(did, fmt.Sprintf("replacement %v marked %s", machineNames(reps), clusterv1.DeleteMachineAnnotation))
	}
	cleared := false
	topology := s.replicasField() == caprv1.ReplicasFieldClusterTopology
	current, target, err := r.setReplicasDecided(ctx, s, func(src replicasSource) (int32, bool) {
		switch {
		case src.current != *cp.DesiredReplicas && src.current != *cp.DesiredReplicas+surge(s):
			// Changed by someone else since the surge: theirs, not undone. (The control-plane
			// object is still written, for the annotations; the Cluster is not: an apply of an
			// unchanged value would take the field from its owner.)
			return src.current, !topology
		case topology && (src.theirs || src.current == *cp.DesiredReplicas):
			// The Cluster's field: taken back only while CAPR's field manager still owns it
			// with the value it set; the provider annotations go with the lock (releaseLock).
			return src.current, false
		}
		return *cp.DesiredReplicas, true
	}, func(u *unstructured.Unstructured) error {
		cleared = s.adapter.ClearScaleUp(u, s.mr.Name)
		return nil
	})
	if left, ok := topologyReplicasLeft(s, err); ok {
		// Nothing to set back: the provider's annotations go with the lock (releaseLock).
		return append(did, left), nil
	}
	if err != nil {
		return nil, err
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
	return did, nil
}

// undoRest is the rest of the undo, once the replicas are back (and, in undoThen, once the provider
// has observed them): a surge Machine created meanwhile marked, replacements the provider would not
// remove deleted, the escalation's objects deleted, the fence hook removed (unless a fence is owed)
// and the lock released.
func (r *Reconciler) undoRest(ctx context.Context, s *scope) ([]string, error) {
	var did []string
	if cp := s.mr.Status.ControlPlane; cp != nil && cp.DesiredReplicas != nil && s.cp != nil {
		// A surge the provider created after this reconcile's cached read (it acts on the replicas
		// as soon as they change) would be an unmarked Machine too many once replicas are back: the
		// provider would then scale down an old Machine, possibly the victim, unfenced. The Machines are read again live, after the replicas went back.
		reps := replacements(s)
		late, err := r.lateReplacements(ctx, s, reps)
		if err != nil {
			return nil, err
		}
		if err := r.markForDeletion(ctx, late); err != nil {
			return nil, err
		}
		if len(late) > 0 {
			did = append(did, fmt.Sprintf("replacement %v, created meanwhile, marked %s", machineNames(late), clusterv1.DeleteMachineAnnotation))
		}
		did = append(did, r.deleteLeftBehind(ctx, s, append(reps, late...))...)
	}
	if findStep(s.mr, caprv1.EscalationStepName(0)) != nil {
		left, err := r.escalationRunner().DeleteStarted(ctx, s.mr)
		if err != nil {
			return nil, err
		}
		did = append(did, "the escalation's objects deleted")
		did = append(did, left...)
	}
	if !fencing.Owed(s.mr) { // a fenced victim keeps the hook until it is unfenced (unfenceEnded)
		if err := r.removeFenceHook(ctx, s); err != nil {
			return nil, err
		}
	}
	if l := lockOf(s.cp); l != nil && l.MachineRemediation == s.mr.Name {
		did = append(did, "the control-plane lock released")
	}
	if err := r.releaseLock(ctx, s); err != nil {
		return nil, err
	}
	return did, nil
}

// Why an undo waits for the provider. KubeadmControlPlane's reconciler reads the
// KCP from its cache when a reconcile begins and creates a Machine when it counts fewer Machines than
// the spec.replicas it read (cluster-api v1.14.2, controlplane/kubeadm/reconcilers/kubeadmcontrolplane:
// kubeadmcontrolplane_controller.go, Reconcile gets the KCP, then reconcile: desiredReplicas :=
// *controlPlane.KCP.Spec.Replicas, and numMachines < desiredReplicas calls scaleUpControlPlane;
// scale.go: the preflight checks, then cloneConfigsAndGenerateMachine). Between that read and the
// create it reads the workload cluster (the Machines' conditions, the etcd members, the preflight
// checks): seconds, and no precondition ties the create to the spec it read. So a reconcile that read
// N+k before the undo set N back can create the surge after the undo read the Machines live; that
// Machine is not marked, and KCP's scale-down then takes the oldest eligible Machine
// (selectMachineForInPlaceUpdateOrScaleDown), possibly the victim, whose hook the undo removed: a
// deletion unfenced. KCP writes status.observedGeneration, the generation of the KCP it read, at the
// end of every reconcile that returns no error (the deferred patchKubeadmControlPlane with
// patch.WithStatusObservedGeneration), and controller-runtime never runs two reconciles of one object
// at once: once observedGeneration reaches the generation of the write that set N back, every
// reconcile that read an older spec has ended, with its Machine created if it made one. The undo
// therefore keeps the control plane (the lock, the hook) until then, and reads the Machines live after.
// Waiting before setting N back until N+k was observed would not do: a reconcile that observed N+k and
// created nothing (a preflight check failing) is followed by others that may still start from a cache
// without the N. A provider without status.observedGeneration cannot be waited for (the undo then
// reads the Machines once, as before: docs/user/known-limits.md).

// undoObserveTimeout bounds the wait: a provider whose reconciles keep failing (a workload cluster it
// cannot reach) never records what it observed. The undo then finishes and says so.
const undoObserveTimeout = 2 * time.Minute

// undoThen undoes the remediation and, once done, ends it as phase (Pending: it gave way or its request
// is being deleted; Failed) with reason and the message built from what was undone. When the
// replicas were raised it does so in two parts (undoReplicas, undoRest) with status.controlPlane.undo
// recorded in between, keeping the control plane until the provider has observed the replicas set
// back (see above); while it waits the request stays Running, says so, and comes back to it whatever
// reconciles it next (continueUndo), with the outcome recorded when it began. done reports whether
// the remediation has ended.
func (r *Reconciler) undoThen(ctx context.Context, s *scope, phase caprv1.RemediationPhase, reason string, message func(undone string) string) (bool, ctrl.Result, error) {
	cp := s.mr.Status.ControlPlane
	if cp == nil || cp.DesiredReplicas == nil || s.cp == nil || (cp.Undo == nil && findStep(s.mr, caprv1.StepScaleUp) == nil) {
		// The replicas were never raised: nothing the provider may still act on.
		undone, err := r.undo(ctx, s)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		r.endUndo(ctx, s, &caprv1.ControlPlaneUndo{Phase: phase, Reason: reason}, message(undone))
		return true, ctrl.Result{RequeueAfter: waitLong}, nil
	}
	u := cp.Undo
	if u == nil {
		u = &caprv1.ControlPlaneUndo{StartTime: metav1.Now(), Phase: phase, Reason: reason}
		cp.Undo = u
		// Recorded before anything is undone: whatever reconciles the request next continues it.
		if err := r.persist(ctx, s); err != nil {
			return false, ctrl.Result{}, err
		}
		u = s.mr.Status.ControlPlane.Undo // persist keeps a copy of the status it wrote
	}
	did, err := r.undoReplicas(ctx, s)
	if err != nil {
		return false, ctrl.Result{}, err
	}
	if u.Message == "" {
		u.Message = message(undoneString(did))
	}
	wait, note := r.waitForProvider(s, u)
	if wait != "" {
		remediation.SetWaiting(s.mr, u.Reason, u.Message+"; "+wait)
		return false, ctrl.Result{RequeueAfter: waitShort}, nil
	}
	// A deletion of the victim held by the hook meanwhile is fenced before undoRest removes the hook.
	if final, res, err := r.fenceHeldFirst(ctx, s); !final || err != nil {
		return false, res, err
	}
	rest, err := r.undoRest(ctx, s)
	if err != nil {
		return false, ctrl.Result{}, err
	}
	msg := u.Message
	if len(rest) > 0 {
		msg += "; then " + strings.Join(rest, ", ")
	}
	if note != "" {
		msg += "; " + note
	}
	r.endUndo(ctx, s, u, msg)
	return true, ctrl.Result{RequeueAfter: waitLong}, nil
}

// continueUndo goes on with an undo begun in an earlier reconcile (status.controlPlane.undo).
func (r *Reconciler) continueUndo(ctx context.Context, s *scope) (bool, ctrl.Result, error) {
	u := s.mr.Status.ControlPlane.Undo
	return r.undoThen(ctx, s, u.Phase, u.Reason, func(string) string { return u.Message })
}

// waitForProvider says what the undo still waits for ("" when nothing): the provider observing the
// replicas set back (providerObserved), for at most undoObserveTimeout. note, when the wait ran out,
// says so for the final message.
func (r *Reconciler) waitForProvider(s *scope, u *caprv1.ControlPlaneUndo) (wait, note string) {
	desired := ptr.Deref(s.mr.Status.ControlPlane.DesiredReplicas, 0)
	pending := providerObserved(s.cp)
	if s.replicasField() == caprv1.ReplicasFieldClusterTopology && !topologyReplicasRemoved(s) {
		// The undo set the Cluster's field back; the topology controller writes it to the control
		// plane later, and until it has, the provider has nothing new to observe.
		if replicas, found, err := unstructured.NestedInt64(s.cp.Object, "spec", "replicas"); err == nil && found && replicas == int64(desired+surge(s)) {
			pending = fmt.Sprintf("the Cluster topology has not set %s %s's replicas back from %d yet", s.cp.GetKind(), s.cp.GetName(), replicas)
		}
	}
	if pending == "" {
		return "", ""
	}
	if now().Sub(u.StartTime.Time) > undoObserveTimeout {
		return "", fmt.Sprintf("the %s did not observe the replicas set back to %d within %s (%s): a Machine it creates from the replicas it read before is not marked %s, look for a control-plane Machine too many",
			s.adapter.Name(), desired, undoObserveTimeout, pending, clusterv1.DeleteMachineAnnotation)
	}
	return fmt.Sprintf("the replicas are back at %d: waiting for the %s to observe them (%s) before the control plane is let go, so that a Machine it creates from the replicas it read before is marked %s",
		desired, s.adapter.Name(), pending, clusterv1.DeleteMachineAnnotation), ""
}

// providerObserved says how far the provider is from having observed the control-plane object's
// spec ("" when it has): its status.observedGeneration against metadata.generation. A provider
// without status.observedGeneration cannot tell: "".
func providerObserved(cp *unstructured.Unstructured) string {
	observed, found, err := unstructured.NestedInt64(cp.Object, "status", "observedGeneration")
	if err != nil || !found || observed >= cp.GetGeneration() {
		return ""
	}
	return fmt.Sprintf("%s %s observed generation %d of %d", cp.GetKind(), cp.GetName(), observed, cp.GetGeneration())
}

// endUndo ends an undone remediation as u says, with msg: Failed (fail), or back to Pending after
// giving way or being aborted, with the event each has always had.
func (r *Reconciler) endUndo(ctx context.Context, s *scope, u *caprv1.ControlPlaneUndo, msg string) {
	log := ctrl.LoggerFrom(ctx)
	switch {
	case u.Phase == caprv1.MachineRemediationPhaseFailed:
		r.failed(ctx, s, u.Reason, msg)
	case u.Reason == caprv1.MachineRemediationAbortedReason:
		r.event(s.mr, corev1.EventTypeNormal, remediation.EventRemediationAborted, msg)
		metrics.RemediationFinished(metrics.KindControlPlane, metrics.ResultAborted)
		log.Info("Control-plane remediation aborted", "undone", msg)
		backToPending(s, u.Reason, msg)
	case u.Reason == caprv1.MachineRemediationNotQuorumSafeReason:
		backToPending(s, u.Reason, msg)
		r.event(s.mr, corev1.EventTypeWarning, EventRemediationYielded, msg)
		log.Info("Control-plane remediation gave way: its membership change cannot be made quorum-safe", "undone", msg)
	default:
		backToPending(s, u.Reason, msg)
		r.event(s.mr, corev1.EventTypeNormal, EventRemediationYielded, msg)
		log.Info("Control-plane remediation gave way to a more broken Machine", "undone", msg)
	}
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
	_, res, err := r.undoThen(ctx, s, caprv1.MachineRemediationPhaseFailed, reason, func(undone string) string {
		return fmt.Sprintf("%s; left as found: %s. Annotate the MachineRemediation with %s to try again", msg, undone, caprv1.RetryAnnotation)
	})
	return res, err
}

// failed records the end of an undone remediation as Failed.
func (r *Reconciler) failed(ctx context.Context, s *scope, reason, msg string) {
	if s.mr.Status.ControlPlane != nil {
		s.mr.Status.ControlPlane.Undo = nil
	}
	s.mr.Status.Phase = caprv1.MachineRemediationPhaseFailed
	s.mr.Status.CompletionTime = ptr.To(metav1.Now())
	s.mr.Status.LastError = msg
	conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationProgressingCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	conditions.Set(s.mr, metav1.Condition{Type: caprv1.MachineRemediationSucceededCondition, Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	r.event(s.mr, corev1.EventTypeWarning, EventRemediationFailed, msg)
	metrics.RemediationFinished(metrics.KindControlPlane, string(caprv1.MachineRemediationPhaseFailed))
	ctrl.LoggerFrom(ctx).Info("Control-plane remediation failed", "reason", reason, "message", msg)
}
