package remediation

import (
	"sigs.k8s.io/controller-runtime/pkg/client"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// DeletionHooks are CAPR's CAPI deletion-hook annotations on a Machine, each naming the
// MachineRemediation (the Machine's own name) that removes it: fence before delete
// (remediation/fencing) and the control plane's replicas back after a surge (remediation/controlplane
// stepDelete). A hook whose request no longer exists is removed by remediation/worker
// (releaseOrphanedHook), whoever set it.
var DeletionHooks = []string{caprv1.FenceBeforeDeleteHookAnnotation, caprv1.ReplicasBackHookAnnotation}

// HasDeletionHook reports whether o carries one of DeletionHooks.
func HasDeletionHook(o client.Object) bool {
	for _, hook := range DeletionHooks {
		if _, ok := o.GetAnnotations()[hook]; ok {
			return true
		}
	}
	return false
}
