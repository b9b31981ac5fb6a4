package remediation

import (
	"context"
	"fmt"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// DeletionHooks are CAPR's CAPI deletion-hook annotations on a Machine, each naming the
// MachineRemediation (the Machine's own name) that removes it: fence before delete
// (remediation/fencing), the control plane's replicas back after a surge, and the member's removal
// kept quorum-safe (remediation/controlplane stepDelete). A hook whose request no longer exists is
// removed by remediation/worker (releaseOrphanedHook), whoever set it.
var DeletionHooks = []string{caprv1.FenceBeforeDeleteHookAnnotation, caprv1.ReplicasBackHookAnnotation, caprv1.QuorumSafeHookAnnotation}

// HasDeletionHook reports whether o carries one of DeletionHooks.
func HasDeletionHook(o client.Object) bool {
	for _, hook := range DeletionHooks {
		if _, ok := o.GetAnnotations()[hook]; ok {
			return true
		}
	}
	return false
}

// RemoveMachineAnnotations takes the annotations keys off the Machine key (a deletion hook: CAPI may
// then go on with the Machine's deletion). The Machine is read live: a cache may not show yet an
// annotation added a moment ago (e.g. by a controller that has since died). It returns the Machine as
// it is now (nil when it is gone) and the keys it removed (none when it carried none).
func RemoveMachineAnnotations(ctx context.Context, c client.Client, live client.Reader, key client.ObjectKey, keys ...string) (*clusterv1.Machine, []string, error) {
	m := &clusterv1.Machine{}
	if err := live.Get(ctx, key, m); err != nil {
		return nil, nil, client.IgnoreNotFound(err)
	}
	base := m.DeepCopy()
	var removed []string
	for _, k := range keys {
		if _, ok := m.Annotations[k]; ok {
			delete(m.Annotations, k)
			removed = append(removed, k)
		}
	}
	if len(removed) == 0 {
		return m, nil, nil
	}
	if err := c.Patch(ctx, m, client.MergeFrom(base)); err != nil {
		return nil, nil, fmt.Errorf("removing %v from Machine %s: %w", removed, m.Name, err)
	}
	return m, removed, nil
}
