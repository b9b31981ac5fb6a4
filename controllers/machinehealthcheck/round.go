package machinehealthcheck

import (
	"sort"
	"time"
)

// round is what one reconcile evaluated, with the counts the limits and the status need. In a full
// pass targets are every target; in an incremental round (evalcache.go) they are only
// those evaluated, and the counts and names are over every target all the same.
type round struct {
	targets []target
	evals   []evaluation
	// total is how many targets the health check has, healthy how many of them are healthy.
	total, healthy int
	// cpTargets and cpNotHealthy count the control-plane targets, and those not healthy;
	// cpStarting those not healthy only because they have no Node yet.
	cpTargets, cpNotHealthy, cpStarting int
	// names are every target's name and unhealthy those of the unhealthy targets, sorted.
	names, unhealthy []string
	// next > 0 is when the first running timeout of the targets evaluated expires.
	next time.Duration
}

// evaluateAll evaluates every target at time now.
func evaluateAll(targets []target, cfg checkConfig, facts clusterFacts, now time.Time) *round {
	rd := evaluateSome(targets, cfg, facts, now)
	var n counts
	for i, t := range targets {
		n.add(countedOf(t, rd.evals[i]), 1)
		if rd.evals[i].verdict == verdictUnhealthy {
			rd.unhealthy = append(rd.unhealthy, t.machine.Name)
		}
	}
	rd.total, rd.healthy, rd.cpTargets, rd.cpNotHealthy, rd.cpStarting = len(targets), n.healthy, n.cpTargets, n.cpNotHealthy, n.cpStarting
	rd.names = targetNames(targets)
	sort.Strings(rd.unhealthy)
	return rd
}

// evaluateSome evaluates the given targets at time now, without the counts.
func evaluateSome(targets []target, cfg checkConfig, facts clusterFacts, now time.Time) *round {
	rd := &round{targets: targets, evals: make([]evaluation, len(targets))}
	for i, t := range targets {
		ev := evaluate(t, cfg, facts, now)
		rd.evals[i] = ev
		if ev.nextCheck > 0 && (rd.next == 0 || ev.nextCheck < rd.next) {
			rd.next = ev.nextCheck
		}
	}
	return rd
}

// requeueMargin is how long after a timeout expires the round runs again: the work queue never fires
// early, so the round starting then sees the timeout expired (timedOut compares strictly).
const requeueMargin = 20 * time.Millisecond

// requeueAfter is when the round must run again without any event: just after the next timeout
// expiry (nextCheck less timedOut's slack, plus requeueMargin), and at least every
// etcdPollInterval when the etcd member check is on (etcd is not watched).
func (rd *round) requeueAfter(cfg checkConfig) time.Duration {
	next := rd.next
	if next > 0 {
		next = max(next-expirySlack, 0) + requeueMargin
	}
	if cfg.etcdMemberTimeout > 0 && rd.cpTargets > 0 && (next == 0 || next > etcdPollInterval) {
		next = etcdPollInterval
	}
	return next
}

func targetNames(targets []target) []string {
	names := make([]string, 0, len(targets))
	for _, t := range targets {
		names = append(names, t.machine.Name)
	}
	sort.Strings(names)
	return names
}
