// Package worker is CAPR's worker remediator. It acts on the MachineRemediations of Machines that
// are not control-plane Machines: a Machine owned by a MachineSet is fenced (remediation/fencing),
// then deleted, and its MachineSet replaces it. A Machine without an owner that would replace it is
// never deleted: the request says why and waits.
//
// The MachineDeployment's spec.remediation.maxInFlight bounds how many of its Machines are remediated
// at once (admit.go, pure and table-tested); explicit requests go first, then the oldest request.
// Every step is recorded in the MachineRemediation status before it is issued and every step is
// idempotent, so a restart between any two API calls continues where it stopped. The role of a request
// (worker or control plane) is recorded in status.worker when this remediator first acts on it, so
// the two remediators never act on each other's requests, also after the Machine is gone.
package worker
