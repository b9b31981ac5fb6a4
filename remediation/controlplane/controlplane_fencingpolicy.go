package controlplane

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/fencing"
)

// decideFencing records the fencing the remediation applies (fencing.Decide: the strictest of its
// spec.fencing and the CAPR health checks covering the victim) before it starts, so a request
// written by hand, or by CAPI's MachineHealthCheck from a template without fencing, cannot delete
// the victim less fenced than its health checks say. When it cannot be decided, w says why and the
// request stays Pending (nothing was done).
func (r *Reconciler) decideFencing(ctx context.Context, s *scope) (raised string, w *waiting) {
	raised, err := fencing.Decide(ctx, r.Client, s.mr, s.machine)
	if err != nil {
		return "", &waiting{reason: caprv1.MachineRemediationWaitingForPreconditionsReason, requeue: waitLong,
			message: fmt.Sprintf("the remediation cannot start: %v", err), warning: remediation.EventRemediationWaiting}
	}
	return raised, nil
}

// fencingRaisedEvent tells, once the remediation started, that health checks raised its fencing.
func (r *Reconciler) fencingRaisedEvent(s *scope, raised string) {
	if raised != "" {
		r.event(s.mr, corev1.EventTypeNormal, caprv1.EventFencingRaised, raised)
	}
}

// noteOf appends raised to a condition's message ("" when there is nothing to say).
func noteOf(raised string) string {
	if raised == "" {
		return ""
	}
	return "; " + raised
}
