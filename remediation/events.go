package remediation

// Event reasons both remediators emit on a MachineRemediation, with the same meaning for a
// control-plane and a worker request (docs/operations/runbook.md). Each remediator's own reasons are
// in its package.
const (
	EventRemediationStarted   = "RemediationStarted"
	EventRemediationWaiting   = "RemediationWaiting"
	EventRemediationSucceeded = "RemediationSucceeded"
	EventRemediationAborted   = "RemediationAborted"
	EventFencingGaveUp        = "FencingGaveUp"
	EventStepTimedOut         = "StepTimedOut"
)
