package worker

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/fencing"
)

// decideFencing records the fencing the remediation applies (fencing.Decide: the strictest of its
// spec.fencing and the CAPR health checks covering the Machine) before it starts, so a request
// written by hand, or by CAPI's MachineHealthCheck from a template without fencing, cannot delete
// the Machine less fenced than its health checks say. ok is false when it cannot be decided: the
// request then says why and stays Pending (nothing was done).
func (r *Reconciler) decideFencing(ctx context.Context, s *scope) (raised string, ok bool) {
	raised, err := fencing.Decide(ctx, r.Client, s.mr, s.machine)
	if err != nil {
		r.setWaitingWithEvent(s.mr, remediation.EventRemediationWaiting, caprv1.MachineRemediationWaitingForPreconditionsReason,
			fmt.Sprintf("the remediation cannot start: %v", err))
		return "", false
	}
	return raised, true
}

// fencingRaisedEvent tells, once the remediation started, that health checks raised its fencing.
func (r *Reconciler) fencingRaisedEvent(s *scope, raised string) {
	if raised != "" {
		r.event(s.mr, corev1.EventTypeNormal, caprv1.EventFencingRaised, raised)
	}
}
