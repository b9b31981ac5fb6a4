package machinehealthcheck

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// Two health checks may select the same Machine: CAPI forbids overlapping MachineHealthChecks in its
// documentation but does not enforce it, and neither does CAPR. The mark has one entry per health
// check (applyMark), so overlapping health checks do not undo each other's marks; the overlap itself
// is reported on each of them, in TargetsOverlap and a Warning event when it starts.

// overlapping is what a round found of the overlaps of its health check.
type overlapping struct {
	// machines has, by name, the other health checks that select one of the round's targets, each with
	// the name of one such Machine.
	machines map[string]string
	// possible says that some other health check may select a target of this one: without any, no
	// target overlaps, whichever targets the round saw.
	possible bool
}

// overlaps finds the other health checks of mhc's cluster (not being deleted) that select one of
// targets. It reads the health checks from the cache without copies, as the watch mappers do
// (healthChecksFor), and tests the targets only against health checks whose selectors may meet
// mhc's.
func (r *Reconciler) overlaps(ctx context.Context, mhc *caprv1.MachineHealthCheck, targets []target) (overlapping, error) {
	var out overlapping
	list := &caprv1.MachineHealthCheckList{}
	if err := r.Client.List(ctx, list, client.InNamespace(mhc.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return out, fmt.Errorf("listing MachineHealthChecks for overlaps: %w", err)
	}
	for i := range list.Items {
		other := &list.Items[i]
		if other.Name == mhc.Name || other.Spec.ClusterName != mhc.Spec.ClusterName || !other.DeletionTimestamp.IsZero() || disjoint(mhc, other) {
			continue
		}
		sel, err := r.state.selectors.of(other)
		if err != nil {
			continue // it selects nothing; its own round reports the invalid selector
		}
		out.possible = true
		for _, t := range targets {
			if sel.Matches(labels.Set(t.machine.Labels)) {
				if out.machines == nil {
					out.machines = map[string]string{}
				}
				out.machines[other.Name] = t.machine.Name
				break
			}
		}
	}
	return out, nil
}

// disjoint reports whether the selectors of two health checks cannot select the same Machine because
// both require one label, with different values.
func disjoint(a, b *caprv1.MachineHealthCheck) bool {
	for k, v := range a.Spec.Selector.MatchLabels {
		if w, ok := b.Spec.Selector.MatchLabels[k]; ok && w != v {
			return true
		}
	}
	return false
}

// setTargetsOverlap reports the overlaps a round found. A full pass saw every target and sets the
// condition either way, and so does any round when no other health check may overlap (the last one
// was deleted, or its selector changed); otherwise a round over some targets only can only add to
// what is known, so it sets the condition when it finds an overlap not reported yet. The Warning
// event is recorded when the condition becomes True (setStatusCondition: once per transition), so an
// overlap that lasts costs one event, not one per round.
func (r *Reconciler) setTargetsOverlap(mhc *caprv1.MachineHealthCheck, found overlapping, full bool) {
	overlaps := found.machines
	if len(overlaps) == 0 {
		if full || !found.possible {
			r.setStatusCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckTargetsOverlapCondition, Status: metav1.ConditionFalse,
				Reason: caprv1.MachineHealthCheckNoTargetsOverlapReason})
		}
		return
	}
	if !full && conditions.IsTrue(mhc, caprv1.MachineHealthCheckTargetsOverlapCondition) {
		return // the next full pass names them all
	}
	names := slices.Sorted(maps.Keys(overlaps))
	listed := make([]string, 0, min(len(names), aggregatedNames))
	for _, name := range names[:min(len(names), aggregatedNames)] {
		listed = append(listed, fmt.Sprintf("%s (Machine %s)", name, overlaps[name]))
	}
	more := ""
	if len(names) > aggregatedNames {
		more = fmt.Sprintf(" and %d more", len(names)-aggregatedNames)
	}
	message := fmt.Sprintf("Targets of this health check are also selected by MachineHealthCheck %s%s: CAPI forbids overlapping health checks. "+
		"Each keeps its own entry in the mark of a shared Machine, which stays marked while any of them finds it unhealthy",
		strings.Join(listed, ", "), more)
	if r.setStatusCondition(mhc, metav1.Condition{Type: caprv1.MachineHealthCheckTargetsOverlapCondition, Status: metav1.ConditionTrue,
		Reason: caprv1.MachineHealthCheckTargetsOverlapReason, Message: message}) {
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, caprv1.EventTargetsOverlap, "HealthCheck", "%s", message)
	}
}

// selectionChanged lets through the health-check events that may start or end an overlap: a health
// check created or deleted, its spec changed, or its deletion started (it no longer counts then).
func selectionChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			return o == nil || n == nil || o.GetGeneration() != n.GetGeneration() ||
				o.GetDeletionTimestamp().IsZero() != n.GetDeletionTimestamp().IsZero()
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// healthCheckToOverlapping maps such an event of one health check to the other health checks of its
// cluster that it may overlap, and makes their next round a full pass: only a pass over every target
// finds an overlap that starts or ends without any Machine changing (the health check that changed
// finds it in its own round). An update is mapped for the old and the new version, so a selector
// that no longer overlaps reaches the health checks it overlapped. Health checks whose selectors
// cannot meet (disjoint) are left alone: with one health check per pool, nothing is done.
func (r *Reconciler) healthCheckToOverlapping(ctx context.Context, o client.Object) []reconcile.Request {
	mhc, ok := o.(*caprv1.MachineHealthCheck)
	if !ok {
		return nil
	}
	list := &caprv1.MachineHealthCheckList{}
	if err := r.Client.List(ctx, list, client.InNamespace(mhc.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing MachineHealthChecks for a health-check event")
		r.state.evalCaches.invalidateAll()
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		other := &list.Items[i]
		if other.Name == mhc.Name || other.Spec.ClusterName != mhc.Spec.ClusterName || disjoint(mhc, other) {
			continue
		}
		key := client.ObjectKeyFromObject(other)
		r.state.evalCaches.invalidate(key)
		out = append(out, reconcile.Request{NamespacedName: key})
	}
	return out
}
