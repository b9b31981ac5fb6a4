package machinehealthcheck

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
)

// reconcileDelete clears every mark this health check wrote and withdraws its Pending requests, then
// releases the finalizer.
func (r *Reconciler) reconcileDelete(ctx context.Context, helper *patch.Helper, mhc *caprv1.MachineHealthCheck) error {
	if !controllerutil.ContainsFinalizer(mhc, Finalizer) {
		return nil
	}
	checker := checkerName(mhc)
	machines := &clusterv1.MachineList{}
	if err := r.Client.List(ctx, machines, client.InNamespace(mhc.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: mhc.Spec.ClusterName}); err != nil {
		return fmt.Errorf("listing Machines: %w", err)
	}
	// The mark names its health checks (applyMark); one written before it did is this one's on the
	// Machines it selects. A selector that no longer parses selects none of them.
	selector, err := r.state.selectors.of(mhc)
	if err != nil {
		selector = labels.Nothing()
	}
	requests, _, err := r.listRequests(ctx, mhc)
	var unlistableErr *requestsUnlistableError
	switch {
	case errors.As(err, &unlistableErr):
		// No such request can be read, nor withdrawn: holding the finalizer would keep the health
		// check forever for nothing. What is left, if any, is said once, and the marks are cleared.
		r.recorder.Eventf(mhc, nil, corev1.EventTypeWarning, caprv1.EventRemediationRequestsNotWithdrawn, "Delete",
			"%v; any Pending one of this health check is left, not withdrawn", unlistableErr)
	case err != nil:
		return err
	}
	var errs []error
	for i := range machines.Items {
		m := &machines.Items[i]
		if isMarked(m, checker) {
			if err := r.removeMark(ctx, m, checker, selector); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		// Every Pending request of this health check is withdrawn, whether or not the Machine still
		// carries the mark: a withdrawal refused by a conflict (a remediator wrote the request) is
		// retried on the next reconcile, when the mark cleared above is already gone. Another health
		// check that still marks the Machine requests it again: the deletion is an event of the
		// request, which starts its round over the Machine (requestToHealthChecks).
		if err := r.withdrawRequest(ctx, mhc, m, requests, "its health check is being deleted"); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return kerrors.NewAggregate(errs)
	}
	r.state.reported.forget(mhc.UID)
	r.state.evalCaches.forget(client.ObjectKeyFromObject(mhc))
	r.state.statusWrites.forget(client.ObjectKeyFromObject(mhc))
	r.state.newMarks.take(client.ObjectKeyFromObject(mhc))
	metrics.HealthCheckDeleted(mhc.Namespace, mhc.Name)
	r.state.templates.forget(mhc.UID)
	controllerutil.RemoveFinalizer(mhc, Finalizer)
	if err := helper.Patch(ctx, mhc); err != nil {
		return fmt.Errorf("removing finalizer: %w", err)
	}
	return nil
}

// removeMark removes checker's mark from Machine m (unmark), conditional on the version of m read
// (updateMark): another health check's entry written since is kept.
func (r *Reconciler) removeMark(ctx context.Context, m *clusterv1.Machine, checker string, selector labels.Selector) error {
	_, err := r.updateMark(ctx, m, func(after *clusterv1.Machine) (bool, error) {
		return unmark(after, checker, selector.Matches(labels.Set(after.Labels)))
	})
	return err
}
