package controlplane

import (
	"context"
	"fmt"
	"strconv"
	"strings"

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
