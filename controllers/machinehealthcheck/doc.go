// Package machinehealthcheck is CAPR's health checker. It reconciles remediation.cluster.x-k8s.io
// MachineHealthChecks. The files follow a reconcile:
//
//   - controller.go: the reconcile skeleton (get, Cluster, patch helper, paused, deferred patch),
//     reconcileNormal, which runs a round phase by phase, and SetupWithManager; watches.go, the
//     watches and what each event starts.
//   - observe.go: reach the workload cluster through CAPI's ClusterCache and read the selected
//     Machines and their Nodes, all of them in a full pass, or, in an incremental round
//     (evalcache.go), only those whose watch events came in since the last round and those
//     unhealthy or with a timeout running; etcd.go, etcd member health and quorum for
//     checks.etcdMember; selectors.go, the parsed selectors; templates.go, the
//     RemediationTemplatesValid check; overlap.go, health checks selecting the same Machines.
//   - round.go and targets.go: decide which targets are healthy, unhealthy or pending.
//   - limits.go: triggerIf, the storm cooldown, the quorum-safe control-plane limit and the etcd
//     quorum; single.go, the limit of a control plane of one Machine, from its etcd member.
//   - apply.go: write or clear each mark (mark.go), then create one remediation request per marked
//     Machine when remediation is allowed and withdraw Pending ones that are no longer needed
//     (requests.go; the requests it created that its cache does not show yet stand in for the
//     cache's copies, created.go). A Machine marked in a round gets its request, and its event, in
//     the health check's next round, queued at once (deferred.go).
//   - events.go and status.go: report the round in events (aggregated past a limit) and in the
//     status; transitions.go, one event per condition transition.
//   - delete.go and gone.go: clear the marks and withdraw the requests of a health check being
//     deleted, and forget one that is gone.
//
// What it keeps between reconciles is processState (state.go); losing it on a restart only makes
// the next rounds do more work or wait longer. It never deletes a Machine.
package machinehealthcheck
