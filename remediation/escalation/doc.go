// Package escalation runs spec.escalation, medik8s NodeHealthCheck's semantics, for both remediators:
// each step creates an object from its template (named after the Machine, owned by the
// MachineRemediation) and waits for the Machine's health mark to go away (the remediation then ends,
// nothing deleted) or for its timeout (the object is deleted, the next step follows). Only the object
// CAPR created for the request (its controller owner reference names the MachineRemediation by UID)
// is believed or deleted: another object under the name is reported and left alone, and one CAPR may
// not delete is reported, retried for one more timeout and then left (docs/user/escalation.md). The
// kinds are the user's: CAPR is granted them through a ClusterRole labelled
// remediation.cluster.x-k8s.io/aggregate-to-manager, never a wildcard.
//
// The worker remediator runs the chain before fencing; the control-plane remediator runs it while it
// holds the control plane, before any membership change, and only when the victim's etcd member may
// go down for a while without losing quorum (a reboot takes it down).
package escalation
