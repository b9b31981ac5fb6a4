package worker

import (
	"context"
	"time"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/remediation"
	"github.com/capr-io/capr/remediation/escalation"
)

// MachineAnnotation on an escalation object names the Machine it remediates (escalation.MachineAnnotation).
const MachineAnnotation = escalation.MachineAnnotation

// escalationRunner runs the escalation chain (remediation/escalation) for this remediator.
func (r *Reconciler) escalationRunner() *escalation.Runner {
	return &escalation.Runner{Client: r.Client, APIReader: r.APIReader, Timeout: r.EscalationTimeout, Event: r.event}
}

// stepEscalate runs one escalation step (remediation/escalation).
func (r *Reconciler) stepEscalate(ctx context.Context, s *scope, rec *caprv1.RemediationStep) (remediation.StepResult, error) {
	return r.escalationRunner().Step(ctx, s.mr, s.machine, s.cluster.Name, rec, nil, time.Now())
}

// deleteStartedEscalationObjects deletes the objects of every escalation step started (abort, or the
// Machine gone): nothing created for a remediation outlives it. What is left is said in an event
// (escalation.EventObjectLeft).
func (r *Reconciler) deleteStartedEscalationObjects(ctx context.Context, mr *caprv1.MachineRemediation) error {
	_, err := r.escalationRunner().DeleteStarted(ctx, mr)
	return err
}
