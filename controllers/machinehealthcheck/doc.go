// Package machinehealthcheck is CAPR's health checker. It reconciles remediation.cluster.x-k8s.io
// MachineHealthChecks: it lists the selected Machines, reads their Nodes from the workload cluster
// through CAPI's ClusterCache, decides which are unhealthy (machinehealthcheck_targets.go), applies
// triggerIf and the quorum-safe control-plane limit (machinehealthcheck_limits.go), writes or clears
// the mark (machinehealthcheck_mark.go) and creates one remediation request per marked Machine
// when remediation is allowed (machinehealthcheck_requests.go). It never deletes a Machine.
package machinehealthcheck
