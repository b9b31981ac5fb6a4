package worker

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
)

// notControlPlane drops events of requests the control-plane remediator has started (the Machine is
// read in Reconcile for the others).
func notControlPlane() predicate.Funcs {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		mr, ok := o.(*caprv1.MachineRemediation)
		return ok && mr.Status.ControlPlane == nil
	})
}

// machineToRemediation maps a Machine to its request (same name and namespace), when there is one
// or the Machine carries one of CAPR's deletion hooks (releaseOrphanedHook). Every other Machine's
// event would cost a live read that only finds no request: at start-up and on every resync, that is
// one per Machine. Skipping them is safe: a request the cache does not show yet brings its own
// create event, and one deleted brings its delete event (both through For).
func (r *Reconciler) machineToRemediation(ctx context.Context, o client.Object) []reconcile.Request {
	key := client.ObjectKeyFromObject(o)
	if !remediation.HasDeletionHook(o) {
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
		if other.Name != mr.Name && !remediation.Terminal(other) && sameGroup(other.Status.Worker, mr.Status.Worker) {
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
	return remediation.RequestsOfCluster(ctx, r.Client, o.GetNamespace(), o.GetName(), "", func(mr *caprv1.MachineRemediation) (string, bool) {
		switch {
		case mr.Status.ControlPlane != nil:
			return "", false // the control-plane remediator's
		case mr.Status.Worker != nil:
			return mr.Status.Worker.ClusterName, true
		}
		return "", true
	})
}
