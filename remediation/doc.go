// Package remediation holds CAPR's remediators, which act on MachineRemediation objects: the
// control-plane remediator (remediation/controlplane) with its control-plane provider adapters, and
// the storage-fencing interface and backends (remediation/fencing).
package remediation
