package controlplane

import (
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// One replacement where the provider's admission needs a surge of two (KCP with stacked etcd: an
// even spec.replicas is refused). KCP creates one Machine per reconcile and the next only once its
// scale-up preflight passes, which needs the first one to have a Node and every health condition True,
// or KCP's remediation-in-progress annotation, which KCP deletes when it creates the Machine (Adapter
// Surge, SurgePlan.Machines). So the replicas go N → N+2 and, as soon as the first replacement exists,
// back to N: KCP never creates the second Machine, and only one is needed (once it votes, the
// victim's member can be removed with the margin the cluster had). The steps are those of the order;
// ScaleUp marks the victim first and WaitForReplacement returns the replicas.
//
// The victim carries cluster.x-k8s.io/delete-machine from before the replicas are raised: with N+1
// Machines and N replicas KCP scales down as soon as its preflight passes (the replacement healthy),
// possibly before CAPR's Delete step, and it picks a Machine with that annotation first (scale.go
// selectMachineForInPlaceUpdateOrScaleDown). The mark was written before the replacement existed, so
// KCP's Machine cache, which holds the replacement, holds the mark too (one informer, in
// resourceVersion order). The fence hook holds such a deletion until the victim is fenced
// (fenceDeletingVictim), and KCP's own pre-terminate hook waits for CAPR's and then moves leadership
// and removes the member.

// replacementsWanted is how many replacements the remediation waits for (status.controlPlane.replacements,
// the surge for records without it).
func replacementsWanted(s *scope) int32 {
	cps := s.mr.Status.ControlPlane
	if cps.Replacements > 0 {
		return min(cps.Replacements, surge(s))
	}
	return surge(s)
}

// returnsAtFirstReplacement is true when the replicas go back to N as soon as the first replacement
// exists (one replacement with a surge of two).
func returnsAtFirstReplacement(s *scope) bool {
	return replacementsWanted(s) < surge(s)
}

// scaledDownByProvider reports whether the victim is being deleted, or is gone, after the replicas
// may have returned at the first replacement: that is the provider's scale-down taking the victim, as
// the remediation let it (its member is moved off and removed by the provider's deletion, KCP's
// pre-terminate hook, after CAPR's fence hook), not someone else's doing. Nothing of it can be undone
// then: the remediation goes on to its end (pastPointOfNoReturn) instead of failing or giving way,
// which would delete the replacement the cluster needs.
func scaledDownByProvider(s *scope) bool {
	return s.mr.Status.ControlPlane != nil && returnsAtFirstReplacement(s) && findStep(s.mr, caprv1.StepWaitForReplacement) != nil &&
		(s.machineGone || s.machine != nil && !s.machine.DeletionTimestamp.IsZero())
}

// capr is the value CAPR writes in cluster.x-k8s.io/delete-machine, so that it can tell its own
// mark from one a person or another controller set.
const capr = "capr"

// markVictim puts cluster.x-k8s.io/delete-machine on the victim (idempotent; a value set by someone
// else is left as it is).
func (r *Reconciler) markVictim(ctx context.Context, s *scope) error {
	if s.machineGone || s.machine == nil {
		return nil
	}
	if _, ok := s.machine.Annotations[clusterv1.DeleteMachineAnnotation]; ok {
		return nil
	}
	base := s.machine.DeepCopy()
	annotations.AddAnnotations(s.machine, map[string]string{clusterv1.DeleteMachineAnnotation: capr})
	if err := r.Client.Patch(ctx, s.machine, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("annotating Machine %s %s: %w", s.machine.Name, clusterv1.DeleteMachineAnnotation, err)
	}
	return nil
}

// returnReplicasAtFirstReplacement returns the replicas from N+2 to N once the first replacement
// exists (reps, oldest first, at least one). The write is conditional on the replicas being N+2
// (setReplicasDecided): replicas someone else changed are theirs. Should the provider have created
// a second Machine before (CAPR was not running), the remediation waits for both as before a surge
// of two, recorded in status.controlPlane.replacements, which note says.
func (r *Reconciler) returnReplicasAtFirstReplacement(ctx context.Context, s *scope, reps []*clusterv1.Machine) (note string, err error) {
	cps := s.mr.Status.ControlPlane
	desired := ptr.Deref(cps.DesiredReplicas, 0)
	if int32(len(reps)) > replacementsWanted(s) {
		cps.Replacements = int32(len(reps))
		return fmt.Sprintf("; the %s created %d replacements before the replicas could return to %d, so the remediation waits for both", s.adapter.Name(), len(reps), desired), nil
	}
	// The victim was marked at ScaleUp; a record of an older CAPR may not have it.
	if err := r.markVictim(ctx, s); err != nil {
		return "", err
	}
	current, _, err := r.setReplicasDecided(ctx, s, func(src replicasSource) (int32, bool) {
		return desired, src.current == desired+surge(s) && !src.theirs
	}, nil)
	switch {
	case err != nil:
		return "", err
	case current == desired+surge(s):
		return fmt.Sprintf("; replicas back from %d to %d: %s is the one replacement", current, desired, reps[0].Name), nil
	case current != desired:
		return fmt.Sprintf("; %s %s replicas are %d, %s", s.cp.GetKind(), s.cp.GetName(), current, replicasChangedElsewhere), nil
	}
	return "", nil
}

// scaleUpStamp is the time BeforeScaleUp records for the first replacement: a second before the
// remediation started, but not before the newest control-plane Machine. KCP drops its
// remediation-in-progress as stale once a Machine newer than the stamp exists (remediation.go
// reconcileUnhealthyMachines), and creation times are whole seconds: so the replacement, even one
// created in the second the remediation started, makes it stale, and a reconcile of KCP that still
// reads the annotation from its cache after creating the replacement drops it instead of taking the
// relaxed preflight for a second Machine at once. No Machine that existed before the start is newer.
func scaleUpStamp(s *scope) time.Time {
	stamp := s.mr.Status.StartTime.Time.Truncate(time.Second).Add(-time.Second)
	for _, m := range s.machines {
		if t := m.CreationTimestamp.Time; t.After(stamp) && slices.Contains(s.mr.Status.ControlPlane.MachinesBefore, m.Name) {
			stamp = t
		}
	}
	return stamp
}

// withdrawVictimMark is the first part of an undo when the victim carries CAPR's
// cluster.x-k8s.io/delete-machine before the Delete step (one replacement): the replacements are
// deleted first, then the mark removed (and undo returns the replicas to N). In that order no
// scale-down of the provider's takes the victim for the undo: while a replacement is being deleted
// KCP neither scales up nor down (its preflight waits for deleting Machines), and a Machine deletion
// waits for its finalizers (drain, hooks, infrastructure) far longer than the next two API calls take,
// after which the control plane has N Machines and nothing to scale down. Deleting a
// replacement removes its etcd member through the provider's deletion (KCP's pre-terminate hook),
// back to the members of the start.
func (r *Reconciler) withdrawVictimMark(ctx context.Context, s *scope) ([]string, error) {
	if s.machineGone || s.machine == nil || !s.machine.DeletionTimestamp.IsZero() ||
		s.machine.Annotations[clusterv1.DeleteMachineAnnotation] != capr || findStep(s.mr, caprv1.StepDelete) != nil {
		return nil, nil
	}
	var did []string
	for _, m := range replacements(s) {
		if err := r.Client.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("deleting replacement %s: %w", m.Name, err)
		}
		// Being deleted, or gone: not a replacement for the rest of the undo (replacements).
		m.DeletionTimestamp = ptr.To(metav1.Now())
		did = append(did, fmt.Sprintf("replacement %s deleted", m.Name))
	}
	base := s.machine.DeepCopy()
	delete(s.machine.Annotations, clusterv1.DeleteMachineAnnotation)
	if err := r.Client.Patch(ctx, s.machine, client.MergeFrom(base)); err != nil {
		return nil, fmt.Errorf("removing %s from Machine %s: %w", clusterv1.DeleteMachineAnnotation, s.machine.Name, err)
	}
	return append(did, fmt.Sprintf("%s removed from Machine %s", clusterv1.DeleteMachineAnnotation, s.machine.Name)), nil
}
