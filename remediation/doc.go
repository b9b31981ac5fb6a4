// Package remediation holds CAPR's remediators, which act on MachineRemediation objects: the
// control-plane remediator (remediation/controlplane) with its control-plane provider adapters, the
// worker remediator (remediation/worker), the escalation chain both run (remediation/escalation),
// and the storage-fencing interface and backends (remediation/fencing). This package itself holds
// what both remediators apply to every request they write (SyncBlockMove), how they write it
// (Persist), and the event reasons they share (events.go).
package remediation
