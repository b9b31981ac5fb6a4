package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/fencing"
)

// Fence before delete, whoever deletes: a running remediation keeps the fence-before-delete hook on
// its victim until the Fence step has finished (fencing.EnsureHook, shared with the worker
// remediator). A KCP rollout started mid-remediation scales down outdated Machines first, a person
// may delete the victim: the hook holds such a deletion until the victim is fenced.

// ensureFenceHook puts the hook on the victim while it exists and is not fenced yet, unless fencing
// can only be skipped (fencing.HookNeeded: no deletion is worth holding).
func (r *Reconciler) ensureFenceHook(ctx context.Context, s *scope) error {
	if s.machineGone || s.machine == nil || fencing.StepFinished(s.mr) || !fencing.HookNeeded(fencing.SpecOf(s.mr), s.victimNode()) {
		return nil
	}
	m, err := fencing.EnsureHook(ctx, r.Client, s.machine, s.mr.Name)
	if err != nil {
		return err
	}
	s.machine = m
	return nil
}

// removeFenceHook takes the hook off the victim (fenced, or the remediation undone).
func (r *Reconciler) removeFenceHook(ctx context.Context, s *scope) error {
	m, _, err := fencing.RemoveHook(ctx, r.Client, r.APIReader, client.ObjectKey{Namespace: s.mr.Namespace, Name: s.mr.Name})
	if err != nil {
		return err
	}
	if m != nil && !s.machineGone && s.machine != nil && s.machine.Name == m.Name {
		s.machine = m
	}
	return nil
}

// fenceDeletingVictim fences a victim that someone else is deleting while the hook holds it (a
// rollout, a person; also after the Fence step, when an abort put the hook back to unfence): the
// provider will not create the replacement the remediation waits for while a Machine is deleting
// (KCP's preflight HasDeletingMachine), so waiting for the Fence step would hold both until the step
// timeout. Once the fence is final the hook is removed and the deletion proceeds; the remediation
// then ends as for any victim deleted by someone else. final reports whether the hook holds nothing
// any more (nothing was held, or the fence is final); msg says what the fence waits for.
func (r *Reconciler) fenceDeletingVictim(ctx context.Context, s *scope) (final bool, v fencing.Verdict, err error) {
	if s.machineGone || !fencing.HeldDeletion(s.machine) {
		return true, fencing.Verdict{}, nil
	}
	v, released, err := fencing.FenceHeld(ctx, r.Fencer, r.Client, r.APIReader, s.mr, fencing.Request{
		Cluster: s.cluster, Machine: s.machine, Node: s.victimNode(), Spec: fencing.SpecOf(s.mr),
	}, time.Now(), r.persistFunc(s))
	if err != nil {
		return false, v, err
	}
	if released {
		r.event(s.mr, corev1.EventTypeNormal, EventFencedDeletingVictim, fmt.Sprintf(
			"Machine %s is being deleted by someone else; fencing finished (%s), its deletion may proceed", s.machine.Name, v.Message))
	}
	return v.Done, v, nil
}

// fenceHeldFirst comes before anything that undoes or ends a remediation (abort, failure): a
// deletion of the victim held by the hook is fenced and released first, never released unfenced by
// the undo. While the fence is not final the request says so and waits.
func (r *Reconciler) fenceHeldFirst(ctx context.Context, s *scope) (bool, ctrl.Result, error) {
	final, v, err := r.fenceDeletingVictim(ctx, s)
	if err != nil || final {
		return final, ctrl.Result{}, err
	}
	reason := caprv1.MachineRemediationWaitingForFencingReason
	if v.TimedOut {
		reason = caprv1.MachineRemediationStepTimedOutReason
	}
	remediation.SetWaiting(s.mr, reason, fmt.Sprintf("Machine %s is being deleted by someone else; its deletion is held until it is fenced: %s", s.machine.Name, v.Message))
	return false, ctrl.Result{RequeueAfter: min(v.Requeue, waitShort)}, nil
}

// unfenceEnded undoes the fence of a remediation that ends without replacing its victim (aborted,
// failed, recovered). A kept victim keeps the hook meanwhile (a deletion by someone else is then held
// and fenced again, fenceDeletingVictim) and is unfenced once its Node is Ready; a victim that is gone
// or deleting, once its Node is gone. The hook goes when nothing is owed.
func (r *Reconciler) unfenceEnded(ctx context.Context, s *scope, prefix string) (bool, ctrl.Result, error) {
	if !fencing.Owed(s.mr) {
		return true, ctrl.Result{}, nil
	}
	if !s.machineGone && s.machine.DeletionTimestamp.IsZero() {
		m, err := fencing.EnsureHook(ctx, r.Client, s.machine, s.mr.Name)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		s.machine = m
	}
	if done, res, err := r.unfence(ctx, s, false, prefix); !done || err != nil {
		return done, res, err
	}
	return true, ctrl.Result{}, r.removeFenceHook(ctx, s)
}

// persistFunc writes the request now (fencing.FenceRecorded: the fence is recorded before it is made).
func (r *Reconciler) persistFunc(s *scope) func(context.Context) error {
	return func(ctx context.Context) error { return r.persist(ctx, s) }
}

// unfence undoes the fence recorded in the request (fencing.UnfenceRecorded) before the remediation
// ends (succeeds, fails, or is aborted). When the victim is gone or being deleted (or afterDelete),
// the Node must be gone too before its fence is released. While it is not done the request says so
// and waits; done is true at once when nothing is owed.
func (r *Reconciler) unfence(ctx context.Context, s *scope, afterDelete bool, prefix string) (done bool, res ctrl.Result, err error) {
	if !fencing.Owed(s.mr) {
		return true, ctrl.Result{}, nil
	}
	m := s.machine
	if s.machineGone {
		m = &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: s.mr.Namespace, Name: s.mr.Name}}
	}
	req := fencing.Request{Cluster: s.cluster, Machine: m, AfterDelete: afterDelete || s.machineGone || !m.DeletionTimestamp.IsZero()}
	done, msg, err := fencing.UnfenceRecorded(ctx, r.Fencer, s.mr, req, time.Now())
	if err != nil || done {
		return done, ctrl.Result{}, err
	}
	remediation.SetWaiting(s.mr, caprv1.MachineRemediationWaitingForUnfencingReason, prefix+msg)
	return false, ctrl.Result{RequeueAfter: waitShort}, nil
}
