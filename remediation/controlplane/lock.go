package controlplane

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// lock returns who holds the control plane (nil when nobody).
func lockOf(cp *unstructured.Unstructured) *caprv1.ControlPlaneLock {
	v, ok := cp.GetAnnotations()[caprv1.ControlPlaneLockAnnotation]
	if !ok {
		return nil
	}
	l, err := caprv1.ControlPlaneLockFromAnnotation(v)
	if err != nil {
		return &caprv1.ControlPlaneLock{MachineRemediation: "(unreadable: " + v + ")"}
	}
	return l
}

// takeLock writes the lock with optimistic locking, so that two remediations (or two controller
// replicas) can never both hold the control plane.
func (r *Reconciler) takeLock(ctx context.Context, s *scope, desired int32) error {
	base := s.cp.DeepCopy()
	value, err := (&caprv1.ControlPlaneLock{MachineRemediation: s.mr.Name, DesiredReplicas: desired}).Marshal()
	if err != nil {
		return err
	}
	annotations.AddAnnotations(s.cp, map[string]string{caprv1.ControlPlaneLockAnnotation: value})
	if err := r.Client.Patch(ctx, s.cp, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("taking the control-plane remediation lock on %s %s: %w", s.cp.GetKind(), s.cp.GetName(), err)
	}
	return nil
}

// releaseLock removes the lock if this remediation holds it, and what BeforeScaleUp set for this
// remediation's victim. A conflict only means the object changed (a provider's status, replicas): it
// is read again and the release retried.
func (r *Reconciler) releaseLock(ctx context.Context, s *scope) error {
	// The replicas field the surge took is given back first: once the lock is gone nothing would.
	if err := r.giveBackTopologyReplicas(ctx, s); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		if s.cp == nil {
			return nil
		}
		base := s.cp.DeepCopy()
		changed := false
		if l := lockOf(s.cp); l != nil && l.MachineRemediation == s.mr.Name {
			a := s.cp.GetAnnotations()
			delete(a, caprv1.ControlPlaneLockAnnotation)
			s.cp.SetAnnotations(a)
			changed = true
		}
		// What this remediation set for the provider goes with the lock (e.g. KCP's
		// remediation-in-progress re-armed for a Machine the provider had already created: KCP would
		// keep it, and with it suppress its own remediation, forever).
		if s.adapter != nil && s.adapter.ClearScaleUp(s.cp, s.mr.Name) {
			changed = true
		}
		if !changed {
			return nil
		}
		err := r.Client.Patch(ctx, s.cp, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt >= 2 {
			return fmt.Errorf("releasing the control-plane remediation lock: %w", err)
		}
		live := base.DeepCopy()
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(base), live); err != nil {
			return fmt.Errorf("re-reading %s %s to release the lock: %w", base.GetKind(), base.GetName(), err)
		}
		s.cp = live
	}
}

// lockHolderActive reports whether the MachineRemediation named in a lock still runs. A lock that
// names no object a request could be (an unreadable value, lockOf; or a hand-written one such as
// "a/b") is held by nobody: reading it would fail before reaching the API server, on every reconcile
// of every request of the cluster, and none would ever say why (test/adversarial).
func (r *Reconciler) lockHolderActive(ctx context.Context, namespace string, l *caprv1.ControlPlaneLock) (bool, error) {
	if len(validation.IsDNS1123Subdomain(l.MachineRemediation)) > 0 {
		return false, nil
	}
	other := &caprv1.MachineRemediation{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: l.MachineRemediation}, other); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	return other.Status.Phase != caprv1.MachineRemediationPhaseSucceeded && other.Status.Phase != caprv1.MachineRemediationPhaseFailed, nil
}

// holdsLock reports whether the control-plane lock names this remediation (a start that crashed
// after taking it: the provider may already be acting on it).
func holdsLock(s *scope) bool {
	l := lockOf(s.cp)
	return l != nil && l.MachineRemediation == s.mr.Name
}
