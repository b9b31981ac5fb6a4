// Package controlplane is CAPR's control-plane remediator. It acts on MachineRemediation
// objects of control-plane Machines: it checks the preconditions (quorum, retry limits, one
// remediation per cluster at a time), chooses the order from real etcd state (plan.go), then scales
// up, waits for the replacement to vote, moves leadership, removes the victim's etcd member, fences
// and deletes the victim through the control-plane provider (adapter.go, kcp.go). Every step is
// recorded in the MachineRemediation status before it is issued, and every step is idempotent, so a
// restart between any two API calls continues from the first step whose effect is not yet visible.
package controlplane
