package machinehealthcheck

import (
	"context"
	"fmt"
	"maps"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/metrics"
)

// forgetGone drops what the process keeps for a health check that a round found gone. reconcileDelete
// does the same for a health check deleted through its finalizer; one whose finalizer was removed by
// hand only ever reaches this. What is keyed by name is dropped by name; what is keyed by UID
// (reported reasons, template checks) is pruned to the health checks that still exist, as the UID
// of the one that is gone is not known any more. The metric series carry namespace and name.
func (r *Reconciler) forgetGone(ctx context.Context, key types.NamespacedName) error {
	r.state.evalCaches.forget(key)
	r.state.statusWrites.forget(key)
	r.state.newMarks.take(key)
	r.state.selectors.forget(key)
	metrics.HealthCheckDeleted(key.Namespace, key.Name)
	list := &caprv1.MachineHealthCheckList{}
	if err := r.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing MachineHealthChecks to forget those that are gone: %w", err)
	}
	live := make(map[types.UID]bool, len(list.Items))
	for i := range list.Items {
		live[list.Items[i].UID] = true
	}
	r.state.reported.retain(live)
	r.state.templates.retain(live)
	return nil
}

// retain drops what was recorded for the health checks not in live.
func (r *reportedReasons) retain(live map[types.UID]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	maps.DeleteFunc(r.last, func(uid types.UID, _ map[string]string) bool { return !live[uid] })
}

// retain drops what was recorded for the health checks not in live.
func (c *templateChecks) retain(live map[types.UID]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	maps.DeleteFunc(c.last, func(uid types.UID, _ templateCheck) bool { return !live[uid] })
}
