// Package machinehealthcheck is CAPR's health checker. It reconciles remediation.cluster.x-k8s.io
// MachineHealthChecks. Each round (reconcileNormal, machinehealthcheck_controller.go) runs in phases:
// reach the workload cluster through CAPI's ClusterCache; read the selected Machines and their Nodes
// (and etcd, for checks.etcdMember), all of them in a full pass, or, in a round from memory
// (machinehealthcheck_memory.go), only those whose watch events came in since the last round and
// those unhealthy or with a timeout running; decide which are unhealthy
// (machinehealthcheck_targets.go); apply triggerIf, the quorum-safe control-plane limit and the etcd
// quorum (machinehealthcheck_limits.go); write or clear the mark (machinehealthcheck_mark.go); create
// one remediation request per marked Machine when remediation is allowed and withdraw Pending ones
// that are no longer needed (machinehealthcheck_requests.go; the requests it created that its cache
// does not show yet stand in for the cache's copies, machinehealthcheck_created.go); and report in
// the status. A Machine marked in a round gets its request, and its event, in the health check's next
// round, queued at once (machinehealthcheck_deferred.go). What it remembers between reconciles is in machinehealthcheck_memory.go and
// machinehealthcheck_transitions.go; losing it on a restart only makes the next round a full pass.
// It never deletes a Machine.
package machinehealthcheck
