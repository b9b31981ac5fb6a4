package controlplane

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation/fencing"
)

// Fence before delete, whoever deletes: a running remediation keeps CAPI's pre-drain deletion hook
// caprv1.FenceBeforeDeleteHookAnnotation on its victim until the Fence step has finished. The Delete
// step is not the only way the victim can go — a KCP rollout started mid-remediation scales down
// outdated Machines first, a person may delete it — and CAPI's Machine controller drains and deletes
// a Machine only once every pre-drain hook is gone (internal/controllers/machine, reconcileDelete).

// fenceFinished is true once the Fence step succeeded or was skipped by policy.
func fenceFinished(mr *caprv1.MachineRemediation) bool {
	fence := findStep(mr, caprv1.StepFence)
	return fence != nil && (fence.Outcome == caprv1.StepOutcomeSucceeded || fence.Outcome == caprv1.StepOutcomeSkipped)
}

// ensureFenceHook puts the hook on the victim while it exists and is not fenced yet.
func (r *Reconciler) ensureFenceHook(ctx context.Context, s *scope) error {
	if s.machineGone || s.machine == nil || fenceFinished(s.mr) {
		return nil
	}
	if _, ok := s.machine.Annotations[caprv1.FenceBeforeDeleteHookAnnotation]; ok {
		return nil
	}
	m := s.machine.DeepCopy()
	annotations.AddAnnotations(m, map[string]string{caprv1.FenceBeforeDeleteHookAnnotation: s.mr.Name})
	if err := r.Client.Patch(ctx, m, client.MergeFrom(s.machine)); err != nil {
		return fmt.Errorf("adding the fence-before-delete hook to Machine %s: %w", s.machine.Name, err)
	}
	s.machine = m
	return nil
}

// removeFenceHook takes the hook off the victim (fenced, or the remediation undone): CAPI may then
// drain and delete it. A victim that is gone has nothing to remove. The Machine is read live: the
// cache may not show yet a hook this remediation added a moment ago (e.g. again, after a restart).
func (r *Reconciler) removeFenceHook(ctx context.Context, s *scope) error {
	m := &clusterv1.Machine{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: s.mr.Namespace, Name: s.mr.Name}, m); err != nil {
		return client.IgnoreNotFound(err)
	}
	if _, ok := m.Annotations[caprv1.FenceBeforeDeleteHookAnnotation]; !ok {
		return nil
	}
	base := m.DeepCopy()
	delete(m.Annotations, caprv1.FenceBeforeDeleteHookAnnotation)
	if err := r.Client.Patch(ctx, m, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("removing the fence-before-delete hook from Machine %s: %w", m.Name, err)
	}
	if !s.machineGone && s.machine != nil && s.machine.Name == m.Name {
		s.machine = m
	}
	return nil
}

// fenceDeletingVictim fences a victim that someone else is deleting before the remediation's own
// Fence step (a rollout, a person): the hook holds that deletion, and the provider will not create
// the replacement the remediation waits for while a Machine is deleting (KCP's preflight
// HasDeletingMachine), so waiting for the Fence step would hold both until the step timeout. Once the
// fence is confirmed (or the policy lets it go) the hook is removed and the deletion proceeds; the
// remediation then ends as for any victim deleted by someone else.
func (r *Reconciler) fenceDeletingVictim(ctx context.Context, s *scope) error {
	if s.machineGone || s.machine == nil || s.machine.DeletionTimestamp.IsZero() || fenceFinished(s.mr) {
		return nil
	}
	if _, ok := s.machine.Annotations[caprv1.FenceBeforeDeleteHookAnnotation]; !ok {
		return nil
	}
	res, err := r.Fencer.Fence(ctx, fencing.Request{
		Cluster: s.cluster, Machine: s.machine, Node: s.victimNode(), Spec: s.mr.Spec.Fencing, Started: s.machine.DeletionTimestamp.Time,
	})
	if err != nil {
		return fmt.Errorf("fencing Machine %s, which is being deleted: %w", s.machine.Name, err)
	}
	if res.Outcome == fencing.Waiting {
		return nil
	}
	r.event(s.mr, corev1.EventTypeNormal, EventFencedDeletingVictim, fmt.Sprintf(
		"Machine %s is being deleted by someone else; fencing finished (%s), its deletion may proceed", s.machine.Name, res.Message))
	return r.removeFenceHook(ctx, s)
}
