// Package retention bounds the life of finished MachineRemediations. A request is re-owned by its
// Cluster when a remediator starts it (so that its record outlives the Machine it deletes), and
// nothing else ever deletes it: without this controller every finished request would stay until its
// Cluster is deleted, and every health-check round and remediator lists them all.
//
// A finished request (Succeeded or Failed) is deleted once it is older than a TTL after its
// completionTime, and the oldest finished requests of a Cluster are deleted beyond a maximum count
// per Cluster. A request that still matters is never deleted (Decide, pure and table-tested; Keep
// says why): one with a fence still to undo, a Failed one whose Machine still exists (it is what
// stops the health checker from asking again), one whose Machine is still being deleted, and one
// whose retry was requested. What the deleted records said lives on in the events and metrics the
// remediators wrote when they finished (capr_remediations_finished_total); the deletions are counted
// in capr_remediation_requests_deleted_total.
//
// The controller also drops the etcd clients and certificates CAPR keeps for a Cluster once the
// Cluster is deleted (etcdutil.Workload.Forget), which nothing else did.
package retention
