package machinehealthcheck

// processState is what the health checker keeps in memory between reconciles, per process. None of
// it is read back from the API, and none of it is needed for a decision to be right: a restart (or
// a second manager taking over the leader lease) loses all of it, and each part is rebuilt or only
// makes the next rounds do more work or wait longer, never mark early or remediate more. Each zero
// value is ready to use.
type processState struct {
	// etcdUnhealthy is since when each etcd member has been seen unhealthy. Lost, the etcd member
	// timeout starts again at the next observation (observeEtcdMembers): a mark can come later,
	// never earlier.
	etcdUnhealthy etcdSince
	// reported is the reason this process last set on each condition, so that a transition gets one
	// event. Lost, the reason on the object read at reconcile start stands in for it
	// (setStatusCondition).
	reported reportedReasons
	// firstConnection is since when each workload cluster's first connection is awaited. Lost, the
	// wait of up to firstConnectionGrace starts again (reachWorkloadCluster); nothing is marked
	// while the cluster is not reached either way.
	firstConnection firstConnections
	// templates is when each health check's remediation templates were last checked. Lost, the
	// next round checks them again (templateChecks.due has nothing recorded: checkTemplates).
	templates templateChecks
	// evalCaches is each health check's last evaluation of every target, for incremental rounds.
	// Lost, the next round is a full pass (evalCaches.begin finds no cache), which rebuilds it
	// (evalCache.reset, from observe).
	evalCaches evalCaches
	// created is the requests created that the cache may not show yet. Lost, the cache is believed:
	// a request it does not show yet is created again and refused AlreadyExists (ensureRequest).
	created createdRequests
	// statusWrites is when each health check's status was last written. Lost, the next change of
	// the counts is written at once (statusWrites.wait).
	statusWrites statusWrites
	// newMarks is the marks the last round wrote, whose requests and events the next round makes.
	// Lost, the mark's event is not recorded (its condition on the Machine says why it is marked);
	// the next round finds the Machine unhealthy and creates the request (applyMarksAndRequests).
	newMarks newMarks
	// machineEvents is the namespaces' event budgets. Lost, they start full: at most
	// machineEventsPerSecond more events per reason and namespace (machineEventBudget.allow).
	machineEvents machineEventBudget
	// selectors is each health check's parsed selector. Lost, it is parsed again on its next use
	// (selectors.of).
	selectors selectors
}
