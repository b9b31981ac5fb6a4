package worker

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// notControlPlane drops events of requests the control-plane remediator has started (the Machine is
// read in Reconcile for the others).
func notControlPlane() predicate.Funcs {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		mr, ok := o.(*caprv1.MachineRemediation)
		return ok && mr.Status.ControlPlane == nil
	})
}

// phaseChangedOrDeleted passes worker request events that can free a slot of a MachineDeployment.
func phaseChangedOrDeleted() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		DeleteFunc: func(e event.DeleteEvent) bool {
			mr, ok := e.Object.(*caprv1.MachineRemediation)
			return ok && mr.Status.Worker != nil
		},
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*caprv1.MachineRemediation)
			n, ok2 := e.ObjectNew.(*caprv1.MachineRemediation)
			return ok1 && ok2 && n.Status.Worker != nil &&
				(o.Status.Phase != n.Status.Phase || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero())
		},
	}
}

// machineToRemediation maps a Machine to its request (same name and namespace), when there is one
// or the Machine carries the fence-before-delete hook (releaseOrphanedHook). Every other Machine's
// event would cost a live read that only finds no request: at start-up and on every resync, that is
// one per Machine. Skipping them is safe: a request the cache does not show yet brings its own
// create event, and one deleted brings its delete event (both through For).
func (r *Reconciler) machineToRemediation(ctx context.Context, o client.Object) []reconcile.Request {
	key := client.ObjectKeyFromObject(o)
	if _, hooked := o.GetAnnotations()[caprv1.FenceBeforeDeleteHookAnnotation]; !hooked {
		if err := r.Client.Get(ctx, key, &caprv1.MachineRemediation{}); apierrors.IsNotFound(err) {
			return nil
		}
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// remediationToGroup maps a worker request to the other unfinished requests of its MachineDeployment
// (or MachineSet): they may take the slot it frees.
func (r *Reconciler) remediationToGroup(ctx context.Context, o client.Object) []reconcile.Request {
	mr, ok := o.(*caprv1.MachineRemediation)
	if !ok || mr.Status.Worker == nil || mr.Status.Worker.MachineSet == "" {
		return nil // in no group (sameGroup): it holds no slot
	}
	// Read-only, and run for every event of every request: without copies (a storm of N requests
	// copied N requests per event, O(N²)).
	list := &caprv1.MachineRemediationList{}
	if err := r.Client.List(ctx, list, client.InNamespace(mr.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		other := &list.Items[i]
		if other.Name != mr.Name && !terminal(other) && sameGroup(other.Status.Worker, mr.Status.Worker) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(other)})
		}
	}
	return out
}

// sameGroup reports whether two worker remediations share a maxInFlight.
func sameGroup(a, b *caprv1.WorkerRemediationStatus) bool {
	if a == nil || b == nil || a.MachineSet == "" || b.MachineSet == "" {
		return false
	}
	if a.MachineDeployment != "" || b.MachineDeployment != "" {
		return a.MachineDeployment == b.MachineDeployment
	}
	return a.MachineSet == b.MachineSet
}

// clusterToRemediations maps a Cluster (pause transitions) to its unfinished worker requests.
func (r *Reconciler) clusterToRemediations(ctx context.Context, o client.Object) []reconcile.Request {
	list := &caprv1.MachineRemediationList{}
	if err := r.Client.List(ctx, list, client.InNamespace(o.GetNamespace()), client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		mr := &list.Items[i]
		if terminal(mr) || mr.Status.ControlPlane != nil {
			continue
		}
		if (mr.Status.Worker != nil && mr.Status.Worker.ClusterName == o.GetName()) || mr.Labels[clusterv1.ClusterNameLabel] == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(mr)})
		}
	}
	return out
}
