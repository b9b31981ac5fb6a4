// Package machinehealthcheck is CAPR's health checker. It reconciles remediation.cluster.x-k8s.io
// MachineHealthChecks. Each round (reconcileNormal, machinehealthcheck_controller.go) runs in phases:
// reach the workload cluster through CAPI's ClusterCache, list the selected Machines and read their
// Nodes (and etcd, for checks.etcdMember), decide which are unhealthy (machinehealthcheck_targets.go),
// apply triggerIf, the quorum-safe control-plane limit and the etcd quorum
// (machinehealthcheck_limits.go), write or clear the mark (machinehealthcheck_mark.go), create one
// remediation request per marked Machine when remediation is allowed and withdraw Pending ones that
// are no longer needed (machinehealthcheck_requests.go), and report in the status. What it remembers
// between reconciles is in machinehealthcheck_transitions.go. It never deletes a Machine.
package machinehealthcheck
