// Package escalation runs spec.escalation, medik8s NodeHealthCheck's semantics, for both remediators:
// each step creates an object from its template (named after the Machine, owned by the
// MachineRemediation) and waits for the Machine's health mark to go away (the remediation then ends,
// nothing deleted) or for its timeout (the object is deleted, the next step follows). The kinds are
// the user's: CAPR is granted them through a ClusterRole labelled
// remediation.cluster.x-k8s.io/aggregate-to-manager, never a wildcard.
//
// The worker remediator runs the chain before fencing; the control-plane remediator runs it while it
// holds the control plane, before any membership change, and only when the victim's etcd member may
// go down for a while without losing quorum (a reboot takes it down).
package escalation
